"""STEP 4-5: every classification rule, one row each, then the margin edges."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orphan_cleanup.core.classify import ClassifyContext, classify
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.owners import LedgerRecord, OwnerStatus
from orphan_cleanup.core.verdicts import VerdictKind
from tests.support.ledger_helpers import T0, group, leftovers, resource

REF = "abcdefgh1234"
OTHER_REF = "zzzzzzzz9999"
BACKEND = "aws-prod"
SCOPE = "aws:123456789012"              # this backend's provider:account
OTHER_ACCOUNT = "aws:210987654321"
PROTECT = "orphan-cleanup-protect"
MARGIN = timedelta(seconds=300)
LISTED = T0
OLD = LISTED - timedelta(days=1)
HORIZON = LISTED - MARGIN
US = timedelta(microseconds=1)
# The listing these groups come from shows REF's recorded primaries i-1 and i-3 as valid
# instances (what makes another VM of a live owner a retry leak: SAFETY.md rule 17).
CTX = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                      stuck_after=timedelta(hours=1),
                      listed=ListedInstances(known=[(REF, "us-east-1", "i-1"), (REF, "us-east-1", "i-3")]))

O, T, S, I, P = (VerdictKind.ORPHAN, VerdictKind.TRACKED, VerdictKind.SKIPPED, VerdictKind.IGNORED,
                 VerdictKind.PROTECTED)


def live(**kw) -> LedgerRecord:
    """A live, provisioned owner of REF on BACKEND with primary i-1, everything long ago."""
    values = dict(provider_ref=REF, owner_id="inst-1", owner_name="train-1", issued_at=OLD, instance_found=True,
                  status="idle", backend_id=BACKEND, primary_id="i-1", region="us-east-1",
                  created_at=OLD, provisioned_at=OLD)
    values.update(kw)
    return LedgerRecord(**values)


def gone(**kw) -> LedgerRecord:
    """A ref whose owner row was hard-deleted (only provider_refs is left)."""
    values = dict(provider_ref=REF, owner_id="inst-1", owner_name="train-1", issued_at=OLD, instance_found=False)
    values.update(kw)
    return LedgerRecord(**values)


def terminated(**kw) -> LedgerRecord:
    return live(**{"status": "terminated", "terminated_at": OLD + timedelta(hours=1), **kw})


G1 = group(REF, "i-1", created_at=OLD)               # the owner's own primary
G2 = group(REF, "i-2", created_at=OLD)               # another primary carrying the ref, made long ago
LEFT = leftovers(REF, "vol-1", "vol-2", created_at=OLD)  # primary-less group


def primary_with(grp: ResourceGroup, **fields) -> ResourceGroup:
    """``grp`` with its primary's ``fields`` replaced (``controller``, ``protection``)."""
    return grp.model_copy(update={"resources": tuple(r.model_copy(update=fields) if r.id == grp.primary_id else r
                                                     for r in grp.resources)})


ASG = primary_with(G1, controller="asg:web-asg")
MIG = primary_with(G1, controller="mig:projects/p/zones/us-central1-a/instanceGroupManagers/web")
DELETION_PROTECTED = primary_with(G1, protection="deletion_protection")
REMEMBERED = {"i-1": "termination_protection"}

