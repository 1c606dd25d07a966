"""STEP 4-5 for volume owners (README, C1: a ref whose ``owner_type`` is ``volume`` is owned by
a ``volumes`` row; a volume group's primary is the volume): the split of a listing's
primary-less group into one group per volume, every rule one row each, on both clouds' kinds,
and a batch where a lost attempt sits beside the recorded volume."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orphan_cleanup.core.classify import ClassifyContext, classify, malformed
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.evidence import detail, record_of
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.listing_rules import ListedInstances, attached_user, volume_groups
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.owners import LedgerRecord, VolumeStatus
from orphan_cleanup.core.verdicts import VerdictKind
from tests.support.ledger_helpers import T0, group, resource

REF = "vvvvvvvv1234"
BACKEND = "aws-prod"
SCOPE = "aws:123456789012"
PROTECT = "orphan-cleanup-protect"
MARGIN = timedelta(seconds=300)
LISTED = T0
OLD = LISTED - timedelta(days=1)

O, T, S, I, P = (VerdictKind.ORPHAN, VerdictKind.TRACKED, VerdictKind.SKIPPED, VerdictKind.IGNORED,
                 VerdictKind.PROTECTED)


def vol(rid: str, *, kind: ResourceKind = ResourceKind.VOLUME, created_at=OLD, tags=None,
        state: ResourceState = ResourceState.AVAILABLE, attached_to: str | None = None, **details) -> Resource:
    return Resource(kind=kind, id=rid, region="us-east-1", state=state, created_at=created_at,
                    tags={"provider_ref": REF, **(tags or {})}, attached_to=attached_to, details=details)


def alone(v: Resource) -> ResourceGroup:
    """A volume owner's group as classification judges it: the volume, its primary."""
    return ResourceGroup(provider_ref=REF, region="us-east-1", primary_id=v.id, resources=(v,))


def owner(**kw) -> LedgerRecord:
    """A live, provisioned volume owner of REF on BACKEND, recording vol-1, everything long ago."""
    values = dict(provider_ref=REF, owner_type="volume", owner_id="volume-1", owner_name="data-1", issued_at=OLD,
                  instance_found=True, status="active", backend_id=BACKEND, primary_id="vol-1",
                  region="us-east-1", created_at=OLD, provisioned_at=OLD)
    values.update(kw)
    return LedgerRecord(**values)


def gone(**kw) -> LedgerRecord:
    values = dict(provider_ref=REF, owner_type="volume", owner_id="volume-1", issued_at=OLD, instance_found=False)
    values.update(kw)
    return LedgerRecord(**values)


# The listing shows the recorded volume vol-1 beside the others (what makes another volume of a
# live owner a lost attempt: SAFETY.md rule 17).
CTX = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                      listed=ListedInstances(known=[(REF, "us-east-1", "vol-1")]))
GCP_CTX = ClassifyContext(backend_id="gcp-prod", scope="gcp:proj", listed_at=LISTED, margin=MARGIN,
                          protect_key=PROTECT, listed=ListedInstances(known=[(REF, "us-east-1", "111")]))

V1, V2 = alone(vol("vol-1")), alone(vol("vol-2"))
ATTACHED = alone(vol("vol-2", state=ResourceState.ACTIVE, attached_to="i-0live", state_raw="in-use"))

