"""F2 (P1): with ``snapshot_before_delete``, a volume or disk is checked (ref, protect tag) by
its re-read, then snapshotted (GCP: an operation the deleter waits for, minutes for a large
disk), then deleted, with no re-read of its tags after that wait. A protect tag an operator
adds while the snapshot is being taken does not stop the delete.

Rule 3: "Right before acting, every resource is read again ... and must still carry the same
ref and no protect tag ... never across another call's wait". The GCP ``delete`` even reads
the disk right before the call (``calls.get`` by name) and looks only at its id."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import (
    EAST,
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


def test_gcp_protect_label_added_during_the_snapshot_keeps_the_disk(gcp: FakeCompute) -> None:
    disk = gcp.add_disk("lost-data", zone=ZONE, labels={"provider_ref": REF})
    provider = gcp_provider(gcp, snapshot_before_delete=True)
    [group] = groups_of(provider)

    # while disks.createSnapshot is in flight, an operator protects the disk
    gcp.on_operation("/disks/lost-data/createSnapshot",
                     lambda: gcp.set_labels("disks", ZONE, "lost-data", {"provider_ref": REF, PROTECT: "keep"}))
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    deleted = [t for c, t in journal.calls() if c == "compute.disks.delete"]
    assert deleted == [], f"a disk carrying {PROTECT} was deleted: {deleted} ({result.status})"
    assert gcp.get("disks", ZONE, "lost-data") is not None
    assert disk["id"] not in result.deleted


@pytest.mark.usefixtures("moto_reset")
def test_aws_protect_tag_added_during_the_snapshot_keeps_the_volume(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1,
                               TagSpecifications=spec("volume", {"provider_ref": REF}))["VolumeId"]
    session = boto3.Session()

    def protect(**_: Any) -> None:  # the operator's tag lands while the snapshot is being taken
        client.create_tags(Resources=[vol], Tags=[{"Key": PROTECT, "Value": "keep"}])

    session.events.register("after-call.ec2.CreateSnapshot", protect)
    provider = aws_provider(moto_reset, session, snapshot_before_delete=True)
    [group] = groups_of(provider)

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    deleted = [t for c, t in journal.calls() if c == "ec2:DeleteVolume"]
    assert deleted == [], f"a volume carrying {PROTECT} was deleted: {deleted} ({result.status})"
    assert client.describe_volumes(Filters=[{"Name": "volume-id", "Values": [vol]}])["Volumes"]
    assert result.status is not DeleteStatus.DELETED
