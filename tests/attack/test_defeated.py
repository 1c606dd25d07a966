"""Attacks the deleter defeats (kept as passing tests: evidence for the report)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import (
    EAST,
    OTHER,
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
    """A group as a forged listing batch could record it: ids only, every other field empty."""
    res = [Resource(kind=k, id=i, region=r, tags={"provider_ref": ref}) for k, i, r in members]
    return ResourceGroup(provider_ref=ref, region=region, primary_id=primary, resources=tuple(res))


def test_forged_primary_of_another_ref_is_left_alone(gcp: FakeCompute) -> None:
    vm = gcp.add_instance("tracked", zone=ZONE, labels={"provider_ref": OTHER})
    journal = RecordingJournal()
    result = gcp_provider(gcp).delete_resource_group(
        forged(REF, ZONE, vm["id"], (ResourceKind.INSTANCE, vm["id"], ZONE)), journal)
    assert journal.intents == [] and result.status is DeleteStatus.SKIPPED
    assert result.skipped[0].reason == "ref_changed"


def test_forged_leftovers_naming_a_live_vms_disk_and_address_are_in_use(gcp: FakeCompute) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    disk = gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm")
    addr = gcp.add_address("vm-ip", region=REGION, labels={"provider_ref": REF}, attached_to="vm")
    p = gcp_provider(gcp)
    journal = RecordingJournal()
    r1 = p.delete_resource_group(forged(REF, ZONE, None, (ResourceKind.DISK, disk["id"], ZONE)), journal)
    r2 = p.delete_resource_group(forged(REF, REGION, None, (ResourceKind.ADDRESS, addr["id"], REGION)), journal)
    assert journal.intents == []
    assert [s.reason for s in (*r1.skipped, *r2.skipped)] == ["in_use", "in_use"]


def test_a_boot_disk_swapped_in_later_blocks_the_delete(gcp: FakeCompute) -> None:
    old = datetime.now(UTC) - timedelta(days=2)
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF}, status="TERMINATED", created=old)
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", boot=True, auto_delete=True, created=old)
    gcp.add_disk("someones-disk", zone=ZONE)  # untagged, created now
    gcp.swap_boot_disk("vm", "someones-disk", zone=ZONE, auto_delete=True)
    p = gcp_provider(gcp)
    [group] = groups_of(p)
    journal = RecordingJournal()
    result = p.delete_resource_group(group, journal)
    assert journal.intents == [] and "blast_foreign" in {s.reason for s in result.skipped}


def test_managed_vm_and_name_reuse_are_defeated(gcp: FakeCompute) -> None:
    gcp.add_instance("mig-vm", zone=ZONE, labels={"provider_ref": REF}, created_by="mig")
    p = gcp_provider(gcp)
    [group] = groups_of(p)
    assert p.delete_resource_group(group).status is DeleteStatus.PROTECTED


@pytest.mark.usefixtures("moto_reset")
def test_forged_leftover_naming_a_volume_of_a_live_foreign_instance_is_in_use(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               Placement={"AvailabilityZone": f"{EAST}a"})["Instances"][0]["InstanceId"]
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1,
                               TagSpecifications=spec("volume", {"provider_ref": REF}))["VolumeId"]
    client.attach_volume(VolumeId=vol, InstanceId=iid, Device="/dev/sdf")
    journal = RecordingJournal()
    result = aws_provider(moto_reset).delete_resource_group(
        forged(REF, EAST, None, (ResourceKind.VOLUME, vol, EAST)), journal)
    assert journal.intents == [] and [s.reason for s in result.skipped] == ["in_use"]


@pytest.mark.usefixtures("moto_reset")
def test_snapshots_not_taken_by_us_or_young_or_used_by_an_image_are_kept(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1)["VolumeId"]
    backup = client.create_snapshot(VolumeId=vol, TagSpecifications=spec("snapshot", {"provider_ref": REF}))
    young = client.create_snapshot(VolumeId=vol, TagSpecifications=spec(
        "snapshot", {"provider_ref": REF, "orphan-cleanup-source": vol}))
    p = aws_provider(moto_reset, retain_snapshots_days=1)
    journal = RecordingJournal()
    result = p.delete_resource_group(forged(REF, EAST, None, (ResourceKind.SNAPSHOT, backup["SnapshotId"], EAST),
                                            (ResourceKind.SNAPSHOT, young["SnapshotId"], EAST)), journal)
    assert journal.intents == []
    assert sorted(s.reason for s in result.skipped) == ["not_our_snapshot", "snapshot_retained"]