RULES = [
    # id, group, record, verdict, reason
    ("recorded volume, active: tracked", V1, owner(), T, "tracked"),
    ("recorded volume, provisioning: tracked", V1, owner(status="provisioning"), T, "tracked"),
    ("recorded volume, enum status", V1, owner(status=VolumeStatus.ACTIVE), T, "tracked"),
    ("tracked even when attached", alone(vol("vol-1", attached_to="i-0live")), owner(), T, "tracked"),
    ("pending owner: skipped", V1, owner(status="pending", backend_id=None, primary_id=None), S, "owner_pending"),
    ("deleting owner: skipped", V1, owner(status="deleting"), S, "owner_deleting"),
    ("deleting owner's other volume: skipped", V2, owner(status="deleting"), S, "owner_deleting"),
    ("deleted with deleted_at: orphan", V1, owner(status="deleted", deleted_at=OLD + timedelta(hours=1)),
     O, "owner_soft_deleted"),
    ("deleted without deleted_at: skipped", V1, owner(status="deleted"), S, "deleted_at_missing"),
    ("soft-deleted active row: orphan", V1, owner(deleted_at=OLD + timedelta(hours=1)), O, "owner_soft_deleted"),
    ("hard-deleted row: orphan", V1, gone(), O, "owner_deleted"),
    ("status of an instance is not a volume's", V1, owner(status="idle"), S, "unknown_status"),
    ("unknown status", V1, owner(status="exploded"), S, "unknown_status"),
    ("lost attempt beside its listed recorded volume: orphan", V2, owner(), O, "primary_mismatch"),
    ("lost attempt, recorded volume not listed: skipped", V2, owner(primary_id="vol-9"), S, "primary_not_listed"),
    ("a volume made after provisioning + margin is a copy", alone(vol("vol-2", created_at=OLD + 2 * MARGIN)),
     owner(), P, "suspected_copy"),
    ("no provisioning data", V1, owner(primary_id=None), I, "no_provisioning_data"),
    ("owner names no known backend", V2, owner(backend_id="aws"), S, "unknown_owner_backend"),
    ("attached to a live instance: never deleted", ATTACHED, gone(), S, "in_use"),
    ("attached lost attempt: never deleted", ATTACHED, owner(), S, "in_use"),
    ("protect tag", alone(vol("vol-2", tags={PROTECT: ""})), gone(), P, "protect_tag"),
    ("created within the margin", alone(vol("vol-2", created_at=LISTED - timedelta(seconds=5))), gone(),
     S, "recent_resource"),
    ("a volume owner's ref on an instance's group: skipped", group(REF, "i-1", created_at=OLD), gone(),
     S, "malformed_group"),
    ("live volume owner's ref on an instance's group: skipped", group(REF, "i-1", created_at=OLD), owner(),
     S, "malformed_group"),
    ("a volume-primary group with more members: skipped",
     ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="vol-2",
                   resources=(vol("vol-2"), resource("eni-1", kind="network-interface", created_at=OLD,
                                                     tags={"provider_ref": REF}))), gone(), S, "malformed_group"),
    # owner types other than instance and volume stay ignored, whatever row the join found
    ("another owner type: ignored", V1, owner(owner_type="bucket", status="idle"), I, "unsupported_owner_type"),
    ("another owner type gone: ignored", V1, gone(owner_type="bucket"), I, "unsupported_owner_type"),
    ("another owner type: ignored", V1, gone(owner_type="bucket"), I, "unsupported_owner_type"),
]


