"""Attacks of this round that the deleter defeats (passing tests: evidence for the report)."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import (
    EAST,
    OTHER,
    PROTECT,
    REF,
    REGION,
    ZONE,
    RecordingJournal,
    aws_provider,
    ec2,
    gcp_provider,
    groups_of,
    spec,
)
from tests.support.gcp_fake import FakeCompute


def forged(ref: str, region: str, primary: str | None, *members: tuple[ResourceKind, str, str]) -> ResourceGroup:
    res = [Resource(kind=k, id=i, region=r, tags={"provider_ref": ref}) for k, i, r in members]
    return ResourceGroup(provider_ref=ref, region=region, primary_id=primary, resources=tuple(res))


def test_gcp_ids_with_case_or_whitespace_are_never_read_or_deleted(gcp: FakeCompute) -> None:
    vm = gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    disk = gcp.add_disk("d", zone=ZONE, labels={"provider_ref": REF})
    p = gcp_provider(gcp)
    journal = RecordingJournal()
    for bad in (f" {disk['id']}", f"{disk['id']}\n", f"0{disk['id']}"):
        r = p.delete_resource_group(forged(REF, ZONE, None, (ResourceKind.DISK, bad, ZONE)), journal)
        assert [x.reason for x in r.skipped] == ["unreadable"], (bad, r)
    r = p.delete_resource_group(forged(REF, ZONE, f"{vm['id']} ", (ResourceKind.INSTANCE, f"{vm['id']} ", ZONE)),
                                journal)
    assert journal.intents == [] and r.status is DeleteStatus.SKIPPED
    assert gcp.get("disks", ZONE, "d") is not None and gcp.get("instances", ZONE, "vm") is not None


def test_gcp_leftover_disk_of_a_foreign_vm_being_stopped_is_not_deleted(gcp: FakeCompute) -> None:
    gcp.add_instance("team-vm", zone=ZONE, labels={"team": "b"}, status="STOPPING")
    disk = gcp.add_disk("d", zone=ZONE, labels={"provider_ref": REF}, attached_to="team-vm")
    journal = RecordingJournal()
    r = gcp_provider(gcp).delete_resource_group(forged(REF, ZONE, None, (ResourceKind.DISK, disk["id"], ZONE)),
                                                journal)
    assert journal.intents == [] and r.status is not DeleteStatus.DELETED


def test_gcp_address_used_by_a_forwarding_rule_is_in_use(gcp: FakeCompute) -> None:
    addr = gcp.add_address("lb-ip", region=REGION, labels={"provider_ref": REF})
    gcp.set_field("addresses", REGION, "lb-ip", "status", "IN_USE")
    gcp.set_field("addresses", REGION, "lb-ip", "users", [
        f"https://www.googleapis.com/compute/v1/projects/{gcp.project}/regions/{REGION}/forwardingRules/fr"])
    journal = RecordingJournal()
    r = gcp_provider(gcp).delete_resource_group(forged(REF, REGION, None, (ResourceKind.ADDRESS, addr["id"], REGION)),
                                                journal)
    assert journal.intents == [] and [s.reason for s in r.skipped] == ["in_use"]


def test_gcp_protected_or_other_refs_boot_disk_blocks_the_vm(gcp: FakeCompute) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("vm-boot", zone=ZONE, labels={PROTECT: "keep"}, attached_to="vm", boot=True, auto_delete=True)
    gcp.add_instance("vm2", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("vm2-boot", zone=ZONE, labels={"provider_ref": OTHER}, attached_to="vm2", boot=True,
                 auto_delete=True)
    p = gcp_provider(gcp)
    journal = RecordingJournal()
    reasons = set()
    for g in groups_of(p):
        reasons |= {s.reason for s in p.delete_resource_group(g, journal).skipped}
    assert journal.intents == [] and {"blast_protected", "blast_foreign"} <= reasons


@pytest.mark.usefixtures("moto_reset")
def test_aws_mangled_instance_ids_are_unread_never_gone(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]["InstanceId"]
    p = aws_provider(moto_reset)
    journal = RecordingJournal()
    for bad in (iid.upper(), f" {iid}", f"{iid} "):
        r = p.delete_resource_group(forged(REF, EAST, bad, (ResourceKind.INSTANCE, bad, EAST)), journal)
        assert r.status is DeleteStatus.SKIPPED and r.skipped[0].reason == "unreadable", (bad, r)
    assert journal.intents == []


@pytest.mark.usefixtures("moto_reset")
def test_aws_leftover_interface_attached_to_a_live_foreign_instance_is_in_use(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{EAST}a")["Subnet"]["SubnetId"]
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               SubnetId=subnet)["Instances"][0]["InstanceId"]
    eni = client.create_network_interface(SubnetId=subnet, TagSpecifications=spec(
        "network-interface", {"provider_ref": REF}))["NetworkInterface"]["NetworkInterfaceId"]
    client.attach_network_interface(NetworkInterfaceId=eni, InstanceId=iid, DeviceIndex=1)
    journal = RecordingJournal()
    r = aws_provider(moto_reset).delete_resource_group(
        forged(REF, EAST, None, (ResourceKind.NETWORK_INTERFACE, eni, EAST)), journal)
    assert journal.intents == [] and [s.reason for s in r.skipped] == ["in_use"]


@pytest.mark.usefixtures("moto_reset")
def test_aws_foreign_protected_volume_attached_with_delete_on_termination_blocks_terminate(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               Placement={"AvailabilityZone": f"{EAST}a"},
                               TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]["InstanceId"]
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1,
                               TagSpecifications=spec("volume", {"provider_ref": OTHER}))["VolumeId"]
    client.attach_volume(VolumeId=vol, InstanceId=iid, Device="/dev/sdg")
    client.modify_instance_attribute(InstanceId=iid, BlockDeviceMappings=[
        {"DeviceName": "/dev/sdg", "Ebs": {"DeleteOnTermination": True}}])
    p = aws_provider(moto_reset)
    [group] = groups_of(p)
    journal = RecordingJournal()
    r = p.delete_resource_group(group, journal)
    assert ("ec2:TerminateInstances", iid) not in journal.calls()
    assert "blast_foreign" in {s.reason for s in r.skipped}
