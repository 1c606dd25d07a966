"""Attacks of round 3 that the deleter defeats (passing tests: evidence for the report)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import EAST, REF, ZONE, RecordingJournal, aws_provider, ec2, gcp_provider, groups_of, spec
from tests.support.gcp_fake import FakeCompute


def forged(region: str, *members: tuple[ResourceKind, str, str]) -> ResourceGroup:
    res = [Resource(kind=k, id=i, region=r, tags={"provider_ref": REF}) for k, i, r in members]
    return ResourceGroup(provider_ref=REF, region=region, primary_id=None, resources=tuple(res))


def test_gcp_swapped_boot_disk_with_a_malformed_attach_time_is_foreign(gcp: FakeCompute) -> None:
    launched = datetime.now(UTC) - timedelta(days=3)
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF}, status="TERMINATED", created=launched)
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", boot=True, auto_delete=True, created=launched)
    gcp.add_disk("team-b", zone=ZONE, created=launched + timedelta(seconds=30))
    gcp.swap_boot_disk("vm", "team-b", zone=ZONE, auto_delete=True)
    gcp.set_field("disks", ZONE, "team-b", "lastAttachTimestamp", "yesterday")
    p = gcp_provider(gcp)
    [group] = groups_of(p)
    journal = RecordingJournal()
    r = p.delete_resource_group(group, journal)
    assert journal.intents == [] and "blast_foreign" in {s.reason for s in r.skipped}


def test_gcp_disk_named_as_an_address_of_the_zone_is_never_deleted(gcp: FakeCompute) -> None:
    disk = gcp.add_disk("d", zone=ZONE, labels={"provider_ref": REF})
    journal = RecordingJournal()
    with pytest.raises(ProviderError):  # regions/us-central1-a: 404, fail closed
        gcp_provider(gcp).delete_resource_group(forged(ZONE, (ResourceKind.ADDRESS, disk["id"], ZONE)), journal)
    assert journal.intents == [] and gcp.get("disks", ZONE, "d") is not None


@pytest.mark.usefixtures("moto_reset")
def test_aws_snapshot_of_another_volume_carrying_our_source_tag_is_kept(moto_reset: str) -> None:
    client = ec2(moto_reset)
    a = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1)["VolumeId"]
    b = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1)["VolumeId"]
    snap = client.create_snapshot(VolumeId=b, TagSpecifications=spec(
        "snapshot", {"provider_ref": REF, "orphan-cleanup-source": a}))["SnapshotId"]
    journal = RecordingJournal()
    r = aws_provider(moto_reset, retain_snapshots_days=1).delete_resource_group(
        forged(EAST, (ResourceKind.SNAPSHOT, snap, EAST)), journal)
    assert journal.intents == [] and [s.reason for s in r.skipped] == ["not_our_snapshot"]
    assert r.status is DeleteStatus.SKIPPED
