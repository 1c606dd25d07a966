"""A cycle's state as the pipeline drives it: each function opens one of the
store's units of work, reads its facts, asks ``classify`` for the decision
(STEP 1, due selection, the blast-radius cap, STEP 7; ``delete_rules`` for deletions) and
hands it back to the same unit, inside the same fenced transaction.

``now=None`` everywhere means the database clock, read by the store (SAFETY.md
rule 13); only tests and the simulation pass a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from orphan_cleanup.core import classify, delete_rules
from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, Backend, Mode, account_view, cycle_snapshot
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.errors import BlastRadiusExceeded, ConfigError, LeaseLost
from orphan_cleanup.core.listing import RegionFailure, ResourceGroup
from orphan_cleanup.core.owners import Keep
from orphan_cleanup.core.verdicts import DeleteOutcome, DeleteResult, Outcome
from orphan_cleanup.ledger.locked import GateHold, Leases, LockedCycle
from orphan_cleanup.ledger.records import Cycle, CycleRef, DeleteRequestRow, IdleSnapshot
from orphan_cleanup.ledger.session import LedgerSession
from orphan_cleanup.ledger.store import LedgerStore


@dataclass(frozen=True)
class StartResult:
    cycle: CycleRef | None
    reason: str  # started: never_cleaned|mode_changed|activity|manual; else: no_activity|not_due|busy
    # The backend as the started cycle works on it: its snapshot (SAFETY.md rules 16, 18).
    backend: Backend | None = None
    # Its region baselines (``LeaseUnit.baselines``), read with the lease.
    baselines: dict[str, tuple[int | None, int | None]] | None = None
    error: str | None = None  # why it was refused (``StartRefusal``), or its row is unknown


@dataclass(frozen=True)
class StartRefusal:
    """Why a backend's row, read under its lease, must not start a cycle now."""

    reason: str
    error: str | None = None


#: A backend's row as it is under its lease -> the mode and limits of the cycle it would start,
#: or why it must not start.
Plan = Callable[[Backend], "tuple[Mode, Limits] | StartRefusal"]


@dataclass(frozen=True)
class DispatchResult:
    groups: list[ResourceGroup]
    blocked: BlastRadiusExceeded | None
    outcome: Outcome | None  # set when the cycle finished in this call


@dataclass(frozen=True)
class DeleteDecision:
    """Why a delete request must not run now (None: it may), and the group as
    the cycle recorded it, when there is one to record a result against."""

    refusal: DeleteOutcome | None
    group: ResourceGroup | None
    listed_primary: str | None = None  # see ``DeleteRequestRow``
    keep: Keep | None = None  # with ``protected``: the operator's keep that wins (SAFETY.md rule 23)


# ---- STEP 1 and the lease ---------------------------------------------------------

def scheduled_step1(seen: IdleSnapshot, mode: str, limits: Limits, now: datetime) -> tuple[bool, str]:
    """STEP 1 and due selection for a scheduled run of a backend holding no lease,
    from an unlocked snapshot: (list now?, why). The locked ``start_cycle`` applies
    the same rules again before a cycle starts."""
    if classify.not_due(seen.next_due_at, seen.retry_delay_seconds, limits, now):
        return False, "not_due"
    return classify.may_have_new_orphans(clean_at=seen.clean_at, clean_mode=seen.clean_mode, mode=mode,
                                         activity_since_clean=seen.activity_since_clean)


def quick_skip(session: LedgerSession, backend_id: str, seen: IdleSnapshot | None, mode: str, limits: Limits,
               now: datetime | None = None) -> str | None:
    """The idle path of a scheduled run, without a transaction or lock: from ``seen``
    (``LedgerSession.backend_and_idle``, one read) and, when there is nothing to do, one
    conditional write marking the row processed. Returns why the run is skipped, or None
    when the locked ``start_cycle`` must decide. It applies the same rules as ``start_cycle``."""
    if seen is None or seen.leased:
        return None
    now = now or seen.now
    go, reason = scheduled_step1(seen, mode, limits, now)
    if go or reason == "not_due":
        return None if go else reason
    marked = session.mark_idle(backend_id, now=now, next_due=now + timedelta(seconds=limits.interval_seconds),
                               seen=seen, mode=mode)
    return reason if marked else None


def start_cycles(store: LedgerStore, backend_ids: Sequence[str], *, manual: bool, plan: Plan,
                 stack_protect_key: str = DEFAULT_PROTECT_KEY, now: datetime | None = None) -> dict[str, StartResult]:
    """STEP 1 and the lease of each backend, in one transaction (``LedgerStore.leases``: its
    statements do not grow with the number of backends). For each: ``plan`` of its row as
    it is now (refused: nothing written); a live lease makes this a no-op ("busy"), an
    expired one fails its cycle first; a scheduled run with no reason to list only marks the
    row processed. Otherwise bumps the fence and creates the cycle, with the backend as it
    is now and the keys of its whole account (SAFETY.md rules 16, 18)."""
    with store.leases(backend_ids, now) as leases:
        return {b: _start(leases, b, manual, plan, stack_protect_key) for b in dict.fromkeys(backend_ids)}


