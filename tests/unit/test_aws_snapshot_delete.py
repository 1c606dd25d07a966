"""A data volume is snapshotted before it is deleted (issue #15 item 4), on a real botocore
EC2 client with botocore's Stubber: every request is checked against the EC2 model, the
calls must come in exactly the order given, and any call not listed (a ``delete_volume``
before the snapshot completed) fails the test. moto completes a snapshot at once, so the
``pending`` and ``error`` states are played here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from pydantic import ValidationError

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.delete_rules import delete_record
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import Action, DeleteStatus
from orphan_cleanup.providers.aws.snapshots import facts_of
from orphan_cleanup.providers.snapshots import expired
from tests.support.aws_stub import stubbed_delete

REGION = "us-east-1"
REF = "abcdefabcdef"
TAGS = [{"Key": "provider_ref", "Value": REF}]
VOL = "vol-0123456789abcdef0"
SNAP = "snap-0123456789abcdef0"
SOURCE_TAGS = [*TAGS, {"Key": "orphan-cleanup-source", "Value": VOL}]
LEFTOVER = ResourceGroup(provider_ref=REF, region=REGION, resources=(
    Resource(kind=ResourceKind.VOLUME, id=VOL, region=REGION, tags={"provider_ref": REF}),))


def delete(client: Any, *, snapshot_before_delete: bool = True):
    return stubbed_delete(client, LEFTOVER, snapshot_before_delete=snapshot_before_delete)


def expect_volume(stub: Stubber) -> None:
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "available", "Tags": TAGS}]},
                      {"VolumeIds": [VOL]})


def expect_members(stub: Stubber) -> None:
    """The group has no owner: its members (the one volume) are re-read by id before any of
    them is touched (a protect tag on one keeps the group); the volume is then read again as
    a dependent, right before its own calls (``expect_volume``)."""
    expect_volume(stub)


def snapshot(state: str, sid: str = SNAP) -> dict[str, Any]:
    return {"SnapshotId": sid, "VolumeId": VOL, "State": state, "Tags": SOURCE_TAGS}


def expect_ours(stub: Stubber, *snapshots: dict[str, Any]) -> None:
    stub.add_response("describe_snapshots", {"Snapshots": list(snapshots)}, {"OwnerIds": ["self"], "Filters": [
        {"Name": "volume-id", "Values": [VOL]}, {"Name": "tag:orphan-cleanup-source", "Values": [VOL]},
        {"Name": "tag:provider_ref", "Values": [REF]}]})


def expect_create(stub: Stubber, state: str) -> None:
    stub.add_response("create_snapshot", {"SnapshotId": SNAP, "VolumeId": VOL, "State": "pending"},
                      {"VolumeId": VOL, "Description": ANY,
                       "TagSpecifications": [{"ResourceType": "snapshot", "Tags": SOURCE_TAGS}]})
    # confirmed by a re-read, never the create's reply (seed 002): found again by its tags
    expect_ours(stub, snapshot(state))


def expect_delete_volume(stub: Stubber) -> None:
    stub.add_response("delete_volume", {}, {"VolumeId": VOL})


def test_a_pending_snapshot_keeps_the_volume_and_the_group_in_progress(ec2):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub)
    expect_create(stub, "pending")  # no delete_volume answer: a delete would fail the test

    result = delete(client)

    assert result.status is DeleteStatus.DELETING and result.pending == (VOL,) and result.deleted == ()
    assert result.snapshots_pending == ((VOL, SNAP),) and result.snapshots == ()
    record = delete_record(LEFTOVER, result=result)
    assert record.action is Action.DELETING and not record.failed and record.unsettled
    assert record.message == (f"deleting orphan group {LEFTOVER.key} (1 resources); waiting for snapshot {SNAP}"
                              f" of {VOL} to complete before deleting the volume")


def test_the_next_cycle_waits_for_the_same_snapshot_without_taking_another(ec2):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub, snapshot("pending"))  # no create_snapshot answer: a second snapshot would fail

    result = delete(client)

    assert result.status is DeleteStatus.DELETING and result.snapshots_pending == ((VOL, SNAP),)


def test_a_completed_snapshot_lets_the_volume_go_and_is_named(ec2):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub, snapshot("error", "snap-0fffffffffffffff0"), snapshot("completed"))
    expect_volume(stub)  # read again after the snapshot's calls, right before its own
    expect_delete_volume(stub)

    result = delete(client)

    assert result.status is DeleteStatus.DELETED and result.deleted == (VOL,)
    assert result.snapshots == ((VOL, SNAP),)
    assert f"kept snapshot {SNAP} of {VOL}" in delete_record(LEFTOVER, result=result).message


def test_a_snapshot_taken_and_completed_at_once_lets_the_volume_go_in_the_same_call(ec2):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub)
    expect_create(stub, "completed")
    expect_volume(stub)  # read again after the snapshot's calls and wait, right before its own
    expect_delete_volume(stub)

    assert delete(client).snapshots == ((VOL, SNAP),)


@pytest.mark.parametrize(("again", "reason"), [
    ([*TAGS, {"Key": "orphan-cleanup-protect", "Value": "yes"}], "protected"),
    ([{"Key": "provider_ref", "Value": "bbbbbbbbbbbb"}], "ref_changed"),
], ids=["protect-tag", "another-ref"])
def test_a_volume_that_changed_while_its_snapshot_was_taken_is_not_deleted(ec2, again, reason):
    # the snapshot's create and wait came between the volume's read and its delete: it is
    # judged again on a new read (its snapshot is kept and named all the same)
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub)
    expect_create(stub, "completed")
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "available", "Tags": again}]},
                      {"VolumeIds": [VOL]})
    # no delete_volume answer: a delete would fail the test

    result = delete(client)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert [(s.id, s.reason) for s in result.skipped] == [(VOL, reason)]
    assert result.snapshots == ((VOL, SNAP),)


def test_a_volume_unread_after_its_snapshot_is_pending_not_deleted(ec2):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub, snapshot("completed"))
    stub.add_response("describe_volumes", {"Volumes": []}, {"VolumeIds": [VOL]})  # an answer without it

    result = delete(client)

    assert result.status is DeleteStatus.DELETING and result.pending == (VOL,) and result.deleted == ()
    assert [(s.id, s.reason) for s in result.skipped] == [(VOL, "unreadable")]


@pytest.mark.parametrize("state", ["error", "recovering"])
def test_a_failed_snapshot_fails_the_group_and_keeps_the_volume(ec2, state):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_ours(stub, snapshot(state))

    with pytest.raises(ProviderError, match=f"snapshot {SNAP} of {VOL} is '{state}', not complete"):
        delete(client)


def test_a_snapshot_of_another_ref_does_not_count(ec2):
    # The server filters on tags; the deleter checks them again (a reply it cannot trust):
    # one that claims to be ours but is not fails the group, and the volume is kept.
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    foreign = snapshot("completed") | {"Tags": [{"Key": "provider_ref", "Value": "bbbbbbbbbbbb"},
                                                {"Key": "orphan-cleanup-source", "Value": VOL}]}
    expect_ours(stub, foreign)  # no create_snapshot, no delete_volume answer: either would fail the test

    with pytest.raises(ProviderError, match=f"snapshot {SNAP} claims to be ours of {VOL}"):
        delete(client)


def test_without_the_setting_no_snapshot_is_read_or_taken(ec2):
    client, stub = ec2
    expect_members(stub)
    expect_volume(stub)
    expect_delete_volume(stub)

    result = delete(client, snapshot_before_delete=False)

    assert result.status is DeleteStatus.DELETED and result.snapshots == () and result.snapshots_pending == ()


NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(("started", "is_expired"), [
    (NOW - timedelta(days=7), True), (NOW - timedelta(days=7) + timedelta(seconds=1), False),
    (NOW, False), (None, False), ("2026-01-01", False),
    # a naive time cannot be dated (botocore's parser always answers an aware one): kept
    (datetime(2020, 1, 1), False)],
    ids=["at-retention", "just-younger", "new", "no-start-time", "not-a-time", "naive-time"])
def test_a_snapshot_expires_only_with_a_readable_start_older_than_the_retention(started, is_expired):
    assert expired(facts_of({"SnapshotId": SNAP, "StartTime": started}).created_at, retain_days=7,
                   now=NOW) is is_expired


@pytest.mark.parametrize("settings", [{"snapshot_before_delete": "false"}, {"snapshot_before_delete": 1},
                                      {"retain_snapshots_days": 0}, {"retain_snapshots_days": 1.5},
                                      {"retain_snapshots_days": True}, {"retain_snapshots_days": "7"}])
def test_snapshot_settings_are_validated(settings):
    with pytest.raises(ValidationError):
        BackendSettings.model_validate(settings)


def test_snapshot_settings_default_to_no_snapshot_and_keep_forever():
    s = BackendSettings()
    assert s.snapshot_before_delete is False and s.retain_snapshots_days is None
    assert BackendSettings.from_input({"snapshot_before_delete": True, "retain_snapshots_days": 30}) \
        .retain_snapshots_days == 30


@pytest.mark.parametrize("settings", [{"snapshot_before_delete": True}, {"retain_snapshots_days": 7}])
def test_a_gcp_backend_takes_the_snapshot_settings(settings):
    backend = Backend(id="g", provider="gcp", account="p", regions=("us-central1",), settings=settings)
    assert backend.settings.model_dump(include=set(settings)) == settings
    with pytest.raises(ValidationError):  # the values are still checked
        Backend(id="g", provider="gcp", account="p", regions=("us-central1",), settings={k: "yes" for k in settings})
