"""The pure rules: STEP 1's activity decision and due selection, STEP 4-5
classification and the verdict -> action rules, STEP 7 outcome and backoff, the
blast-radius cap (the deletion rules are in ``delete_rules``). Data in, data
out: no I/O, no clock, no SDKs. The pipeline is their only caller.

Every rule fails closed: anything unexpected is ``skipped`` (the cycle stays
unsettled) or ``ignored``/``protected`` (never touched), never ``orphan``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property, lru_cache

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.errors import BlastRadiusExceeded
from orphan_cleanup.core.listing import PROVIDER_KINDS, ResourceGroup, ResourceKind
from orphan_cleanup.core.listing_rules import VOLUME_KINDS, ListedInstances, attached_user
from orphan_cleanup.core.owners import Keep, OwnerStatus, Record, VolumeStatus
from orphan_cleanup.core.verdicts import Action, Outcome, Verdict, VerdictKind

LIVE = frozenset({OwnerStatus.PROVISIONING.value, OwnerStatus.IDLE.value, OwnerStatus.BUSY.value})
# Read once: an enum member's ``.value`` is a property, and ``classify`` runs per listed group.
_PENDING, _TERMINATING, _TERMINATED = (OwnerStatus.PENDING.value, OwnerStatus.TERMINATING.value,
                                       OwnerStatus.TERMINATED.value)
#: A volume owner's statuses (README, C1): live ones, and the end of its life.
VOLUME_LIVE = frozenset({VolumeStatus.PROVISIONING.value, VolumeStatus.ACTIVE.value})
_DELETING, _DELETED = VolumeStatus.DELETING.value, VolumeStatus.DELETED.value
#: The owner types cleanup classifies (README, C1); any other is ``ignored``. A ``gateway`` is
#: an instances row, judged as an instance; its load balancer goes only once the VMs it serves
#: are gone or terminating (the deleter's read: SAFETY.md rule 15).
CLASSIFIED_OWNER_TYPES = frozenset({"instance", "gateway", "volume"})


@dataclass(frozen=True)
class Limits:
    """Effective per-backend limits (``policy.limits_for``: the stack's, tightened by the backend's)."""

    interval_seconds: int
    margin_seconds: int
    max_backoff_seconds: int
    cycle_deadline_seconds: int
    max_deletes: int
    max_delete_share: float
    # Mark, then sweep (SAFETY.md rule 23): 0 deletes in the first delete cycle past the margin.
    confirm_seconds: int = 0


@dataclass(frozen=True)
class ClassifyContext:
    backend_id: str
    # ``provider:account`` of this backend (``Backend.scope``): owners of any backend
    # with the same scope are this account's owners (SAFETY.md rule 10).
    scope: str
    listed_at: datetime
    margin: timedelta
    protect_key: str
    stuck_after: timedelta = timedelta(hours=1)
    tag_key: str = DEFAULT_TAG_KEY
    # The protect keys of the account's other backends (SAFETY.md rule 16).
    more_protect_keys: frozenset[str] = frozenset()
    # A delete cycle re-reads a remembered protection instead of trusting it (rule 14).
    recheck_protections: bool = False
    # The instances this listing shows (rule 17); None: none known.
    listed: ListedInstances | None = None

    @cached_property
    def protect_keys(self) -> frozenset[str]:
        return self.more_protect_keys | {self.protect_key}


@lru_cache(maxsize=256)
def _v(kind: VerdictKind, reason: str, log_error: str | None = None) -> Verdict:
    # Verdicts are frozen and few: share one object per (kind, reason, error).
    return Verdict(kind=kind, reason=reason, log_error=log_error)


_TRACKED = _v(VerdictKind.TRACKED, "tracked")  # most groups of a healthy account
_KEPT = _v(VerdictKind.PROTECTED, "kept_by_operator")


def kept(verdict: Verdict, keep: Keep | None) -> Verdict:
    """An operator's keep of the group's ref (SAFETY.md rule 23): a group that is not tracked
    is protected, whatever it would have been (an orphan, a skipped or an ignored group: never
    deleted, and reported as kept). A tracked group stays tracked: it is the platform's."""
    if keep is None or verdict.kind is VerdictKind.TRACKED:
        return verdict
    return _KEPT


