"""F4 (P1 under an eventual-consistency answer): the blast of the owner's delete (rule 15) is
read from what the instance names: its ``DeleteOnTermination`` volumes (AWS), its
``autoDelete`` disks (GCP). A volume or disk the instance names as attached that answers
NotFound to its own read is taken for "gone already" and dropped from the blast: it is
neither judged (protect tag, ref) nor journaled, and the provider then deletes it along with
the instance. An instance that names a device cannot have lost it: the answer contradicts the
instance's read and must block the call (``blast_unreadable``), as ``UNREAD`` does.

EC2 documents such NotFound answers for resources created moments ago (eventual
consistency); ``deletion.Unread``'s docstring already says "what cannot be read may carry a
protect tag, so it is never taken for gone"."""

from __future__ import annotations

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
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.gcp_fake import FakeCompute

NOT_FOUND = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InvalidVolume.NotFound</Code>"
             "<Message>The volume '{v}' does not exist.</Message></Error></Errors><RequestID>x</RequestID></Response>")


@pytest.mark.usefixtures("moto_reset")
def test_aws_doomed_volume_reading_not_found_blocks_the_terminate(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
        Placement={"AvailabilityZone": f"{EAST}a"},
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8, "DeleteOnTermination": False}}],
        TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]["InstanceId"]
    foreign_tags = spec("volume", {"provider_ref": OTHER, PROTECT: "yes"})
    foreign = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1, TagSpecifications=foreign_tags)["VolumeId"]
    client.attach_volume(VolumeId=foreign, InstanceId=iid, Device="/dev/sdg")
    client.modify_instance_attribute(InstanceId=iid, BlockDeviceMappings=[
        {"DeviceName": "/dev/sdg", "Ebs": {"DeleteOnTermination": True}}])

    with AwsProxy(moto_reset) as proxy:
        provider = aws_provider(proxy.url)
        [group] = [g for g in groups_of(provider) if g.primary_id == iid]
        # an eventual-consistency answer for that one volume's read by id
        proxy.add_rule(Rule("DescribeVolumes", match=lambda body: foreign.encode() in body,
                            reply=(400, [("Content-Type", "text/xml")], NOT_FOUND.format(v=foreign).encode())))
        journal = RecordingJournal()
        provider.delete_resource_group(group, journal)

    blast = [i["blast"] for i in journal.intents if i["call"] == "ec2:TerminateInstances"]
    left = client.describe_volumes(Filters=[{"Name": "volume-id", "Values": [foreign]}])["Volumes"]
    assert left, f"protected volume {foreign} of {OTHER} went with {iid} unjudged; journaled blast {blast}"


def test_gcp_auto_delete_disk_reading_not_found_blocks_the_delete(gcp: FakeCompute) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("team-b-data", zone=ZONE, labels={"provider_ref": OTHER, PROTECT: "yes"}, attached_to="vm",
                 auto_delete=True)
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    gcp.add_fault("GET", f"/zones/{ZONE}/disks/team-b-data", status=404, times=1)

    journal = RecordingJournal()
    provider.delete_resource_group(group, journal)

    blast = [i["blast"] for i in journal.intents if i["call"] == "compute.instances.delete"]
    assert gcp.get("disks", ZONE, "team-b-data") is not None, f"protected disk went with the VM; blast {blast}"


@pytest.mark.usefixtures("moto_reset")
def test_aws_protected_member_reading_not_found_still_protects_the_group(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               Placement={"AvailabilityZone": f"{EAST}a"},
                               TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]["InstanceId"]
    data = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1,
                                TagSpecifications=spec("volume", {"provider_ref": REF}))["VolumeId"]
    client.attach_volume(VolumeId=data, InstanceId=iid, Device="/dev/sdf")
    with AwsProxy(moto_reset) as proxy:
        provider = aws_provider(proxy.url)
        [group] = [g for g in groups_of(provider) if g.primary_id == iid]
        assert data in group.resource_ids()
        # after the listing, the data volume is protected (rule 12: that protects the whole group) ...
        client.create_tags(Resources=[data], Tags=[{"Key": PROTECT, "Value": "keep"}])
        # ... and its re-read before the owner's delete meets one eventual-consistency NotFound
        proxy.add_rule(Rule("DescribeVolumes", match=lambda body: data.encode() in body, times=1,
                            reply=(400, [("Content-Type", "text/xml")], NOT_FOUND.format(v=data).encode())))
        journal = RecordingJournal()
        provider.delete_resource_group(group, journal)

    state = client.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert ("ec2:TerminateInstances", iid) not in journal.calls(), f"terminated a protected group's VM ({state})"
