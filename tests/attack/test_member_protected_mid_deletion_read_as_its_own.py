"""G1 (P1, breaks the round-3 fix of B1): a member that becomes protected during another
call's wait protects the whole group only when it is NOT the very next member to be
handled. ``deletion.py: _Run._delete_dependent`` re-reads the next member first; its own
``not_ours`` finds the protect tag and only THAT member is ``skipped`` ("protected") and
the loop goes on. ``_Run._siblings_still_the_groups`` then re-reads only the members still
to go: ``done`` includes every id already in ``skipped``, so the protected member is never
looked at again, the flag ``acted_since_read`` is reset, and every later member is deleted.
Whether the group is left or deleted therefore depends on which member the operator
happened to label.

Rule 3: "A protect tag on any member protects the whole group ... in a group without an
instance (or whose instance is gone) no member is touched, none of them freed from
another"; ``_GroupLeft``'s docstring: "A member became protected ... during the deletion:
the rest is left"."""

from __future__ import annotations

from typing import Any

import pytest

from orphan_cleanup.core.listing import ResourceKind
from tests.attack.helpers import PROTECT, REF, ZONE, RecordingJournal, aws_provider, ec2, gcp_provider, groups_of, spec
from tests.support.gcp_fake import FakeCompute


def test_gcp_next_member_protected_during_a_siblings_delete_protects_the_rest(gcp: FakeCompute) -> None:
    for n in ("data-1", "data-2", "data-3"):
        gcp.add_disk(n, zone=ZONE, labels={"provider_ref": REF})
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    names = {str(gcp.get("disks", ZONE, n)["id"]): n for n in ("data-1", "data-2", "data-3")}  # type: ignore[index]
    order = [names[r.id] for r in group.resources if r.kind is ResourceKind.DISK]
    # while the first disk's delete operation runs, the operator labels the NEXT member
    gcp.on_operation(f"/disks/{order[0]}", lambda: gcp.set_labels(
        "disks", ZONE, order[1], {"provider_ref": REF, PROTECT: "keep"}), method="DELETE")

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    deleted = [names.get(t, t) for c, t in journal.calls() if c == "compute.disks.delete"]
    assert order[2] not in deleted, (
        f"{order[1]} was labelled {PROTECT} (the group protected) while {order[0]} was being deleted; {order[2]}"
        f" was deleted after that: deletes {deleted}, status {result.status},"
        f" skipped {[(names.get(s.id), s.reason) for s in result.skipped]}")


@pytest.mark.usefixtures("moto_reset")
def test_aws_next_volume_protected_during_a_siblings_delete_protects_the_address(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vols = [client.create_volume(AvailabilityZone="us-east-1a", Size=1,
                                 TagSpecifications=spec("volume", {"provider_ref": REF}))["VolumeId"] for _ in range(2)]
    alloc = client.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip", {"provider_ref": REF}))
    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id is None
    first, second = [r.id for r in group.resources if r.kind is ResourceKind.VOLUME]

    def hook(params: dict[str, Any], **_: Any) -> None:  # during the first volume's delete
        if params.get("VolumeId") == first:
            client.create_tags(Resources=[second], Tags=[{"Key": PROTECT, "Value": "keep"}])

    provider.ec2("us-east-1").meta.events.register("before-parameter-build.ec2.DeleteVolume", hook)
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    calls = journal.calls()
    assert ("ec2:ReleaseAddress", alloc["AllocationId"]) not in calls, (
        f"{second} was tagged {PROTECT} (the group protected) while {first} was being deleted; the group's"
        f" address was released after that: calls {calls}, status {result.status},"
        f" skipped {[(s.id, s.reason) for s in result.skipped]}")
    assert sorted(vols) == sorted([first, second])