def classify(group: ResourceGroup, record: Record | None, ctx: ClassifyContext) -> Verdict:
    """STEP 4-5 for one group. ``record`` is ``None`` when the ref is not in the ledger."""
    if group.malformed_ref:
        return _v(VerdictKind.IGNORED, "malformed_ref")
    if record is None:
        return _v(VerdictKind.IGNORED, "no_record")
    if record.provider_ref != group.provider_ref:
        return _v(VerdictKind.SKIPPED, "record_mismatch", "ledger record does not match the group's ref")
    if record.owner_type not in CLASSIFIED_OWNER_TYPES:
        return _v(VerdictKind.IGNORED, "unsupported_owner_type",
                  f"ref owned by {record.owner_type!r}, which cleanup does not handle")
    if not record.instance_found:
        return _orphan_unless_recent(group, record, ctx, "owner_deleted")
    if record.deleted_at is not None:
        return _orphan_unless_recent(group, record, ctx, "owner_soft_deleted")
    status = record.status
    if type(status) is not str:  # an OwnerStatus, or not a status at all
        status = str(status.value if isinstance(status, OwnerStatus | VolumeStatus) else status)
    if status == _PENDING:
        stuck = record.created_at is not None and ctx.listed_at - record.created_at > ctx.stuck_after
        return _v(VerdictKind.SKIPPED, "owner_pending",
                  "pending owner's resources look stuck" if stuck else None)
    if record.owner_type == "volume":
        return _classify_volume_owner(group, record, ctx, status)
    if status == _TERMINATING:
        return _v(VerdictKind.SKIPPED, "owner_terminating")
    if status == _TERMINATED:
        if record.terminated_at is None:
            return _v(VerdictKind.SKIPPED, "terminated_at_missing",
                      "terminated owner has no terminated_at: cannot apply the margin")
        return _orphan_unless_recent(group, record, ctx, "owner_terminated")
    if status not in LIVE:
        return _v(VerdictKind.SKIPPED, "unknown_status", f"owner status {status!r} is not known")
    return _classify_live(group, record, ctx)


def _classify_volume_owner(group: ResourceGroup, record: Record, ctx: ClassifyContext, status: str) -> Verdict:
    """A ``volumes`` row's group (README, C1), past the rules every owner shares (a gone or
    soft-deleted row, a pending one): the same rules as an instance's, the volume as the
    group's primary (``listing_rules.volume_groups``)."""
    if status == _DELETING:
        return _v(VerdictKind.SKIPPED, "owner_deleting")
    if status == _DELETED:  # deleted_at is None here: a soft delete went above
        return _v(VerdictKind.SKIPPED, "deleted_at_missing",
                  "deleted volume owner has no deleted_at: cannot apply the margin")
    if status not in VOLUME_LIVE:
        return _v(VerdictKind.SKIPPED, "unknown_status", f"owner status {status!r} is not known")
    return _classify_live(group, record, ctx)


