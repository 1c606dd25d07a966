"""B3 (P3 misleading record): a forged listing batch (rule 21) that names a live resource's id
under another place (GCP: another zone of the backend's region) or another kind (AWS: a
volume id as a security group) makes the deleter record it DELETED although nothing was
called and the resource is untouched. ``providers/deletion.py: _Run._delete_dependent`` (and
``_unverified``, ``members_step`` through ``_members_before_delete``) takes a read of
``None`` as "gone" and appends the id to ``deleted``: ``gcp/operations.py:
GcpOperations.read`` answers ``None`` when the ``list`` of the FORGED zone filtered on the id
is empty, ``aws/operations.py: AwsOperations._read_one`` answers ``None`` for the forged
kind's ``*.Malformed``/``*.NotFound``. The group's result is ``deleted`` with no journal row;
``cycle/deleter.py: Deleter._delete`` records it (``orphans.state = 'deleted'``, event
``orphan_deleted``: "deleted orphan group ...").

The same read lets a forged place hide a protected member from ``members_step``'s group
check (it reads as gone, not as protected), but a forger could as well leave the member
out; the lasting harm is the record. Rule 21: a forged field "can at worst make the deleter
look for an id where it is not, and find nothing to delete" - here it finds nothing and
records a deletion; rule 19: what the record says was deleted has no journaled call."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import EAST, REF, ZONE, RecordingJournal, aws_provider, ec2, gcp_provider, spec
from tests.support.gcp_fake import FakeCompute

OTHER_ZONE = "us-central1-b"


def forged(region: str, *members: tuple[ResourceKind, str, str]) -> ResourceGroup:
    res = [Resource(kind=k, id=i, region=r, tags={"provider_ref": REF}) for k, i, r in members]
    return ResourceGroup(provider_ref=REF, region=region, primary_id=None, resources=tuple(res))


OPEN = pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "open P3 (SAFETY.md rule 21; a record only): a member read as gone where a forged batch placed it is"
    " recorded deleted though nothing was called; nothing is deleted"))


@OPEN
def test_gcp_disk_named_in_another_zone_is_not_recorded_deleted(gcp: FakeCompute) -> None:
    disk = gcp.add_disk("data", zone=ZONE, labels={"provider_ref": REF})
    journal = RecordingJournal()
    result = gcp_provider(gcp).delete_resource_group(
        forged(OTHER_ZONE, (ResourceKind.DISK, disk["id"], OTHER_ZONE)), journal)

    assert gcp.get("disks", ZONE, "data") is not None and journal.intents == []
    assert disk["id"] not in result.deleted and result.status is not DeleteStatus.DELETED, (
        f"disk {disk['id']} (alive in {ZONE}, never called) recorded: status {result.status},"
        f" deleted {result.deleted}")


@OPEN
@pytest.mark.usefixtures("moto_reset")
def test_aws_volume_named_as_another_kind_is_not_recorded_deleted(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1,
                               TagSpecifications=spec("volume", {"provider_ref": REF}))["VolumeId"]
    journal = RecordingJournal()
    result = aws_provider(moto_reset).delete_resource_group(
        forged(EAST, (ResourceKind.SECURITY_GROUP, vol, EAST)), journal)

    assert client.describe_volumes(VolumeIds=[vol])["Volumes"] and journal.intents == []
    assert vol not in result.deleted and result.status is not DeleteStatus.DELETED, (
        f"volume {vol} (alive, never called) recorded: status {result.status}, deleted {result.deleted}")