def _start(leases: Leases, backend_id: str, manual: bool, plan: Plan, stack_protect_key: str) -> StartResult:
    try:
        lease = leases.unit(backend_id)
        row, account = lease.account_rows()
    except ConfigError as e:  # e.g. the backend row was removed since it was read
        return StartResult(None, "unknown_backend", error=str(e))
    planned = plan(row)
    if isinstance(planned, StartRefusal):
        return StartResult(None, planned.reason, error=planned.error)
    mode, limits = planned
    state, now = lease.state, lease.now
    if state.lease_owner is not None:
        if state.lease_expires_at is not None and state.lease_expires_at > now:
            return StartResult(None, "busy")
        lease.expire(classify.backoff_delay(state.retry_delay_seconds, limits.interval_seconds,
                                            limits.max_backoff_seconds))
    elif not manual and classify.not_due(state.next_due_at, state.retry_delay_seconds, limits, now):
        return StartResult(None, "not_due")
    reason = "manual"
    if not manual:
        go, reason = classify.may_have_new_orphans(
            clean_at=state.clean_at, clean_mode=state.clean_mode, mode=mode,
            activity_since_clean=lease.activity_since_clean())
        if not go:
            lease.mark_processed(now + timedelta(seconds=limits.interval_seconds))
            return StartResult(None, reason)
    backend = account_view(row, account, stack_protect_key)
    ref = lease.start(mode, now + timedelta(seconds=limits.cycle_deadline_seconds), manual=manual,
                      snapshot=cycle_snapshot(backend))
    return StartResult(ref, reason, backend, lease.baselines())


def start_cycle(store: LedgerStore, backend_id: str, mode: Mode, limits: Limits, *, manual: bool,
                stack_protect_key: str = DEFAULT_PROTECT_KEY, now: datetime | None = None,
                mode_of: Callable[[Backend], Mode] | None = None) -> StartResult:
    """``start_cycles`` of one backend in ``mode`` with ``limits``; ``mode_of``: the mode its
    row gives now, which must still be ``mode`` ("backend_changed" otherwise: next run)."""
    def plan(row: Backend) -> tuple[Mode, Limits] | StartRefusal:
        if mode_of is not None and mode_of(row) != mode:
            return StartRefusal("backend_changed")
        return mode, limits

    return start_cycles(store, [backend_id], manual=manual, plan=plan, stack_protect_key=stack_protect_key,
                        now=now)[backend_id]


def renew_lease(store: LedgerStore, cycle_id: str, seconds: int, *, gate: GateHold | None = None,
                now: datetime | None = None) -> bool:
    """A running cycle's heartbeat: its lease now ends ``seconds`` from now, and the
    delete gate it holds (``gate``) is renewed with it. Fenced: False, and nothing
    written, once the cycle lost its lease or finished."""
    try:
        with store.cycle(cycle_id, now) as cyc:
            cyc.extend_lease(seconds, gate)
            return True
    except LeaseLost:
        return False


def record_region_groups(store: LedgerStore, counts: dict[str, dict[str, int]], backends: dict[str, str]) -> set[str]:
    """Store each cycle's believed per-region group counts (before its last batch goes
    out, so a clean finish sees them), in one statement. Returns the cycles recorded:
    a fenced one is not (SAFETY.md rule 6). ``backends``: cycle id -> backend id."""
    with store.session() as session:
        return session.record_region_groups(counts, backends)


def stamp_listed_at(store: LedgerStore, backends: dict[str, str], now: datetime | None = None) -> dict[str, datetime]:
    """Stamp the listing time of the live cycles of one listing (cycle id -> backend id) right
    before its first provider call, in one statement: the cycles still live, with their time."""
    with store.session() as session:
        return session.stamp_listed_at(backends, now)


def set_listed_at(store: LedgerStore, cycle_id: str, listed_at: datetime | None = None) -> datetime:
    """Stamp the cycle's listing time (the database clock unless given) right
    before the first provider call, and return it. ``LeaseLost`` if fenced."""
    with store.cycle(cycle_id) as cyc:
        return cyc.stamp_listed_at(listed_at)


# ---- STEP 7 ----------------------------------------------------------------------------

def facts(c: Cycle) -> classify.CycleFacts:
    return classify.CycleFacts(listing_failed=c.failed, region_failures=len(c.failures), skipped=c.unsettled,
                               tripped_regions=len(c.tripped_regions))


def finish(cyc: LockedCycle, limits: Limits) -> Outcome:
    """STEP 7, exactly once, inside the unit's fenced transaction."""
    result = classify.outcome(facts(cyc.state))
    clean_at, retry_delay = cyc.schedule_inputs()
    sched = classify.next_schedule(
        result, now=cyc.now, listed_at=cyc.state.listed_at, clean_at=clean_at, retry_delay_seconds=retry_delay,
        interval_seconds=limits.interval_seconds, margin_seconds=limits.margin_seconds,
        max_backoff_seconds=limits.max_backoff_seconds)
    cyc.finish(result, clean_at=sched.clean_at, next_due_at=sched.next_due_at,
               retry_delay_seconds=sched.retry_delay_seconds)
    return result