def _classify_live(group: ResourceGroup, record: Record, ctx: ClassifyContext) -> Verdict:
    volume = record.owner_type == "volume"
    if volume and group.primary_id is not None and (group.primary is None
                                                    or group.primary.kind not in VOLUME_KINDS):
        # (a volume owner's ref on an instance: no group a volume owner's listing makes)
        return _v(VerdictKind.SKIPPED, "malformed_group",
                  f"listed group {group.key} is malformed: its primary is not a volume of the volume owner")
    if record.backend_id is None or record.primary_id is None:
        return _v(VerdictKind.IGNORED, "no_provisioning_data",
                  "live owner has no provisioning data (backend_id, primary_id)")
    # Ownership is by provider account, not by backend id (SAFETY.md rule 10).
    if record.backend_id == ctx.backend_id or record.owner_backend_scope == ctx.scope:
        same_account = True
    elif record.owner_backend_scope is None:
        return _v(VerdictKind.SKIPPED, "unknown_owner_backend",
                  f"live owner names backend {record.backend_id!r}, which is not a known backend")
    else:
        same_account = False
        if record.primary_id == group.primary_id:
            return _v(VerdictKind.SKIPPED, "owner_backend_conflict",
                      f"owner records this VM but names backend {record.backend_id!r} of another account")
    if group.primary_id is None:
        known = record.known_orphan_resource_ids
        if group.resources and all(r.id in known for r in group.resources):
            return _orphan_unless_recent(group, record, ctx, "leftover_of_orphan")
        return _v(VerdictKind.PROTECTED, "unattached_of_live_owner")
    if record.primary_id == group.primary_id:
        return _TRACKED
    listed = ctx.listed is not None and (
        ctx.listed.has_volume(group.provider_ref, group.region, record.primary_id) if volume
        else ctx.listed.has(group.provider_ref, group.region, record.primary_id))
    if same_account and not listed:
        # A mangled id, a name instead of an id, a primary in a region this listing does
        # not cover: this VM (or volume) may be the owner's only one (SAFETY.md rule 17).
        return _v(VerdictKind.SKIPPED, "primary_not_listed",
                  "live owner's recorded primary is not listed beside this VM of its ref")
    # Another primary with this ref: a leaked attempt (a retry's first VM) was
    # created before the owner's provisioning; a copy ("launch more like this")
    # was created after it.
    primary = group.primary
    if primary is None or primary.created_at is None or record.provisioned_at is None:
        return _v(VerdictKind.PROTECTED, "suspected_copy")
    if primary.created_at > record.provisioned_at + ctx.margin:
        return _v(VerdictKind.PROTECTED, "suspected_copy")
    return _orphan_unless_recent(group, record, ctx, "primary_mismatch" if same_account else "backend_mismatch")


def _orphan_unless_recent(group: ResourceGroup, record: Record, ctx: ClassifyContext,
                          reason: str) -> Verdict:
    """Rule 14, STEP 5, then the protect tag: an orphan candidate that another
    controller would re-create, or that the provider protects, is protected; one
    whose owner changed (or whose resources appeared) within the margin of the
    listing is skipped."""
    match protection_of(group, record, recheck=ctx.recheck_protections):
        case None:
            pass
        case "managed_by_controller":
            return _v(VerdictKind.PROTECTED, "managed_by_controller")
        case "deletion_protection":
            return _v(VerdictKind.PROTECTED, "deletion_protection")
        case _:
            return _v(VerdictKind.PROTECTED, "termination_protection")
    horizon = ctx.listed_at - ctx.margin
    owner_times = (record.issued_at, record.created_at, record.provisioned_at,
                   record.terminated_at, record.deleted_at)
    if any(t is not None and t >= horizon for t in owner_times):
        return _v(VerdictKind.SKIPPED, "recent_owner_change")
    if any(r.created_at is not None and r.created_at >= horizon for r in group.resources):
        return _v(VerdictKind.SKIPPED, "recent_resource")
    keys = ctx.protect_keys
    if any(not keys.isdisjoint(r.tags) for r in group.resources):
        return _v(VerdictKind.PROTECTED, "protect_tag")
    problem = malformed(group, ctx.tag_key, ctx.scope.partition(":")[0], record.owner_type)
    if problem is not None:
        return _v(VerdictKind.SKIPPED, "malformed_group", f"listed group {group.key} is malformed: {problem}")
    primary = group.primary
    if primary is not None and primary.kind in VOLUME_KINDS and attached_user(primary) is not None:
        # A volume an instance holds is never deleted from under it (SAFETY.md rule 21): the
        # deleter would refuse it too; skipped (unsettled) until it is detached.
        return _v(VerdictKind.SKIPPED, "in_use")
    return _v(VerdictKind.ORPHAN, reason)


