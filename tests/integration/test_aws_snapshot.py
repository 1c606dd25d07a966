"""Data volumes kept as snapshots (issue #15 item 4) on the moto server: with
``snapshot_before_delete`` an orphan's data volume is snapshotted (tagged with the ref and
the volume id) before it is deleted; with ``retain_snapshots_days`` our snapshots are
listed once that old and deleted as leftovers of their ref.

moto 5.2 takes ``CreateSnapshot`` with ``TagSpecifications`` and completes a snapshot at
once (the ``pending`` and ``error`` states are in ``tests/unit/test_aws_snapshot_delete.py``);
its ``StartTime`` is now, so the expiry test ages it in moto's reply with a botocore hook.
"""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import boto3
import pytest

from orphan_cleanup.cli import explain
from orphan_cleanup.core.delete_rules import delete_record
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_aws_provider import (
    EAST,
    REF_A,
    TAG,
    create_volume,
    delete_until_done,
    ec2,
    exists,
    group_map,
    make_provider,
    run_instance,
    set_tags,
)
from tests.support.ledger_helpers import add_backend, add_ref, db_now
from tests.support.listing import collect

pytestmark = pytest.mark.usefixtures("moto_reset")
SOURCE = "orphan-cleanup-source"


def snapshots_of(client: Any, volume_id: str) -> list[dict[str, Any]]:
    reply = client.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "volume-id", "Values": [volume_id]}])
    return reply["Snapshots"]