def fail_cycle(store: LedgerStore, cycle_id: str, error: str, limits: Limits, now: datetime | None = None,
               failures: list[RegionFailure] | None = None) -> Outcome | None:
    """The listing (or the identity check before it) failed: the cycle fails now
    (STEP 7 failed), with ``failures`` recorded when given. ``None`` if it was fenced."""
    try:
        with store.cycle(cycle_id, now) as cyc:
            cyc.fail(error, failures)
            return finish(cyc, limits)
    except LeaseLost:
        return None


def finish_if_complete(store: LedgerStore, cycle_id: str, limits: Limits,
                       now: datetime | None = None) -> Outcome | None:
    """Finish a cycle whose batches (and deletions) are all in. Fenced; at most once.
    Two statements when nothing moves meanwhile: the rows read without a lock, and the
    finish guarded by their versions; if they moved, decided again under the locks."""
    try:
        with store.cycle_read(cycle_id, now) as cyc:
            if not cyc.state.complete:
                return None
            result = finish(cyc, limits)
        if cyc.finished is not None:
            return result
        with store.cycle(cycle_id, now) as cyc:
            return finish(cyc, limits) if cyc.state.complete else None
    except LeaseLost:
        return None


# ---- deletions -------------------------------------------------------------------------

def confirm_gap_seconds(limits: Limits) -> int:
    """The longest time between two listings that confirm each other's orphan (SAFETY.md rule
    23): the window and two intervals (a cycle that ran late, or once on a backoff's retry)."""
    return limits.confirm_seconds + 2 * limits.interval_seconds


def dispatch_deletes(store: LedgerStore, cycle_id: str, limits: Limits,
                     now: datetime | None = None) -> DispatchResult:
    """Once every batch is in: mark, then sweep (SAFETY.md rule 23: only the orphan groups an
    earlier listing found so, the confirmation window ago, are due; the others are marked and
    the cycle stays unsettled), apply the blast-radius cap to the groups due and register one
    delete request per group due (or none, with the reason).
    Finishes the cycle when there is nothing to delete. Idempotent: once dispatched, the
    groups whose requests are still queued come back, to be published again (a
    redelivered last batch whose first delivery failed to publish: SAFETY.md rule 20)."""
    with store.cycle(cycle_id, now) as cyc:
        if not cyc.state.listing_done:
            return DispatchResult([], None, None)
        if cyc.state.dispatched:
            return DispatchResult(cyc.queued_groups(), None, None)
        groups = cyc.sweep(limits.confirm_seconds, confirm_gap_seconds(limits)).due
        blocked = classify.blast_radius_violation(len(groups), cyc.state.groups_listed,
                                                  max_deletes=limits.max_deletes, max_share=limits.max_delete_share)
        if blocked is not None:
            cyc.block_deletes(blocked)
            return DispatchResult([], blocked, finish(cyc, limits))
        if groups:
            cyc.queue_deletes(groups)
            return DispatchResult(groups, None, None)
        cyc.mark_dispatched()
        return DispatchResult([], None, finish(cyc, limits))


def delete_allowed(store: LedgerStore, cycle_id: str, requested: ResourceGroup) -> DeleteDecision:
    """Whether a delete request may run now (``LeaseLost`` if the cycle is fenced).
    The resources to delete come from the cycle's row, never from the message. A read
    without a lock: a lock held for it would be released before the provider's call
    anyway; what is recorded after the call is fenced again (``record_delete``)."""
    with store.cycle_read(cycle_id) as cyc:
        row = cyc.delete_request(requested.key) if cyc.state.mode == "delete" else DeleteRequestRow(None, None)
        why = delete_rules.delete_refusal(mode=cyc.state.mode, request_state=row.state, recorded=row.group,
                                          requested=requested, tripped_regions=cyc.state.tripped_regions,
                                          kept=row.keep is not None)
    keeps_group = why in (None, DeleteOutcome.ALREADY_DONE, DeleteOutcome.REGION_TRIPPED, DeleteOutcome.PROTECTED)
    return DeleteDecision(why, row.group if keeps_group else None, row.listed_primary if keeps_group else None,
                          row.keep if why is DeleteOutcome.PROTECTED else None)


def record_delete(store: LedgerStore, cycle_id: str, group: ResourceGroup, limits: Limits, *,
                  result: DeleteResult | None = None, error: str | None = None, trip_region: bool = False,
                  skipped_reason: str | None = None, now: datetime | None = None) -> Outcome | None:
    """Record one deletion's end (fenced, once per (cycle, group)); finishes the
    cycle when it was the last open piece. Returns the outcome if it finished."""
    rec = delete_rules.delete_record(group, result=result, error=error, trip_region=trip_region,
                                     skipped_reason=skipped_reason)
    with store.cycle(cycle_id, now) as cyc:
        if cyc.record_delete(group, rec) and cyc.state.complete:
            return finish(cyc, limits)
    return None
