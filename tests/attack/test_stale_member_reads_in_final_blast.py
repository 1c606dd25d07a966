"""A2 (P1): the owner's delete takes along a member judged on a read made before the final
judgement. ``deletion.py: _Run._judged_again`` re-reads the OWNER right before its delete
call and "judges again on this read" what its delete would take along, but it passes the
``members`` read earlier by ``_members_before_delete`` to ``ops.blast``; both clouds'
``blast`` (``aws/operations.py: AwsOperations.blast``, ``gcp/operations.py:
GcpOperations.blast``) reuse a member's stale ``Live`` instead of reading it again. So:

- AWS: a protect tag put on a member ``DeleteOnTermination`` volume after the members were
  read (while the deletion makes its other reads, or, for a spot instance, while it cancels
  and confirms the persistent request: another call's wait) is not seen: TerminateInstances
  deletes the protected volume;
- GCP: ``_judged`` (the ``get`` right before ``instances.delete``) compares attached disks by
  their LINK, not their id, and ``blast`` matches a link to the stale member read: a member
  disk detached, deleted and replaced by another ref's protected disk of the same name,
  attached ``autoDelete``, goes with the VM (and the journal's intent names the old id).

Rule 15: "Each must be a member of the group that still carries its ref and no protect tag
(re-read by id)"; rule 3: a protect tag on any member protects the group; rule 19: the
intent names what the provider deletes along with it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.attack.helpers import (
    EAST,
    OTHER,
    PROTECT,
    REF,
    ZONE,
    RecordingJournal,
    aws_provider,
    ec2,
    gcp_provider,
    groups_of,
    spec,
)
from tests.support.gcp_fake import FakeCompute


def _on_nth_call(client: Any, operation: str, n: int, action: Any) -> list[int]:
    """Run ``action()`` right before the ``n``-th ``operation`` call of ``client`` (a botocore hook)."""
    seen = [0]

    def hook(**_: Any) -> None:
        seen[0] += 1
        if seen[0] == n:
            action()

    client.meta.events.register(f"before-call.ec2.{operation}", hook)
    return seen


@pytest.mark.usefixtures("moto_reset")
def test_aws_protect_tag_on_a_member_volume_before_the_final_read_stops_terminate(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
        Placement={"AvailabilityZone": f"{EAST}a"},
        BlockDeviceMappings=[{"DeviceName": "/dev/sdf", "Ebs": {"VolumeSize": 1, "DeleteOnTermination": True}}],
        TagSpecifications=spec("instance", {"provider_ref": REF}) + spec("volume", {"provider_ref": REF}),
    )["Instances"][0]["InstanceId"]
    inst = client.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    data = next(b["Ebs"]["VolumeId"] for b in inst["BlockDeviceMappings"] if b["DeviceName"] == "/dev/sdf")
    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert data in group.resource_ids()

    # the operator protects the data volume after the deleter read the members, before its final read
    seen = _on_nth_call(provider.ec2(EAST), "DescribeInstances", 2, lambda: client.create_tags(
        Resources=[data], Tags=[{"Key": PROTECT, "Value": "keep-the-data"}]))
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    assert seen[0] >= 2
    terminate = [i for i in journal.intents if i["call"] == "ec2:TerminateInstances"]
    assert terminate == [], (
        f"TerminateInstances called with blast {terminate[0]['blast']} although {data} carries {PROTECT}"
        f" (status {result.status})")


def test_gcp_member_disk_replaced_under_its_name_before_the_final_read_is_not_deleted(
        gcp: FakeCompute, monkeypatch: Any) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("vm-boot", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", boot=True, auto_delete=True)
    gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", auto_delete=True)
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    foreign: dict[str, Any] = {}

    def replace_member_disk() -> None:
        gcp.detach_disk("vm", "vm-data", zone=ZONE)
        gcp.remove("disks", ZONE, "vm-data")
        foreign.update(gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": OTHER, PROTECT: "yes"}))
        gcp.attach_disk("vm", "vm-data", zone=ZONE, auto_delete=True, device_name="vm-data")

    # fires on the deleter's SECOND read of the VM by id (``_judged_again``), after the members were read
    fired = [0]
    original = gcp.dispatch
    lists = [0]

    def dispatch(m: str, path: str, query: dict[str, str], body: bytes = b"") -> Any:
        if m == "GET" and path.endswith(f"/zones/{ZONE}/instances") and "id =" in str(query):
            lists[0] += 1
            if lists[0] == 2 and not fired[0]:
                fired[0] += 1
                replace_member_disk()
        return original(m, path, query, body)

    monkeypatch.setattr(gcp, "dispatch", dispatch)
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    assert fired == [1]
    blast = [i["blast"] for i in journal.intents if i["call"] == "compute.instances.delete"]
    assert gcp.get("disks", ZONE, "vm-data") is not None, (
        f"disk {foreign['id']} of {OTHER}, protected, went with the VM; the journaled blast was {blast}"
        f" (status {result.status})")
