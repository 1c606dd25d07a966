"""The deleter step: refuse what the cycle did not ask for, verify the identity, take
the ref's gate, re-classify against the current ledger, delete, record."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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
from orphan_cleanup.core.verdicts import DeleteOutcome, VerdictKind
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.step_context import StepContext
from orphan_cleanup.ledger.journal import LedgerJournal
from orphan_cleanup.ledger.records import CycleContext
from orphan_cleanup.providers.base import ResourceProvider, describe_error

log = logging.getLogger("orphan_cleanup")


#: How far the provider's creation time of a VM may be from its listing's (the same field,
#: read again; a rounding, never a forgery's hours).
_SAME_TIME = timedelta(seconds=1)


class GateBusy(OrphanCleanupError):
    """Another delete of the same ref holds the gate: retry the message later."""


def identity_failure(exc: ProviderError) -> str:
    """The one-line reason an identity check failed, for ``failures`` (region ``*``)."""
    return str(exc) if isinstance(exc, IdentityMismatch) else f"identity_check_failed: {describe_error(exc)}"


@dataclass
class Deleter:
    ctx: StepContext

    def handle_delete(self, request: DeleteRequest, holder: str | None = None) -> DeleteOutcome:
        """Gate, delete, record. Raises ``GateBusy`` when the ref's gate is held
        (the message should be redelivered later).

        The message only names a group (SAFETY.md rule 12): the backend is the
        cycle's, as the cycle took it (rule 18), and the resources deleted are those the
        cycle recorded for that group as an orphan; a request that disagrees raises
        ``MessageRefused``. Every provider mutation is journaled (rule 19)."""
        with self.ctx.store.session() as session:
            cycle = session.cycle_context(request.cycle_id)
            if cycle is None or cycle.listed_at is None:
                return DeleteOutcome.CYCLE_UNKNOWN
            if request.backend != cycle.backend_id:
                self.ctx.reporter.error("delete request refused: another backend than its cycle's",
                                        backend=cycle.backend_id, cycle_id=cycle.id, group=request.group.key)
                raise MessageRefused(f"delete request for {request.group.key} names backend {request.backend!r},"
                                     f" its cycle is of {cycle.backend_id!r}")
            # The keys of the account now as well as when the lease was taken (the safe direction).
            backend = account_view(cycle.backend, session.account_settings(cycle.backend_id))
        limits = self.ctx.limits(backend)
        try:
            decision = cycle_state.delete_allowed(self.ctx.store, cycle.id, request.group)
        except LeaseLost:
            return DeleteOutcome.FENCED
        why_not, group = decision.refusal, decision.group
        if why_not is DeleteOutcome.GROUP_MISMATCH:
            self.ctx.reporter.error("delete request refused: its resources differ from the classified group",
                                    backend=backend.id, cycle_id=cycle.id, group=request.group.key)
        if why_not is None and policy.effective_mode(self.ctx.settings, backend.model_copy(
                update={"mode": cycle.row_mode})) == "off":
            why_not = DeleteOutcome.BACKEND_OFF  # switched off since the cycle started: off is final
        if why_not is None and (cycle.row is None or deletes_reach(cycle.row) != deletes_reach(cycle.backend)):
            # The row's account, roles or key changed since the lease (SAFETY.md rule 18): the
            # cycle neither follows the edit nor deletes against it; the next cycle lists anew.
            why_not = DeleteOutcome.BACKEND_CHANGED
        if why_not in (DeleteOutcome.REGION_TRIPPED, DeleteOutcome.BACKEND_OFF, DeleteOutcome.BACKEND_CHANGED) \
                and group is not None:
            self._record(cycle.id, group, limits, skipped_reason=why_not.value,
                         trip_region=why_not is DeleteOutcome.REGION_TRIPPED)
            return why_not
        if why_not is not None or group is None:
            return why_not or DeleteOutcome.NOT_DISPATCHED
        # The delete role when the backend has one (the listing role may only describe).
        provider = self.ctx.provider_for(backend.for_deleting())
        try:
            provider.verify_identity()  # SAFETY.md rule 11: before anything is deleted
        except ProviderError as exc:
            self._record(cycle.id, group, limits, error=identity_failure(exc))
            return DeleteOutcome.IDENTITY_FAILED
        # One holder per delivery: a redelivered request (an SQS duplicate, or a visibility
        # timeout while this call is still running) must wait for the gate, not share it.
        holder = holder or f"{cycle.id}:{group.key}:{uuid.uuid4().hex[:12]}"
        if not self.ctx.store.acquire_gate(backend.scope, group.provider_ref, holder, delete_rules.gate_ttl(limits)):
            raise GateBusy(f"delete gate of {group.provider_ref} is held")
        try:
            try:
                again = cycle_state.delete_allowed(self.ctx.store, cycle.id, request.group).refusal
            except LeaseLost:
                return DeleteOutcome.FENCED
            if again is not None:  # handled by another delivery while this one waited for the gate
                return again
            changed, record = self._owner_changed(cycle, group, backend, limits, decision.listed_primary)
            if changed is None and group.primary is not None:
                try:
                    changed, record = self._on_provider_time(provider, cycle, group, backend, limits,
                                                             decision.listed_primary)
                except ProviderUnavailable as exc:  # read as the delete would have been
                    self._record(cycle.id, group, limits, error=describe_error(exc), trip_region=True)
                    return DeleteOutcome.REGION_TRIPPED
                except ProviderError as exc:
                    self._record(cycle.id, group, limits, error=describe_error(exc))
                    return DeleteOutcome.FAILED
            if changed is None and record is not None and decision.listed_primary is not None \
                    and not provider.holds_instance(group.region, decision.listed_primary, group.provider_ref):
                changed = "owner_changed:primary_not_listed"  # the provider does not confirm it (rule 17)
            if changed is not None:
                self._record(cycle.id, group, limits, skipped_reason=changed)
                return DeleteOutcome.SKIPPED
            journal = LedgerJournal(self.ctx.db, backend_id=backend.id, cycle_id=cycle.id, scope=backend.scope,
                                    provider_ref=group.provider_ref, group_key=group.key)
            remembered = record.protected_primaries.get(group.primary_id or "") if record is not None else None
            try:
                result = provider.delete_resource_group(
                    group, journal, remembered_protection=remembered,
                    known_attached=record.known_orphan_resource_ids if record is not None else ())
            except ProviderUnavailable as exc:
                self._record(cycle.id, group, limits, error=describe_error(exc), trip_region=True)
                return DeleteOutcome.REGION_TRIPPED
            except ProviderError as exc:
                self._record(cycle.id, group, limits, error=describe_error(exc))
                return DeleteOutcome.FAILED
            self._record(cycle.id, group, limits, result=result)
            return DeleteOutcome(result.status.value)
        finally:
            self.ctx.store.release_gate(backend.scope, group.provider_ref, holder)

    def _owner_changed(self, cycle: CycleContext, group: ResourceGroup, backend: Backend, limits: Limits,
                       listed_primary: str | None) -> tuple[str | None, Record | None]:
        """STEP 3-5 again, under the gate, right before acting. The batch was classified
        a while ago (queue latency, redeliveries) and the owner may have moved on since:
        pending or terminating again, or provisioned with this primary. Only a group that
        is still an orphan against the current ledger is deleted; otherwise why not (and
        the record read). A retry leak is judged beside the primary its cycle listed with
        it (rule 17); a remembered protection goes to the provider's re-read (rule 14)."""
        record = self.ctx.store.load_records(backend.id, [group]).get(group.provider_ref)
        assert cycle.listed_at is not None
        known = [(group.provider_ref, group.region, listed_primary)] if listed_primary else []
        ctx = policy.classify_context(self.ctx.settings, backend, cycle.listed_at, limits, recheck_protections=True,
                                      listed=ListedInstances(known=known))
        verdict = classify.classify(group, record, ctx)
        return (None if verdict.kind is VerdictKind.ORPHAN else f"owner_changed:{verdict.reason}"), record

    def _on_provider_time(self, provider: ResourceProvider, cycle: CycleContext, group: ResourceGroup,
                          backend: Backend, limits: Limits, listed_primary: str | None,
                          ) -> tuple[str | None, Record | None]:
        """``_owner_changed`` judged on the creation time the provider reports now for the
        group's VM, never the listing message's: the copy rule and the margin read it, and
        a forged batch could age a user's copy into a retry leak (SAFETY.md rules 12 and 17).
        A VM the provider does not report, or reports created at another time, is skipped."""
        primary = group.primary
        assert primary is not None
        created = provider.instance_created_at(primary)
        if created is None or primary.created_at is None or abs(created - primary.created_at) > _SAME_TIME:
            return "owner_changed:created_at_changed", None
        judged = group.model_copy(update={"resources": tuple(
            r.model_copy(update={"created_at": created}) if r is primary else r for r in group.resources)})
        return self._owner_changed(cycle, judged, backend, limits, listed_primary)

    def _record(self, cycle_id: str, group: ResourceGroup, limits: Limits, **kw: Any) -> None:
        try:
            cycle_state.record_delete(self.ctx.store, cycle_id, group, limits, now=self.ctx.now(), **kw)
        except LeaseLost:
            log.warning("cycle %s lost its lease: delete result of %s not recorded", cycle_id, group.key)