def protection_of(group: ResourceGroup, record: Record, *, recheck: bool = False) -> str | None:
    """SAFETY.md rule 14 for an orphan candidate: ``managed_by_controller`` when a
    resource names a controller (an ASG, fleet or managed instance group would
    replace it: deleting it fights that controller), else the provider protection a
    resource carries (seen by the listing) or an earlier delete found on its primary
    (``record.protected_primaries``: AWS termination protection, which no listing
    shows), else None. Checked before the margin: a controller's churn of fresh
    instances is reported, never left skipped (unsettled) cycle after cycle. With
    ``recheck`` (a delete cycle) a remembered protection is not trusted: the group goes
    to the deleter, whose re-read (read-only) finds it again or finds it lifted.

    Tracked, ignored and ledger-skipped groups never reach this: they are never
    deleted anyway, and a platform that launches through its own ASG keeps its
    tracked VMs tracked."""
    if any(r.controller is not None for r in group.resources):
        return "managed_by_controller"
    for r in group.resources:
        if r.protection is not None:
            return r.protection
    if not recheck and group.primary_id is not None and group.primary_id in record.protected_primaries:
        return record.protected_primaries[group.primary_id]
    return None


def malformed(group: ResourceGroup, tag_key: str, provider: str | None = None,
              owner_type: str = "instance") -> str | None:
    """Why a listed group could not have come from an adapter (of ``provider``), or None. A
    group about to become an orphan must be one: fail closed (SAFETY.md rule 1). Its primary
    is an instance of the group, or for a ``volume`` owner a volume or disk that is the
    group's only resource (``listing_rules.volume_groups``).
    (Regions are not compared: a GCP instance's group holds its regional address.)"""
    if not group.resources:
        return "no resources"
    kinds = PROVIDER_KINDS.get(provider or "")
    if kinds is not None and (odd := sorted({r.kind.value for r in group.resources if r.kind not in kinds})):
        return f"{', '.join(odd)}: no kind a {provider} listing produces"
    ids = group.resource_ids()
    if len(set(ids)) != len(ids):
        return "duplicate resource ids"
    if any(r.tags.get(tag_key) != group.provider_ref for r in group.resources):
        return f"a resource does not carry {tag_key}={group.provider_ref}"
    if owner_type == "volume" and group.primary_id is not None:
        primary = group.primary
        if primary is None or primary.kind not in VOLUME_KINDS or len(group.resources) != 1:
            return f"primary {group.primary_id} is not the volume owner's volume, alone in its group"
        return None
    if group.primary_id is not None and (group.primary is None or group.primary.kind is not ResourceKind.INSTANCE):
        return f"primary {group.primary_id} is not an instance of the group"
    return None


# ---- verdict -> action (STEP 6) -------------------------------------------------

#: Verdicts whose groups are written to cycle_groups even when record_all is off.
RECORDED = frozenset({VerdictKind.ORPHAN, VerdictKind.PROTECTED, VerdictKind.SKIPPED})


def verdict_action(kind: VerdictKind, mode: str) -> Action:
    """What a cycle does with a group on classifying it: an orphan is reported in
    report mode (a delete cycle deletes it later), a protected group always."""
    if kind is VerdictKind.ORPHAN:
        return Action.REPORTED if mode != "delete" else Action.NONE
    return Action.REPORTED if kind is VerdictKind.PROTECTED else Action.NONE


# ---- STEP 1 -----------------------------------------------------------------

def may_have_new_orphans(*, clean_at: datetime | None, clean_mode: str | None, mode: str,
                         activity_since_clean: bool) -> tuple[bool, str]:
    """Whether a scheduled run must list: never cleaned, mode changed, or ledger
    activity since ``clean_at``. Returns (decision, reason)."""
    if clean_at is None:
        return True, "never_cleaned"
    if clean_mode != mode:
        return True, "mode_changed"
    if activity_since_clean:
        return True, "activity"
    return False, "no_activity"