RULES = [
    # id, group, record, verdict, reason, log_error expected
    ("no record", G1, None, I, "no_record", False),
    ("record of another ref", G1, live(provider_ref=OTHER_REF), S, "record_mismatch", True),
    ("record without owner", G1, gone(), O, "owner_deleted", False),
    ("leftovers of a hard-deleted owner", LEFT, gone(), O, "owner_deleted", False),
    ("owner_type not instance, gateway or volume", G1, gone(owner_type="bucket"), I, "unsupported_owner_type", True),
    ("another owner type with an instances row", G1, live(owner_type="bucket"), I, "unsupported_owner_type", True),
    ("a gateway owner is an instance owner: tracked", G1, live(owner_type="gateway"), T, "tracked", False),
    ("a gateway owner is an instance owner: gone", G1, gone(owner_type="gateway"), O, "owner_deleted", False),
    ("a gateway owner is an instance owner: terminating", G1, live(owner_type="gateway", status="terminating"), S,
     "owner_terminating", False),
    ("pending, created recently", G1, live(status="pending", created_at=LISTED - timedelta(minutes=10),
                                            backend_id=None, primary_id=None, provisioned_at=None),
     S, "owner_pending", False),
    ("pending, created long ago: stuck", G1, live(status="pending", backend_id=None, primary_id=None,
                                                  provisioned_at=None), S, "owner_pending", True),
    ("pending, no created_at", G1, live(status="pending", created_at=None), S, "owner_pending", False),
    ("terminating", G1, live(status="terminating"), S, "owner_terminating", False),
    ("terminated", G1, terminated(), O, "owner_terminated", False),
    ("terminated, enum status", G1, terminated(status=OwnerStatus.TERMINATED), O, "owner_terminated", False),
    ("terminated without terminated_at", G1, live(status="terminated"), S, "terminated_at_missing", True),
    ("soft-deleted live owner", G1, live(deleted_at=OLD + timedelta(hours=2)), O, "owner_soft_deleted", False),
    ("soft-deleted pending owner", G1, live(status="pending", deleted_at=OLD), O, "owner_soft_deleted", False),
    ("provisioning, matching", G1, live(status="provisioning"), T, "tracked", False),
    ("idle, matching", G1, live(status="idle"), T, "tracked", False),
    ("busy, matching", G1, live(status="busy"), T, "tracked", False),
    ("busy enum, matching", G1, live(status=OwnerStatus.BUSY), T, "tracked", False),
    ("tracked even with a protect tag", group(REF, "i-1", created_at=OLD, tags={PROTECT: ""}), live(),
     T, "tracked", False),
    ("tracked even when created just now", group(REF, "i-1", created_at=LISTED), live(), T, "tracked", False),
    ("mismatched primary created before provisioning", G2, live(), O, "primary_mismatch", False),
    ("mismatched primary created within provisioned_at+margin", group(REF, "i-2", created_at=OLD + MARGIN),
     live(), O, "primary_mismatch", False),
    # SAFETY.md rule 10: ownership is by provider account, not by backend id.
    ("owner in another backend of this account, matching", G1,
     live(backend_id="aws-other", owner_backend_scope=SCOPE), T, "tracked", False),
    ("owner in another backend of this account, another primary", G2,
     live(backend_id="aws-other", owner_backend_scope=SCOPE), O, "primary_mismatch", False),
    ("owner in another backend of this account, leftovers", LEFT,
     live(backend_id="aws-other", owner_backend_scope=SCOPE), P, "unattached_of_live_owner", False),
    ("owner failed over to another account", G2,
     live(backend_id="aws-dr", owner_backend_scope=OTHER_ACCOUNT), O, "backend_mismatch", False),
    ("owner failed over to another provider", G2,
     live(backend_id="gcp-dr", owner_backend_scope="gcp:123456789012"), O, "backend_mismatch", False),
    ("owner in another account records this very VM", G1,
     live(backend_id="aws-dr", owner_backend_scope=OTHER_ACCOUNT), S, "owner_backend_conflict", True),
    ("owner names no known backend", G1, live(backend_id="aws"), S, "unknown_owner_backend", True),
    ("owner names no known backend, another primary", G2, live(backend_id="aws"), S,
     "unknown_owner_backend", True),
    ("malformed ref value", ResourceGroup(provider_ref="", region="us-east-1", primary_id="i-9", malformed_ref=True,
                                          resources=(resource("i-9", created_at=OLD, tags={"provider_ref": ""}),)),
     None, I, "malformed_ref", False),
    ("malformed ref value even if the ledger answers", ResourceGroup(
        provider_ref="ABCDEFGH1234", region="us-east-1", primary_id="i-9", malformed_ref=True,
        resources=(resource("i-9", created_at=OLD, tags={"provider_ref": "ABCDEFGH1234"}),)),
     gone(provider_ref="ABCDEFGH1234"), I, "malformed_ref", False),
    ("no provisioning data: backend", G1, live(backend_id=None), I, "no_provisioning_data", True),
    ("no provisioning data: primary", G1, live(primary_id=None), I, "no_provisioning_data", True),
    ("unknown status", G1, live(status="exploded"), S, "unknown_status", True),
    ("status missing on a found instance", G1, live(status=None), S, "unknown_status", True),
    ("primary-less group of a live owner", LEFT, live(), P, "unattached_of_live_owner", False),
    ("primary-less group, some ids known orphans", LEFT, live(known_orphan_resource_ids=frozenset({"vol-1"})),
     P, "unattached_of_live_owner", False),
    ("primary-less group, all ids known orphans", LEFT,
     live(known_orphan_resource_ids=frozenset({"vol-1", "vol-2", "vol-9"})), O, "leftover_of_orphan", False),
    ("protect tag on an orphan candidate", group(REF, "i-1", created_at=OLD, tags={PROTECT: "yes"}),
     terminated(), P, "protect_tag", False),
    ("protect tag on a dependent of an orphan candidate",
     group(REF, "i-1", created_at=OLD, extra=[resource("vol-1", kind="volume", created_at=OLD,
                                                        tags={PROTECT: ""})]), gone(), P, "protect_tag", False),
    ("copy created after provisioning+margin", group(REF, "i-2", created_at=OLD + MARGIN + US), live(),
     P, "suspected_copy", False),
    ("mismatched primary with unknown created_at", group(REF, "i-2", created_at=None), live(),
     P, "suspected_copy", False),
    ("mismatched primary without provisioned_at", G2, live(provisioned_at=None), P, "suspected_copy", False),
    # SAFETY.md rule 14: an orphan candidate another controller would re-create, or protected by the provider
    ("ASG member of a terminated owner", ASG, terminated(), P, "managed_by_controller", False),
    ("MIG member of a hard-deleted owner", MIG, gone(), P, "managed_by_controller", False),
    ("controller member created within the margin: protected, not left unsettled",
     primary_with(group(REF, "i-1", created_at=LISTED), controller="asg:web-asg"), gone(), P,
     "managed_by_controller", False),
    ("an unreadable controller field fails closed",
     primary_with(G1, controller="unknown:metadata.items is not a list"), gone(), P, "managed_by_controller", False),
    ("a controller on a dependent protects the group",
     group(REF, "i-1", created_at=OLD, extra=[resource("vol-1", kind="volume", created_at=OLD, tags={
         "provider_ref": REF}).model_copy(update={"controller": "asg:web-asg"})]), gone(), P,
     "managed_by_controller", False),
    ("a lost attempt in an ASG", primary_with(G2, controller="asg:web-asg"), live(), P, "managed_by_controller",
     False),
    ("tracked ASG member stays tracked", ASG, live(), T, "tracked", False),
    ("foreign ASG member stays ignored", ASG, None, I, "no_record", False),
    ("ASG member of a pending owner stays skipped", ASG, live(status="pending"), S, "owner_pending", True),
    ("GCP deletion protection", DELETION_PROTECTED, terminated(), P, "deletion_protection", False),
    ("termination protection an earlier delete found", G1, terminated(protected_primaries=REMEMBERED), P,
     "termination_protection", False),
    ("a remembered protection of another primary does not apply", G2,
     live(primary_id="i-3", protected_primaries=REMEMBERED), O, "primary_mismatch", False),
    ("tracked with a remembered protection stays tracked", G1, live(protected_primaries=REMEMBERED), T, "tracked",
     False),
    # SAFETY.md rule 17: a live owner's other VM is a retry leak only beside its listed primary.
    ("recorded primary not listed (a mangled id)", G2, live(primary_id="i-1x"), S, "primary_not_listed", True),
    ("recorded primary is the instance's name", G2, live(primary_id="train-1"), S, "primary_not_listed", True),
    ("recorded primary of another backend of the account, not listed", G2,
     live(backend_id="aws-other", owner_backend_scope=SCOPE, primary_id="i-9"), S, "primary_not_listed", True),
    ("a failover leftover needs no listed primary", G2,
     live(backend_id="aws-dr", owner_backend_scope=OTHER_ACCOUNT, primary_id="i-9"), O, "backend_mismatch", False),
    ("mismatched primary not among the group's resources",
     ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-2",
                   resources=(resource("vol-1", kind="volume", created_at=OLD),)), live(), P, "suspected_copy", False),
]


