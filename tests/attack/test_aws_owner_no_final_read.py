"""F3 on AWS (P1, race): the instance is read once at the start of the deletion; every later
decision (protect tag, DeleteOnTermination blast) is judged on that read, across the
attribute read, every member's describe and the blast's describes, and ``TerminateInstances``
follows with no re-read. A volume that is not the group's (another ref's, protected),
attached with ``DeleteOnTermination`` during that window, is deleted with the instance and the
journal's intent does not name it (rules 3, 15, 19). The window is several round trips wide;
a last ``DescribeInstances`` of the owner right before the call, compared with what was
judged, would narrow it to one."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from tests.attack.helpers import EAST, OTHER, PROTECT, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_volume_attached_with_delete_on_termination_after_the_read_is_not_taken(moto_reset: str) -> None:
    client = ec2(moto_reset)
    inst = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                                Placement={"AvailabilityZone": f"{EAST}a"},
                                TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]
    iid = inst["InstanceId"]
    data = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1,
                                TagSpecifications=spec("volume", {"provider_ref": REF}))["VolumeId"]
    client.attach_volume(VolumeId=data, InstanceId=iid, Device="/dev/sdf")
    foreign_tags = spec("volume", {"provider_ref": OTHER, PROTECT: "yes"})
    foreign = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1, TagSpecifications=foreign_tags)["VolumeId"]
    session = boto3.Session()
    done = []

    def attach_foreign(**_: Any) -> None:  # between the instance's read and TerminateInstances
        if not done:
            done.append(1)
            client.attach_volume(VolumeId=foreign, InstanceId=iid, Device="/dev/sdg")
            client.modify_instance_attribute(InstanceId=iid, BlockDeviceMappings=[
                {"DeviceName": "/dev/sdg", "Ebs": {"DeleteOnTermination": True}}])

    session.events.register("after-call.ec2.DescribeInstanceAttribute", attach_foreign)
    provider = aws_provider(moto_reset, session)
    [group] = [g for g in groups_of(provider) if g.primary_id == iid]

    journal = RecordingJournal()
    provider.delete_resource_group(group, journal)

    assert done == [1]
    blast = [i["blast"] for i in journal.intents if i["call"] == "ec2:TerminateInstances"]
    left = client.describe_volumes(Filters=[{"Name": "volume-id", "Values": [foreign]}])["Volumes"]
    assert left, f"protected volume {foreign} of {OTHER} was deleted with {iid}; journaled blast {blast}"