def tag_map(item: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def test_a_detached_data_volume_is_snapshotted_with_its_ref_then_deleted(session, calls):
    client = ec2(EAST)
    vol = create_volume(client, REF_A)
    provider = make_provider(session, snapshot_before_delete=True)
    [group] = collect(provider).groups
    calls.clear()

    result = provider.delete_resource_group(group)

    [snap] = snapshots_of(client, vol)
    assert tag_map(snap) == {TAG: REF_A, SOURCE: vol} and snap["State"] == "completed"
    ops = calls.ops()
    assert ops.index("CreateSnapshot") < ops.index("DeleteVolume")
    assert result.status is DeleteStatus.DELETED and result.deleted == (vol,)
    assert result.snapshots == ((vol, snap["SnapshotId"]),)
    assert not exists(client, "volume", vol)
    assert f"kept snapshot {snap['SnapshotId']} of {vol}" in delete_record(group, result=result).message


def test_a_data_volume_not_deleted_on_termination_is_snapshotted_once_its_instance_went(session, calls):
    client = ec2(EAST)
    inst = run_instance(client, REF_A)
    vol = create_volume(client, REF_A, attach_to=inst)  # moto attaches with DeleteOnTermination false
    provider = make_provider(session, snapshot_before_delete=True)
    [group] = [g for g in collect(provider).groups if g.primary_id == inst["InstanceId"]]
    assert vol in group.resource_ids()

    calls.clear()

    result = provider.delete_resource_group(group)

    # moto terminates at once and detaches the volume, so it goes in the same call (on AWS
    # the volume is still in use and waits for the next cycle); either way after the instance.
    ops = calls.ops()
    assert ops.index("TerminateInstances") < ops.index("CreateSnapshot") < ops.index("DeleteVolume")
    [snap] = snapshots_of(client, vol)
    assert tag_map(snap) == {TAG: REF_A, SOURCE: vol}
    assert result.status is DeleteStatus.DELETED and result.snapshots == ((vol, snap["SnapshotId"]),)
    assert not exists(client, "volume", vol)


def test_a_volume_deleted_with_its_instance_is_not_snapshotted(session, calls):
    client = ec2(EAST)
    inst = run_instance(client, REF_A)
    [root] = [b["Ebs"]["VolumeId"] for b in inst["BlockDeviceMappings"]]
    set_tags(client, root, **{TAG: REF_A})
    [mapping] = client.describe_instances(InstanceIds=[inst["InstanceId"]])["Reservations"][0]["Instances"][0][
        "BlockDeviceMappings"]
    assert mapping["Ebs"]["DeleteOnTermination"] is True
    provider = make_provider(session, snapshot_before_delete=True)
    [group] = collect(provider).groups
    assert group_map([group]) == {(REF_A, EAST, inst["InstanceId"]): {inst["InstanceId"], root}}
    all_ops: list[str] = []

    results = delete_until_done(provider, group, calls)
    all_ops += calls.ops()

    assert results[-1].status is DeleteStatus.DELETED and not exists(client, "volume", root)
    assert "CreateSnapshot" not in all_ops and snapshots_of(client, root) == []


def test_without_the_setting_no_snapshot_is_taken(session, calls):
    client = ec2(EAST)
    vol = create_volume(client, REF_A)
    provider = make_provider(session)
    [group] = collect(provider).groups
    assert "DescribeSnapshots" not in calls.ops()  # no retention: snapshots are not even listed
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETED and result.snapshots == ()
    assert not any("Snapshot" in op for op in calls.ops())
    assert not exists(client, "volume", vol) and snapshots_of(client, vol) == []


def age_snapshots(session: boto3.Session, days: int) -> None:
    def older(parsed: dict[str, Any], **_: Any) -> None:
        for snap in parsed.get("Snapshots", []):
            snap["StartTime"] -= timedelta(days=days)

    session.events.register("after-call.ec2.DescribeSnapshots", older)


def test_retained_snapshots_are_not_listed_and_expired_ones_are_leftovers_of_their_ref(session, calls):
    client = ec2(EAST)
    vol = create_volume(client, REF_A)
    keeper = make_provider(session, snapshot_before_delete=True)
    [group] = collect(keeper).groups
    [(_, sid)] = keeper.delete_resource_group(group).snapshots
    client.create_snapshot(VolumeId=create_volume(client, None))  # not ours: never listed

    assert collect(keeper).groups == ()  # retention unset: kept forever, never an orphan
    assert collect(make_provider(session, retain_snapshots_days=7)).groups == ()  # younger than 7 days

    age_snapshots(session, 8)
    provider = make_provider(session, retain_snapshots_days=7)
    calls.clear()
    [leftover] = collect(provider).groups
    [listing] = [p for _, op, p in calls.calls if op == "DescribeSnapshots"]
    assert listing["OwnerIds"] == ["self"] and {"Name": "tag-key", "Values": [TAG]} in listing["Filters"]
    assert group_map([leftover]) == {(REF_A, EAST, None): {sid}}
    assert leftover.resources[0].kind is ResourceKind.SNAPSHOT
    calls.clear()

    result = provider.delete_resource_group(leftover)

    assert result.status is DeleteStatus.DELETED and result.deleted == (sid,)
    assert [op for op in calls.ops() if op.startswith("Delete")] == ["DeleteSnapshot"]
    assert snapshots_of(client, vol) == [] and collect(provider).groups == ()


# ---- the snapshot named in the group's C3 detail and in `explain` (issue #15 item 4) -----------

def test_a_delete_cycle_names_the_kept_snapshot_in_the_detail_and_in_explain(session, emptied_db):
    # Given: a data volume whose ref's owner row is gone (hard-deleted an hour ago), on moto
    client = ec2(EAST)
    ref = add_ref(emptied_db, issued_at=db_now(emptied_db) - timedelta(hours=1))
    vol = create_volume(client, ref)
    add_backend(emptied_db, "aws-snap", regions=(EAST,), mode="delete", settings={"snapshot_before_delete": True})
    pipe = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0, ORPHAN_CLEANUP_MAX_MODE="delete"), db=emptied_db,
                    provider_for=lambda b: build_aws_provider(b, connect_timeout=2, read_timeout=10, session=session),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())

    # When: one delete cycle runs
    report = run_cycle(pipe, "aws-snap")

    # Then: the volume is gone, its snapshot kept, and `run --json` and `explain` name it
    [snap] = snapshots_of(client, vol)
    sid = snap["SnapshotId"]
    assert not exists(client, "volume", vol)
    [group] = report.c3()["groups"]
    assert (group["reason"], group["action"]) == ("owner_deleted", "deleted")
    assert group["detail"].startswith("owner row of ") and group["detail"].endswith(f"; snapshot {sid} of {vol}")
    [got] = explain.document("aws-snap", vol, explain.explain(emptied_db, "aws-snap", vol))["cycles"]
    assert got["detail"] == group["detail"]
    assert f"kept snapshot {sid} of {vol}" in got["delete"]["found"]
    out = io.StringIO()
    explain.print_explained("aws-snap", vol, explain.explain(emptied_db, "aws-snap", vol), stream=out)
    [delete_line] = [line for line in out.getvalue().splitlines() if line.lstrip().startswith("delete ")]
    assert f"deleted {vol}" in delete_line and f"kept snapshot {sid} of {vol}" in delete_line