@pytest.mark.parametrize("grp, record, kind, reason, logs", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_every_rule(grp, record, kind, reason, logs):
    # given a listed group and its ledger record (or none)
    # when it is classified
    verdict = classify(grp, record, CTX)
    # then
    assert (verdict.kind, verdict.reason) == (kind, reason)
    assert (verdict.log_error is not None) is logs, verdict.log_error


MARGIN_EDGES = [
    ("owner terminated exactly at listed_at - margin", G1, terminated(terminated_at=HORIZON),
     S, "recent_owner_change"),
    ("owner terminated 1us before listed_at - margin", G1, terminated(terminated_at=HORIZON - US),
     O, "owner_terminated"),
    ("owner terminated after listed_at (DB clock ahead)", G1, terminated(terminated_at=LISTED + timedelta(seconds=5)),
     S, "recent_owner_change"),
    ("owner soft-deleted within the margin", G1, live(deleted_at=LISTED - timedelta(seconds=10)),
     S, "recent_owner_change"),
    ("resource created within the margin", group(REF, "i-1", created_at=LISTED - timedelta(seconds=10)),
     terminated(), S, "recent_resource"),
    ("resource created exactly at listed_at - margin", group(REF, "i-1", created_at=HORIZON), terminated(),
     S, "recent_resource"),
    ("resource created 1us before listed_at - margin", group(REF, "i-1", created_at=HORIZON - US), terminated(),
     O, "owner_terminated"),
    ("dependent created within the margin", group(REF, "i-1", created_at=OLD, extra=[
        resource("vol-1", kind="volume", created_at=LISTED - timedelta(seconds=1))]), gone(),
     S, "recent_resource"),
    ("hard-deleted owner, ref issued within the margin", G1, gone(issued_at=LISTED - timedelta(seconds=30)),
     S, "recent_owner_change"),
    ("hard-deleted owner, ref issued 1us before the horizon", G1, gone(issued_at=HORIZON - US),
     O, "owner_deleted"),
    ("mismatched primary of an owner provisioned within the margin", group(REF, "i-2", created_at=OLD),
     live(provisioned_at=LISTED - timedelta(seconds=60)), S, "recent_owner_change"),
    ("protect tag does not override the margin", group(REF, "i-1", created_at=OLD, tags={PROTECT: ""}),
     terminated(terminated_at=LISTED), S, "recent_owner_change"),
    ("leftovers of an orphan created within the margin",
     leftovers(REF, "vol-1", created_at=LISTED - timedelta(seconds=1)),
     live(known_orphan_resource_ids=frozenset({"vol-1"})), S, "recent_resource"),
]


@pytest.mark.parametrize("grp, record, kind, reason", [r[1:] for r in MARGIN_EDGES], ids=[r[0] for r in MARGIN_EDGES])
def test_step5_margin_edges(grp, record, kind, reason):
    verdict = classify(grp, record, CTX)
    assert (verdict.kind, verdict.reason) == (kind, reason)


def test_a_zero_margin_still_skips_changes_at_or_after_listing():
    # given no margin at all
    ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=timedelta(0), protect_key=PROTECT)
    # then an owner terminated at the listing instant is still skipped, a microsecond earlier is an orphan
    assert classify(G1, terminated(terminated_at=LISTED), ctx).kind is S
    assert classify(G1, terminated(terminated_at=LISTED - US), ctx).kind is O


