"""B1 (P1, a race whose window is another call's wait): in a group without an instance (or
whose instance is gone) the group-wide protect check is made ONCE, before the first member
is touched, and never again. ``deletion.py: _Run.members_step`` re-reads every member (a
protect tag on any of them protects the whole group), then ``_Run.dependents_step`` deletes
the members one by one; each ``_delete_dependent`` re-reads only ITS member (``not_ours``),
and the snapshot step's ``_read_again`` too. Between the group check and a member's call
come other calls' waits: a GCP ``disks.createSnapshot`` operation (minutes for a large disk,
``snapshot_before_delete``) or a sibling's ``disks.delete`` operation. An operator who
protects the group (by labelling any member, as rule 3 provides) during that wait does not
stop the next members' deletes: only the labelled member itself is kept.

For a group with an instance, the same rule is kept by ``_Run._judged_again`` (every member
read once more right before the owner's call); leftovers get no such final group read.

Rule 3: "A protect tag on any member protects the whole group ... in a group without an
instance (or whose instance is gone) no member is touched, none of them freed from
another"; step 6 of the docstring: each dependent is re-read "right before its own call
(never across another call's wait)" - but only for its own tags."""

from __future__ import annotations

from orphan_cleanup.core.listing import ResourceKind
from tests.attack.helpers import PROTECT, REF, ZONE, RecordingJournal, gcp_provider, groups_of
from tests.support.gcp_fake import FakeCompute


def _names_by_id(gcp: FakeCompute, names: list[str]) -> dict[str, str]:
    return {str(gcp.get("disks", ZONE, n)["id"]): n for n in names}  # type: ignore[index]


def test_a_member_protected_during_a_siblings_snapshot_protects_the_group(gcp: FakeCompute) -> None:
    for n in ("data-1", "data-2"):
        gcp.add_disk(n, zone=ZONE, labels={"provider_ref": REF})
    provider = gcp_provider(gcp, snapshot_before_delete=True)
    [group] = groups_of(provider)
    names = _names_by_id(gcp, ["data-1", "data-2"])
    first, second = (names[r.id] for r in group.resources if r.kind is ResourceKind.DISK)
    # while the first disk's snapshot is being taken, the operator protects the group by
    # labelling the other disk
    gcp.on_operation(f"/disks/{first}/createSnapshot",
                     lambda: gcp.set_labels("disks", ZONE, second, {"provider_ref": REF, PROTECT: "keep"}))

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    deleted = [names.get(t, t) for c, t in journal.calls() if c == "compute.disks.delete"]
    assert deleted == [], (
        f"the group was protected (a {PROTECT} label on {second}) during {first}'s snapshot, yet {deleted} was"
        f" deleted; status {result.status}, skipped {[(names.get(s.id), s.reason) for s in result.skipped]}")


def test_a_member_protected_during_a_siblings_delete_protects_the_rest(gcp: FakeCompute) -> None:
    for n in ("data-1", "data-2", "data-3"):
        gcp.add_disk(n, zone=ZONE, labels={"provider_ref": REF})
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    names = _names_by_id(gcp, ["data-1", "data-2", "data-3"])
    order = [names[r.id] for r in group.resources if r.kind is ResourceKind.DISK]
    # while the first disk's delete operation runs, the operator labels the LAST member
    gcp.on_operation(f"/disks/{order[0]}", lambda: gcp.set_labels(
        "disks", ZONE, order[2], {"provider_ref": REF, PROTECT: "keep"}), method="DELETE")

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    deleted = [names.get(t, t) for c, t in journal.calls() if c == "compute.disks.delete"]
    assert order[1] not in deleted, (
        f"{order[2]} was labelled {PROTECT} (the group protected) while {order[0]} was being deleted; {order[1]}"
        f" was deleted after that: deletes {deleted}, status {result.status}")