@pytest.mark.parametrize("grp, record, kind, reason", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_every_volume_rule(grp, record, kind, reason):
    verdict = classify(grp, record, CTX)
    assert (verdict.kind, verdict.reason) == (kind, reason)


GCP_RULES = [
    ("GCP: recorded disk: tracked", alone(vol("111", kind=ResourceKind.DISK)), owner(primary_id="111", backend_id="gcp-prod"), T, "tracked"),
    ("GCP: lost attempt beside the recorded disk", alone(vol("222", kind=ResourceKind.DISK)),
     owner(primary_id="111", backend_id="gcp-prod"), O, "primary_mismatch"),
    ("GCP: disk of a deleted owner", alone(vol("222", kind=ResourceKind.DISK)), gone(), O, "owner_deleted"),
    ("GCP: disk with users (its instance not listed): in use",
     alone(vol("222", kind=ResourceKind.DISK, state=ResourceState.ACTIVE,
               users=["https://compute/projects/p/zones/us-east1-b/instances/web-1"])), gone(), S, "in_use"),
    ("GCP: disk in use, details reduced away", alone(vol("222", kind=ResourceKind.DISK, state=ResourceState.ACTIVE)),
     gone(), S, "in_use"),
]


@pytest.mark.parametrize("grp, record, kind, reason", [r[1:] for r in GCP_RULES], ids=[r[0] for r in GCP_RULES])
def test_every_volume_rule_on_gcp_disks(grp, record, kind, reason):
    verdict = classify(grp, record, GCP_CTX)
    assert (verdict.kind, verdict.reason) == (kind, reason)


def test_a_volume_owners_group_is_one_group_per_volume_and_the_rest():
    # given a listing's primary-less group of a ref: two volumes and a snapshot the deleter took
    snap = resource("snap-1", kind="snapshot", created_at=OLD, tags={"provider_ref": REF})
    listed = ResourceGroup(provider_ref=REF, region="us-east-1", resources=(vol("vol-1"), snap, vol("vol-2")))
    # when it is split for a volume owner
    split = volume_groups(listed)
    # then each volume is its own group, its primary, and the rest stays primary-less
    assert [(g.primary_id, g.resource_ids()) for g in split] == [
        ("vol-1", ["vol-1"]), ("vol-2", ["vol-2"]), (None, ["snap-1"])]
    assert len({g.key for g in split}) == 3
    # and a group with a primary, or without a volume, is itself
    assert volume_groups(group(REF, "i-1")) == (group(REF, "i-1"),)
    only_snap = ResourceGroup(provider_ref=REF, region="us-east-1", resources=(snap,))
    assert volume_groups(only_snap) == (only_snap,)


def test_a_lost_attempt_is_deleted_alone_never_with_the_recorded_volume_beside_it():
    # given one listed primary-less group holding the recorded volume vol-1 and a leaked vol-2
    listed = ResourceGroup(provider_ref=REF, region="us-east-1", resources=(vol("vol-1"), vol("vol-2")))
    batch = ListingBatch(cycle_id="c1", backend=BACKEND, seq=0, listed_at=LISTED, mode="delete", groups=(listed,),
                         last=True, batch_count=1)
    ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                          listed=ListedInstances(batch.groups))
    # when the batch is classified against the live volume owner
    app = classify_batch(batch, {REF: owner()}, ctx, mode="delete", record_all=True)
    # then the recorded volume is tracked and only the leak is an orphan, in its own group
    by_primary = {row.group.primary_id: (row.verdict, row.reason, row.group.resource_ids()) for row in app.rows}
    assert by_primary == {"vol-1": (T, "tracked", ["vol-1"]), "vol-2": (O, "primary_mismatch", ["vol-2"])}
    assert [o.row.group.resource_ids() for o in app.orphans] == [["vol-2"]]
    # and the cycle counts the groups the listing had (the blast-radius share is not loosened)
    assert app.groups == 1


def test_the_listing_shows_the_recorded_volume_only_as_a_volume_of_the_ref():
    listed = [ResourceGroup(provider_ref=REF, region="us-east-1", resources=(vol("vol-1"),)),
              group(REF, "i-1", created_at=OLD)]
    seen = ListedInstances(listed)
    assert seen.has_volume(REF, "us-east-1", "vol-1")
    assert not seen.has_volume(REF, "us-east-1", "i-1")  # an instance is no volume
    assert not seen.has_volume(REF, "eu-west-1", "vol-1")
    assert not seen.has_volume("otherref1234", "us-east-1", "vol-1")
    foreign = ResourceGroup(provider_ref=REF, region="us-east-1",
                            resources=(vol("vol-3").model_copy(update={"tags": {"provider_ref": "otherref1234"}}),))
    assert not ListedInstances([foreign]).has_volume(REF, "us-east-1", "vol-3")
    assert not seen.has(REF, "us-east-1", "vol-1")  # and a volume is no instance (an instance owner's rule 17)


def test_an_instance_owners_group_with_a_volume_primary_is_malformed():
    # a forged message cannot make an instance owner's volume a primary that goes
    v = alone(vol("vol-2"))
    assert malformed(v, "provider_ref", "aws") is not None
    assert malformed(v, "provider_ref", "aws", "volume") is None
    terminated = LedgerRecord(provider_ref=REF, owner_id="inst-1", issued_at=OLD, instance_found=True,
                              status="terminated", terminated_at=OLD, created_at=OLD)
    assert classify(v, terminated, CTX).reason == "malformed_group"


def test_in_use_names_the_instance_holding_the_volume():
    verdict = classify(ATTACHED, gone(), CTX)
    ev = record_of(ATTACHED, gone(), CTX, verdict)
    assert ev["au"] == "i-0live"
    assert detail(verdict.reason, ev, ATTACHED, LISTED) == "vol-2 is attached to instance i-0live:" \
                                                           " never deleted from under it"
    assert attached_user(vol("vol-3", state=ResourceState.ACTIVE, state_raw="x")) is None  # AWS creating: not held
    assert attached_user(vol("vol-3", state=ResourceState.ACTIVE).model_copy(
        update={"details": {"state": "in-use"}})) == "an instance"