def test_stuck_threshold_follows_the_context():
    record = live(status="pending", created_at=LISTED - timedelta(minutes=20))
    short = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                            stuck_after=timedelta(minutes=15))
    assert classify(G1, record, CTX).log_error is None
    assert classify(G1, record, short).log_error is not None


def test_protect_key_is_the_configured_one():
    # given a backend that uses its own protect key
    ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key="keep-me")
    default_tagged = group(REF, "i-1", created_at=OLD, tags={PROTECT: ""})
    custom_tagged = group(REF, "i-1", created_at=OLD, tags={"keep-me": "1"})
    # then only the configured key protects
    assert classify(default_tagged, terminated(), ctx).kind is O
    assert classify(custom_tagged, terminated(), ctx).reason == "protect_tag"


def test_the_recorded_primary_counts_only_when_the_listing_shows_it_as_an_instance_of_the_ref():
    # given the owner's VM i-1 and a leaked VM i-2 of REF in one listing
    listed = [G1, G2]
    # when the leaked VM is judged beside that listing, it is a retry leak
    ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                          listed=ListedInstances(listed))
    assert classify(G2, live(), ctx).reason == "primary_mismatch"
    # but not beside a listing where i-1 carries another ref, or is not listed at all
    other = group(OTHER_REF, "i-1", created_at=OLD)
    for groups in ([other, G2], [G2]):
        ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                              listed=ListedInstances(groups))
        assert classify(G2, live(), ctx).reason == "primary_not_listed"
    # and with no listing known at all (the deleter without its cycle's record)
    bare = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT)
    assert classify(G2, live(), bare).reason == "primary_not_listed"


def test_the_recorded_primary_counts_only_in_the_leaks_region():
    # the owner's VM i-1 is listed, but in another region than the leaked VM i-2
    ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key=PROTECT,
                          listed=ListedInstances([group(REF, "i-1", region="eu-west-1", created_at=OLD), G2]))
    assert classify(G2, live(), ctx).reason == "primary_not_listed"