def due_tolerance(limits: Limits) -> timedelta:
    """A schedule firing every interval lands a little before ``next_due_at``
    (which counts from the end of the last cycle): accept that much early.
    A backoff after a failure is waited out exactly."""
    return timedelta(seconds=min(60, limits.interval_seconds // 10))


def not_due(next_due: datetime | None, retry_delay_seconds: int, limits: Limits, now: datetime) -> bool:
    """At most once per interval; a failed backend waits out its backoff."""
    tolerance = timedelta(0) if retry_delay_seconds else due_tolerance(limits)
    return next_due is not None and next_due > now + tolerance


# ---- STEP 7 -----------------------------------------------------------------

@dataclass(frozen=True)
class CycleFacts:
    listing_failed: bool = False
    region_failures: int = 0
    skipped: bool = False
    deleting: bool = False
    delete_failed: bool = False
    tripped_regions: int = 0


def outcome(f: CycleFacts) -> Outcome:
    """Failed: the listing raised or a deletion failed. Unsettled: a region failed,
    a group was skipped, a deletion is still in progress. Otherwise clean."""
    if f.listing_failed or f.delete_failed:
        return Outcome.FAILED
    if f.region_failures or f.skipped or f.deleting or f.tripped_regions:
        return Outcome.UNSETTLED
    return Outcome.CLEAN


@dataclass(frozen=True)
class Schedule:
    clean_at: datetime | None
    next_due_at: datetime
    retry_delay_seconds: int


def next_schedule(result: Outcome, *, now: datetime, listed_at: datetime | None,
                  clean_at: datetime | None, retry_delay_seconds: int, interval_seconds: int,
                  margin_seconds: int, max_backoff_seconds: int,
                  rng: random.Random | None = None) -> Schedule:
    """STEP 7: clean moves ``clean_at`` to listing time minus the margin (never
    backwards); unsettled keeps it and retries after the interval; failed keeps
    it and backs off exponentially (capped, with ±20% jitter)."""
    if result is Outcome.CLEAN and listed_at is not None:
        candidate = listed_at - timedelta(seconds=margin_seconds)
        new_clean = candidate if clean_at is None or candidate > clean_at else clean_at
        return Schedule(new_clean, now + timedelta(seconds=interval_seconds), 0)
    if result is not Outcome.FAILED:
        return Schedule(clean_at, now + timedelta(seconds=interval_seconds), 0)
    delay = backoff_delay(retry_delay_seconds, interval_seconds, max_backoff_seconds)
    jitter = (rng or random).uniform(0.8, 1.2)
    return Schedule(clean_at, now + timedelta(seconds=min(max_backoff_seconds, delay * jitter)), delay)


def backoff_delay(previous: int, interval_seconds: int, max_backoff_seconds: int) -> int:
    base = max(1, min(interval_seconds, 60))
    return min(max_backoff_seconds, base if previous <= 0 else previous * 2)


# ---- blast radius (SAFETY.md rule 8) ---------------------------------------

def blast_radius_violation(to_delete: int, listed_groups: int, *, max_deletes: int,
                           max_share: float) -> BlastRadiusExceeded | None:
    """Why a cycle must delete nothing, or ``None``. The share applies only when
    more than 10 groups would be deleted."""
    if to_delete > max_deletes:
        return BlastRadiusExceeded(limit_name="max_deletes", limit=max_deletes, to_delete=to_delete,
                                   listed=listed_groups)
    if to_delete > 10 and listed_groups > 0 and to_delete / listed_groups > max_share:
        return BlastRadiusExceeded(limit_name="max_delete_share", limit=max_share, to_delete=to_delete,
                                   listed=listed_groups)
    return None
