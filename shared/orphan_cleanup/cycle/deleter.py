"""The deleter step, read like a reconcile: a delete request goes through an ordered list
of guards, each of which may end it with its named outcome (``DeleteOutcome``): the cycle
asked for it, the backend is still on and still reaches the same account, the provider's
identity checks out. Then the ref's gate, and under it the guards that must hold right
before acting (still asked for, still an orphan), and the provider's delete. Every end
that concerns the group its cycle recorded is recorded (``cycle_state.record_delete``),
under the gate when it was taken."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from orphan_cleanup.core import classify, delete_rules, policy
from orphan_cleanup.core.backends import Backend, account_view, deletes_reach
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.errors import (
    IdentityMismatch,
    LeaseLost,
    MessageRefused,
    OrphanCleanupError,
    ProviderError,
    ProviderUnavailable,
)
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.messages import DeleteRequest
from orphan_cleanup.core.owners import Record
from orphan_cleanup.core.verdicts import DeleteOutcome, DeleteResult, VerdictKind
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.cycle_state import DeleteDecision
from orphan_cleanup.cycle.step_context import StepContext
from orphan_cleanup.ledger.journal import LedgerJournal
from orphan_cleanup.ledger.records import CycleContext
from orphan_cleanup.providers.base import ResourceProvider, describe_error

log = logging.getLogger("orphan_cleanup")


#: How far the provider's creation time of a resource may be from its listing's (the same
#: field, read again; a rounding, never a forgery's hours).
_SAME_TIME = timedelta(seconds=1)


class GateBusy(OrphanCleanupError):
    """Another delete of the same ref holds the gate: retry the message later."""


def identity_failure(exc: ProviderError) -> str:
    """The one-line reason an identity check failed, for ``failures`` (region ``*``)."""
    return str(exc) if isinstance(exc, IdentityMismatch) else f"identity_check_failed: {describe_error(exc)}"


@dataclass(frozen=True)
class Stop:
    """A guard's answer that the request ends here, with ``outcome``. ``recorded``: the end
    is recorded against the group its cycle recorded (if there is one), with these fields
    (``cycle_state.record_delete``); otherwise nothing is written."""

    outcome: DeleteOutcome
    recorded: bool = False
    error: str | None = None
    skipped_reason: str | None = None
    trip_region: bool = False
    result: DeleteResult | None = None

    @classmethod
    def left_in_place(cls, outcome: DeleteOutcome) -> Stop:
        """The group stays, skipped for ``outcome`` (a tripped region stays tripped)."""
        return cls(outcome, recorded=True, skipped_reason=outcome.value,
                   trip_region=outcome is DeleteOutcome.REGION_TRIPPED)

    @classmethod
    def refused(cls, decision: DeleteDecision) -> Stop:
        """The cycle's answer refuses the request: an operator's keep (SAFETY.md rule 23) is
        recorded as the protection it is; any other refusal records nothing."""
        assert decision.refusal is not None
        if decision.keep is not None:
            return cls(DeleteOutcome.PROTECTED, recorded=True, result=delete_rules.kept_result(decision.keep))
        return cls(decision.refusal)

    @classmethod
    def provider_failed(cls, exc: ProviderError) -> Stop:
        """A provider call failed: an unavailable region trips (SAFETY.md rule 5), anything
        else fails the deletion."""
        if isinstance(exc, ProviderUnavailable):
            return cls(DeleteOutcome.REGION_TRIPPED, recorded=True, error=describe_error(exc), trip_region=True)
        return cls(DeleteOutcome.FAILED, recorded=True, error=describe_error(exc))


@dataclass
class DeleteJob:
    """One delete request on its way through the guards: what they read, as they read it."""

    request: DeleteRequest
    cycle: CycleContext
    listed_at: datetime  # the cycle's
    # The cycle's backend as the cycle took it (rule 18), with the keys of its account as they
    # are now as well as when the lease was taken (the safe direction, rule 16).
    backend: Backend
    limits: Limits
    decision: DeleteDecision = DeleteDecision(None, None)  # the cycle's answer (``_asked_for``)
    provider: ResourceProvider | None = None  # the delete role's adapter (``_identity_verified``)
    record: Record | None = None  # the ledger's record of the group's ref, read under the gate

    @property
    def group(self) -> ResourceGroup:
        """The group as its cycle recorded it (every request past ``_has_group`` has one)."""
        assert self.decision.group is not None
        return self.decision.group

    @property
    def verified_provider(self) -> ResourceProvider:
        assert self.provider is not None
        return self.provider


Guard = Callable[[DeleteJob], Stop | None]


@dataclass
class Deleter:
    ctx: StepContext

    def handle_delete(self, request: DeleteRequest, holder: str | None = None) -> DeleteOutcome:
        """Refuse, verify, gate, re-check, delete, record: the outcome names the guard that
        ended the request, or what the provider's delete did. Raises ``GateBusy`` when the
        ref's gate is held (the message should be redelivered later).

        The message only names a group (SAFETY.md rule 12): the backend is the
        cycle's, as the cycle took it (rule 18), and the resources deleted are those the
        cycle recorded for that group as an orphan; a request that disagrees raises
        ``MessageRefused``. Every provider mutation is journaled (rule 19)."""
        job = self._read(request)
        if isinstance(job, DeleteOutcome):
            return job
        stop = _first_stop(job, (self._asked_for, self._backend_on, self._reach_unchanged, self._has_group,
                                 self._identity_verified))
        if stop is not None:
            return self._end(job, stop)
        # One holder per delivery: a redelivered request (an SQS duplicate, or a visibility
        # timeout while this call is still running) must wait for the gate, not share it.
        holder = holder or f"{job.cycle.id}:{job.group.key}:{uuid.uuid4().hex[:12]}"
        scope, ref = job.backend.scope, job.group.provider_ref
        if not self.ctx.store.acquire_gate(scope, ref, holder, delete_rules.gate_ttl(job.limits)):
            raise GateBusy(f"delete gate of {ref} is held")
        try:  # the gate holds the re-checks, the provider's delete and its record
            return self._end(job, _first_stop(job, (self._still_asked_for, self._still_an_orphan))
                             or self._delete(job))
        finally:
            self.ctx.store.release_gate(scope, ref, holder)

    def _read(self, request: DeleteRequest) -> DeleteJob | DeleteOutcome:
        """The request's cycle and backend, from the ledger: ``cycle_unknown`` without a
        cycle that listed; ``MessageRefused`` when the request names another backend."""
        with self.ctx.store.session() as session:
            cycle = session.cycle_context(request.cycle_id, account=True)
            if cycle is None or cycle.listed_at is None:
                return DeleteOutcome.CYCLE_UNKNOWN
            if request.backend != cycle.backend_id:
                self.ctx.reporter.error("delete request refused: another backend than its cycle's",
                                        backend=cycle.backend_id, cycle_id=cycle.id, group=request.group.key)
                raise MessageRefused(f"delete request for {request.group.key} names backend {request.backend!r},"
                                     f" its cycle is of {cycle.backend_id!r}")
            backend = account_view(cycle.backend, cycle.account or [], self.ctx.settings.protect_tag_key)
        return DeleteJob(request, cycle, cycle.listed_at, backend, self.ctx.limits(backend))

    # ---- the guards, in order: each ends the request (a ``Stop``) or lets it go on (None) ----

    def _asked_for(self, job: DeleteJob) -> Stop | None:
        """Its cycle asked for it, against the group as the cycle recorded it (rule 12): a
        delete cycle dispatched exactly these resources and nobody handled the request yet.
        In a region that tripped (rule 5) the group is left in place."""
        try:
            job.decision = cycle_state.delete_allowed(self.ctx.store, job.cycle.id, job.request.group)
        except LeaseLost:
            return Stop(DeleteOutcome.FENCED)
        why = job.decision.refusal
        if why is DeleteOutcome.GROUP_MISMATCH:
            self.ctx.reporter.error("delete request refused: its resources differ from the classified group",
                                    backend=job.backend.id, cycle_id=job.cycle.id, group=job.request.group.key)
        if why is DeleteOutcome.REGION_TRIPPED:
            return Stop.left_in_place(why)
        return None if why is None else Stop.refused(job.decision)

    def _backend_on(self, job: DeleteJob) -> Stop | None:
        """The backend was not switched off since the cycle started: off is final."""
        row = job.backend.model_copy(update={"mode": job.cycle.row_mode})
        off = policy.effective_mode(self.ctx.settings, row) == "off"
        return Stop.left_in_place(DeleteOutcome.BACKEND_OFF) if off else None

    def _reach_unchanged(self, job: DeleteJob) -> Stop | None:
        """The row's account, roles and key are those of the lease (SAFETY.md rule 18): the
        cycle neither follows an edit nor deletes against it; the next cycle lists anew."""
        cycle = job.cycle
        if cycle.row is None or deletes_reach(cycle.row) != deletes_reach(cycle.backend):
            return Stop.left_in_place(DeleteOutcome.BACKEND_CHANGED)
        return None

    def _has_group(self, job: DeleteJob) -> Stop | None:
        return Stop(DeleteOutcome.NOT_DISPATCHED) if job.decision.group is None else None

    def _identity_verified(self, job: DeleteJob) -> Stop | None:
        """The provider answers as the backend's account (SAFETY.md rule 11), before anything
        is deleted, with the delete role when the backend has one (the listing role may only
        describe)."""
        job.provider = self.ctx.provider_for(job.backend.for_deleting())
        try:
            job.provider.verify_identity()
        except ProviderError as exc:
            return Stop(DeleteOutcome.IDENTITY_FAILED, recorded=True, error=identity_failure(exc))
        return None

    # ---- under the gate --------------------------------------------------------------------

    def _still_asked_for(self, job: DeleteJob) -> Stop | None:
        """Still asked for: another delivery may have handled it while this one waited."""
        try:
            again = cycle_state.delete_allowed(self.ctx.store, job.cycle.id, job.request.group)
        except LeaseLost:
            return Stop(DeleteOutcome.FENCED)
        return None if again.refusal is None else Stop.refused(again)

    def _still_an_orphan(self, job: DeleteJob) -> Stop | None:
        """Still an orphan against the ledger as it is now (``_owner_changed``), judged on the
        creation times the provider reports (``_on_provider_time``) and, for a retry leak,
        beside a primary the provider confirms (rule 17); else left in place."""
        group, listed_primary = job.group, job.decision.listed_primary
        changed, job.record = self._owner_changed(job, group)
        if changed is None:
            try:
                changed, job.record = self._on_provider_time(job)
            except ProviderError as exc:  # read as the delete would have been
                return Stop.provider_failed(exc)
        if changed is None and job.record is not None and listed_primary is not None:
            provider = job.verified_provider
            # A volume owner's recorded primary is a volume (README, C1), an instance owner's a VM.
            holds = provider.holds_volume if job.record.owner_type == "volume" else provider.holds_instance
            if not holds(group.region, listed_primary, group.provider_ref):
                changed = "owner_changed:primary_not_listed"  # the provider does not confirm it (rule 17)
        return None if changed is None else Stop(DeleteOutcome.SKIPPED, recorded=True, skipped_reason=changed)

    def _delete(self, job: DeleteJob) -> Stop:
        """The provider's delete of the group, journaled (rule 19); its result is the outcome."""
        group, record, backend = job.group, job.record, job.backend
        journal = LedgerJournal(self.ctx.db, backend_id=backend.id, cycle_id=job.cycle.id, scope=backend.scope,
                                provider_ref=group.provider_ref, group_key=group.key)
        remembered = record.protected_primaries.get(group.primary_id or "") if record is not None else None
        try:
            result = job.verified_provider.delete_resource_group(
                group, journal, remembered_protection=remembered,
                known_attached=record.known_orphan_resource_ids if record is not None else ())
        except ProviderError as exc:
            return Stop.provider_failed(exc)
        if result.error is not None:  # failed after part of it went: recorded with what went
            tripped = result.region_unavailable
            return Stop(DeleteOutcome.REGION_TRIPPED if tripped else DeleteOutcome.FAILED, recorded=True,
                        result=result, error=result.error, trip_region=tripped)
        return Stop(DeleteOutcome(result.status.value), recorded=True, result=result)

    def _end(self, job: DeleteJob, stop: Stop) -> DeleteOutcome:
        """Record ``stop`` when it is to be recorded and the cycle recorded the group
        (fenced: a cycle that lost its lease records nothing); its outcome."""
        group = job.decision.group
        if stop.recorded and group is not None:
            try:
                cycle_state.record_delete(self.ctx.store, job.cycle.id, group, job.limits, result=stop.result,
                                          error=stop.error, trip_region=stop.trip_region,
                                          skipped_reason=stop.skipped_reason, now=self.ctx.now())
            except LeaseLost:
                log.warning("cycle %s lost its lease: delete result of %s not recorded", job.cycle.id, group.key)
        return stop.outcome

    def _owner_changed(self, job: DeleteJob, group: ResourceGroup) -> tuple[str | None, Record | None]:
        """STEP 3-5 again, under the gate, right before acting. The batch was classified
        a while ago (queue latency, redeliveries) and the owner may have moved on since:
        pending or terminating again, or provisioned with this primary. Only a group that
        is still an orphan against the current ledger is deleted; otherwise why not (and
        the record read). A retry leak is judged beside the primary its cycle listed with
        it (rule 17); a remembered protection goes to the provider's re-read (rule 14)."""
        record = self.ctx.store.load_records(job.backend.id, [group]).get(group.provider_ref)
        listed_primary = job.decision.listed_primary
        known = [(group.provider_ref, group.region, listed_primary)] if listed_primary else []
        ctx = policy.classify_context(self.ctx.settings, job.backend, job.listed_at, job.limits,
                                      recheck_protections=True, listed=ListedInstances(known=known))
        verdict = classify.classify(group, record, ctx)
        return (None if verdict.kind is VerdictKind.ORPHAN else f"owner_changed:{verdict.reason}"), record

    def _on_provider_time(self, job: DeleteJob) -> tuple[str | None, Record | None]:
        """``_owner_changed`` judged on the creation times the provider reports now for the
        group's resources, never the listing message's: the margin and the copy rule read
        them, and a forged batch could age a fresh resource past the margin or a user's copy
        into a retry leak (SAFETY.md rules 2, 12, 17 and 21). A VM the provider does not
        report, or reports created at another time, is not the VM that was listed: skipped.
        (A resource gone or unreadable keeps its listed time: the deletion's own read finds
        nothing of it to delete, or leaves it as unreadable.)"""
        group, primary, provider = job.group, job.group.primary, job.verified_provider
        times: dict[str, datetime | None] = {}
        if primary is not None:  # the VM first: another time means another VM, nothing more to read
            times = provider.created_times(group.model_copy(update={"resources": (primary,)}))
            if primary.id not in times or not _same_time(times[primary.id], primary.created_at):
                return "owner_changed:created_at_changed", None  # not the VM that was listed
        others = tuple(r for r in group.resources if r is not primary)
        if others:
            times |= provider.created_times(group.model_copy(update={"primary_id": None, "resources": others}))
        judged = group.model_copy(update={"resources": tuple(
            r.model_copy(update={"created_at": times[r.id]}) if r.id in times else r for r in group.resources)})
        return self._owner_changed(job, judged)


def _same_time(fresh: datetime | None, listed: datetime | None) -> bool:
    """The provider's time and the listing's are the same field read again (a rounding at most)."""
    if fresh is None or listed is None:
        return fresh is listed
    return abs(fresh - listed) <= _SAME_TIME


def _first_stop(job: DeleteJob, guards: Sequence[Guard]) -> Stop | None:
    """The first of ``guards`` (in order) that ends the request, or None: all let it go on."""
    for guard in guards:
        stop = guard(job)
        if stop is not None:
            return stop
    return None
