"""The steps, wired only through ports: lister (STEP 1-2), classifier (STEP 3-6),
deleter (gate, re-verify, delete, record). Whichever piece finishes last
applies STEP 7 inside its fenced transaction."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from orphan_cleanup import classify
from orphan_cleanup.errors import (
    DatabaseError, DependencyNotReady, IdentityMismatch, LeaseLost, MessageRefused, OrphanCleanupError,
    ProviderError, ProviderUnavailable,
)
from orphan_cleanup.ledger import cycles, deletes
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.queries import get_backend, load_records
from orphan_cleanup.models import (
    Action, Backend, DeleteOutcome, Mode, DeleteRequest, DeleteResult, DeleteStatus, ListingBatch, RegionFailure,
    RegionListing, ResourceGroup, VerdictKind,
)
from orphan_cleanup.providers.base import ResourceProvider, describe_error
from orphan_cleanup.queues.base import Queue
from orphan_cleanup.reporting import Reporter
from orphan_cleanup.settings import Settings

log = logging.getLogger("orphan_cleanup")
ProviderFactory = Callable[[Backend], ResourceProvider]


class GateBusy(OrphanCleanupError):
    """Another delete of the same ref holds the gate: retry the message later."""


def limits_for(settings: Settings, backend: Backend) -> cycles.Limits:
    s = backend.settings
    return cycles.Limits(
        interval_seconds=s.interval_seconds or settings.interval_seconds,
        margin_seconds=s.margin_seconds if s.margin_seconds is not None else settings.margin_seconds,
        max_backoff_seconds=settings.max_backoff_seconds,
        cycle_deadline_seconds=settings.cycle_deadline_seconds,
        max_deletes=s.max_deletes if s.max_deletes is not None else settings.max_deletes,
        max_delete_share=s.max_delete_share if s.max_delete_share is not None else settings.max_delete_share,
    )


def effective_mode(settings: Settings, backend: Backend, override: Mode | None = None) -> Mode:
    """The backend's own mode, else the global one; ``off`` is final (no override
    runs an off backend), otherwise an override is an operator's one-off request."""
    base = backend.mode or settings.mode
    return "off" if base == "off" else override or base


def identity_failure(exc: ProviderError) -> str:
    """The one-line reason an identity check failed, for ``failures`` (region ``*``)."""
    return str(exc) if isinstance(exc, IdentityMismatch) else f"identity_check_failed: {describe_error(exc)}"


@dataclass
class Pipeline:
    settings: Settings
    db: Database
    provider_for: ProviderFactory
    listing_queue: Queue
    delete_queue: Queue
    reporter: Reporter = field(default_factory=Reporter)
    # None: every compared timestamp is the database's clock (DESIGN §5 rule 13).
    # Tests and the simulation may inject a time source.
    clock: Callable[[], datetime] | None = None

    def _now(self) -> datetime | None:
        return self.clock() if self.clock is not None else None

    def _context(self, backend: Backend, listed_at: datetime, limits: cycles.Limits) -> classify.ClassifyContext:
        return classify.ClassifyContext(
            backend_id=backend.id, scope=backend.scope, listed_at=listed_at,
            margin=timedelta(seconds=limits.margin_seconds), protect_key=backend.settings.protect_tag_key,
            tag_key=backend.settings.tag_key, stuck_after=timedelta(seconds=self.settings.stuck_pending_seconds))

    # ---- lister: STEP 1-2 -------------------------------------------------

    def run_lister(self, backend_id: str, *, mode: Mode | None = None, manual: bool = False) -> dict[str, Any]:
        """STEP 1, enroll, lease, list and publish batches. Returns a summary.
        An idle scheduled run costs three statements on one connection."""
        with self.db.connection() as conn:
            backend = get_backend(conn, backend_id)
            effective = effective_mode(self.settings, backend, mode)
            if effective == "off":
                return {"backend": backend_id, "started": False, "reason": "off"}
            limits = limits_for(self.settings, backend)
            skip = None if manual else cycles.quick_skip(conn, backend_id, effective, limits, self._now())
        if skip is not None:
            return {"backend": backend_id, "started": False, "reason": skip}
        cycles.enroll(self.db)
        started = cycles.start_cycle(self.db, backend_id, effective, limits, manual=manual, now=self._now())
        if started.cycle is None:
            return {"backend": backend_id, "started": False, "reason": started.reason}
        cycle = started.cycle
        try:
            listed_at = cycles.set_listed_at(self.db, cycle.id, self._now())
            provider = self.provider_for(backend)
            try:
                provider.verify_identity()  # DESIGN §5 rule 11: before anything is listed
            except ProviderError as exc:
                reason = identity_failure(exc)
                self.reporter.error("identity check failed", backend=backend_id, cycle_id=cycle.id, error=reason)
                cycles.fail_cycle(self.db, cycle.id, reason, limits, self._now(),
                                  failures=[RegionFailure(region="*", error=reason)])
                return {"backend": backend_id, "started": True, "cycle_id": cycle.id, "reason": "identity_failed"}
            count = 0
            for batch in self._batches(cycle, backend, listed_at, provider.iter_listing(), record_all=manual):
                self.listing_queue.publish(batch)
                count += 1
        except LeaseLost:
            return {"backend": backend_id, "started": True, "cycle_id": cycle.id, "reason": "lease_lost"}
        except Exception as exc:  # the listing raised: the cycle fails (STEP 7), never orphans
            self.reporter.error("listing failed", backend=backend_id, cycle_id=cycle.id, error=describe_error(exc))
            cycles.fail_cycle(self.db, cycle.id, f"listing failed: {describe_error(exc)}", limits, self._now())
            if not isinstance(exc, (OrphanCleanupError, DatabaseError)):
                raise
            return {"backend": backend_id, "started": True, "cycle_id": cycle.id, "reason": "listing_failed"}
        return {"backend": backend_id, "started": True, "cycle_id": cycle.id, "reason": started.reason,
                "batches": count, "mode": effective}

    def _batches(self, cycle: cycles.CycleRef, backend: Backend, listed_at: datetime,
                 regions: Iterable[RegionListing], *, record_all: bool) -> Iterator[ListingBatch]:
        failures: list[RegionFailure] = []
        seq = 0
        limit = self.listing_queue.max_message_bytes - 4096

        def batch(groups: list[ResourceGroup], last: bool) -> ListingBatch:
            return ListingBatch(cycle_id=cycle.id, backend=backend.id, seq=seq, listed_at=listed_at,
                                mode=cycle.mode, record_all=record_all, groups=tuple(groups), last=last,
                                batch_count=seq + 1 if last else None, failures=tuple(failures) if last else ())

        pending: list[ResourceGroup] = []
        size = 0
        for region in regions:
            if region.failure is not None:
                failures.append(RegionFailure(region=region.region, error=region.failure))
                continue
            for group in region.groups:
                gsize = len(group.model_dump_json()) + 1
                if pending and size + gsize > limit:
                    yield batch(pending, last=False)
                    seq += 1
                    pending, size = [], 0
                pending.append(group)
                size += gsize
        yield batch(pending, last=True)

    # ---- classifier: STEP 3-6 ---------------------------------------------

    def handle_batch(self, batch: ListingBatch) -> dict[str, Any]:
        """Join, classify and apply one batch (fenced, idempotent). Returns the
        apply status (applied, duplicate, fenced, unknown_cycle) and verdict counts.

        The message is a hint (DESIGN §5 rule 12): backend, mode and listing time
        come from the cycle's row; a batch that disagrees raises ``MessageRefused``."""
        with self.db.connection() as conn:
            cycle = cycles.cycle_context(conn, batch.cycle_id)
            if cycle is None:
                return {"status": "unknown_cycle", "verdicts": {}}
            self._refuse_if_tampered(batch, cycle)
            backend = cycle.backend
            records = load_records(conn, backend.id, batch.groups)
            limits = limits_for(self.settings, backend)
            assert cycle.listed_at is not None  # checked by _refuse_if_tampered
            ctx = self._context(backend, cycle.listed_at, limits)
            payload, to_report, errors, counts = build_payload(batch, records, ctx, mode=cycle.mode,
                                                                  record_all=cycle.record_all)
            result = cycles.apply_batch(conn, payload)
        if result["status"] == "duplicate":
            # The first delivery may have crashed after its apply committed and before
            # completing the listing: completing is fenced and idempotent, so retry it.
            self._complete_listing(cycle, backend, limits)
        if result["status"] != "applied":
            return {"status": result["status"], "verdicts": {}}
        for row in to_report:
            self.reporter.orphan(backend.id, batch.cycle_id, row)
        for message, row in errors:
            self.reporter.error(message, backend=backend.id, provider_ref=row["provider_ref"], group=row["group_key"])
        if result["listing_complete"]:
            self._complete_listing(cycle, backend, limits)
        return {"status": "applied", "verdicts": counts}

    def _refuse_if_tampered(self, batch: ListingBatch, cycle: cycles.CycleContext) -> None:
        wrong = [name for name, sent, truth in (
            ("backend", batch.backend, cycle.backend_id), ("mode", batch.mode, cycle.mode),
            ("listed_at", batch.listed_at, cycle.listed_at), ("record_all", batch.record_all, cycle.record_all))
            if sent != truth]
        if wrong:
            self.reporter.error("listing batch refused: it disagrees with its cycle", backend=cycle.backend_id,
                                cycle_id=cycle.id, fields=",".join(wrong), seq=batch.seq)
            raise MessageRefused(f"batch {batch.seq} of cycle {cycle.id} refused: its {', '.join(wrong)}"
                                 " differ from the cycle's")

    def _complete_listing(self, cycle: cycles.CycleContext, backend: Backend, limits: cycles.Limits) -> None:
        cycle_id = cycle.id
        if cycle.mode != "delete":
            cycles.finish_if_complete(self.db, cycle_id, limits, self._now())
            return
        try:
            dispatch = deletes.dispatch_deletes(self.db, cycle_id, limits, self._now())
        except LeaseLost:
            return
        if dispatch.blocked:
            self.reporter.error("blast-radius cap: deleted nothing", backend=backend.id, reason=dispatch.blocked)
        for group in dispatch.groups:
            self.delete_queue.publish(DeleteRequest(cycle_id=cycle_id, backend=backend.id, group=group))

    # ---- deleter -----------------------------------------------------------

    def handle_delete(self, request: DeleteRequest, holder: str | None = None) -> DeleteOutcome:
        """Gate, delete, record. Raises ``GateBusy`` when the ref's gate is held
        (the message should be redelivered later).

        The message only names a group (DESIGN §5 rule 12): the backend is the
        cycle's, and the resources deleted are those the cycle recorded for that
        group as an orphan; a request that disagrees raises ``MessageRefused``."""
        with self.db.connection() as conn:
            cycle = cycles.cycle_context(conn, request.cycle_id)
            if cycle is None or cycle.listed_at is None:
                return DeleteOutcome.CYCLE_UNKNOWN
            if request.backend != cycle.backend_id:
                self.reporter.error("delete request refused: another backend than its cycle's",
                                    backend=cycle.backend_id, cycle_id=cycle.id, group=request.group.key)
                raise MessageRefused(f"delete request for {request.group.key} names backend {request.backend!r},"
                                     f" its cycle is of {cycle.backend_id!r}")
        backend = cycle.backend
        limits = limits_for(self.settings, backend)
        try:
            why_not, group = deletes.delete_allowed(self.db, cycle.id, request.group)
        except LeaseLost:
            return DeleteOutcome.FENCED
        if why_not is DeleteOutcome.GROUP_MISMATCH:
            self.reporter.error("delete request refused: its resources differ from the classified group",
                                backend=backend.id, cycle_id=cycle.id, group=request.group.key)
        if why_not is None and effective_mode(self.settings, backend) == "off":
            why_not = DeleteOutcome.BACKEND_OFF  # switched off since the cycle started: off is final
        if why_not in (DeleteOutcome.REGION_TRIPPED, DeleteOutcome.BACKEND_OFF) and group is not None:
            self._record(cycle.id, group, limits, skipped_reason=why_not.value,
                         trip_region=why_not is DeleteOutcome.REGION_TRIPPED)
            return why_not
        if why_not is not None or group is None:
            return why_not or DeleteOutcome.NOT_DISPATCHED
        provider = self.provider_for(backend)
        try:
            provider.verify_identity()  # DESIGN §5 rule 11: before anything is deleted
        except ProviderError as exc:
            self._record(cycle.id, group, limits, error=identity_failure(exc))
            return DeleteOutcome.IDENTITY_FAILED
        # One holder per delivery: a redelivered request (an SQS duplicate, or a visibility
        # timeout while this call is still running) must wait for the gate, not share it.
        holder = holder or f"{cycle.id}:{group.key}:{uuid.uuid4().hex[:12]}"
        if not deletes.acquire_gate(self.db, backend.scope, group.provider_ref, holder, deletes.gate_ttl(limits)):
            raise GateBusy(f"delete gate of {group.provider_ref} is held")
        try:
            changed = self._owner_changed(cycle, group, backend, limits)
            if changed is not None:
                self._record(cycle.id, group, limits, skipped_reason=changed)
                return DeleteOutcome.SKIPPED
            try:
                result = provider.delete_resource_group(group)
            except ProviderUnavailable as exc:
                self._record(cycle.id, group, limits, error=describe_error(exc), trip_region=True)
                return DeleteOutcome.REGION_TRIPPED
            except DependencyNotReady:  # "not yet", never a failure: a later cycle retries
                result = DeleteResult(status=DeleteStatus.DELETING, pending=tuple(group.resource_ids()))
                self._record(cycle.id, group, limits, result=result)
                return DeleteOutcome(result.status.value)
            except ProviderError as exc:
                self._record(cycle.id, group, limits, error=describe_error(exc))
                return DeleteOutcome.FAILED
            self._record(cycle.id, group, limits, result=result)
            return DeleteOutcome(result.status.value)
        finally:
            deletes.release_gate(self.db, backend.scope, group.provider_ref, holder)

    def _owner_changed(self, cycle: cycles.CycleContext, group: ResourceGroup, backend: Backend,
                       limits: cycles.Limits) -> str | None:
        """STEP 3-5 again, under the gate, right before acting. The batch was classified
        a while ago (queue latency, redeliveries) and the owner may have moved on since:
        pending or terminating again, or provisioned with this primary. Only a group that
        is still an orphan against the current ledger is deleted; otherwise why not."""
        with self.db.connection() as conn:
            record = load_records(conn, backend.id, [group]).get(group.provider_ref)
        assert cycle.listed_at is not None
        verdict = classify.classify(group, record, self._context(backend, cycle.listed_at, limits))
        return None if verdict.kind is VerdictKind.ORPHAN else f"owner_changed:{verdict.reason}"

    def _record(self, cycle_id: str, group: ResourceGroup, limits: cycles.Limits, **kw: Any) -> None:
        try:
            deletes.record_delete(self.db, cycle_id, group, limits, now=self._now(), **kw)
        except LeaseLost:
            log.warning("cycle %s lost its lease: delete result of %s not recorded", cycle_id, group.key)


# Verdicts whose groups are written to cycle_groups even when record_all is off.
_RECORDED = frozenset({VerdictKind.ORPHAN, VerdictKind.PROTECTED, VerdictKind.SKIPPED})


def build_payload(batch: ListingBatch, records: dict, ctx: classify.ClassifyContext, *, mode: str,
                  record_all: bool) -> tuple[
        dict[str, Any], list[dict[str, Any]], list[tuple[str, dict[str, Any]]], dict[str, int]]:
    """Classify a batch and shape what the fenced apply writes. Pure. ``mode`` and
    ``record_all`` are the cycle's (from its row, never from the message).

    Most groups of a healthy account are tracked: unless the cycle records
    every group, a group that is neither written nor logged is only counted
    (building its row, resources dumped to JSON, was most of this function's
    time; see bench/classifier.py)."""
    rows: list[dict[str, Any]] = []
    orphans: list[dict[str, Any]] = []
    orphan_res: list[dict[str, str]] = []
    events: list[dict[str, Any]] = []
    to_report: list[dict[str, Any]] = []
    errors: list[tuple[str, dict[str, Any]]] = []
    by_kind: dict[VerdictKind, int] = {}
    report = mode != "delete"
    for group in batch.groups:
        record = records.get(group.provider_ref)
        verdict = classify.classify(group, record, ctx)
        kind = verdict.kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if not (record_all or kind in _RECORDED or verdict.log_error):
            continue
        if kind is VerdictKind.ORPHAN:
            action = Action.REPORTED if report else Action.NONE
        elif kind is VerdictKind.PROTECTED:
            action = Action.REPORTED
        else:
            action = Action.NONE
        row = {"group_key": group.key, "provider_ref": group.provider_ref, "region": group.region,
               "primary_id": group.primary_id, "resources": [r.model_dump(mode="json") for r in group.resources],
               "verdict": kind.value, "reason": verdict.reason, "action": action.value,
               "owner_id": record.owner_id if record else None,
               "owner_name": record.owner_name if record else None}
        if verdict.log_error:
            errors.append((verdict.log_error, row))
        if record_all or kind in _RECORDED:
            rows.append(row)
        if kind in (VerdictKind.ORPHAN, VerdictKind.PROTECTED):
            state = "open" if kind is VerdictKind.ORPHAN else "protected"
            orphans.append({**row, "state": state, "reported": 1 if action is Action.REPORTED else 0})
        if kind is VerdictKind.ORPHAN:
            orphan_res.extend({"provider_ref": group.provider_ref, "resource_id": r.id} for r in group.resources)
        if action is Action.REPORTED:
            to_report.append(row)
            events.append({"kind": f"{kind.value}_reported", "provider_ref": group.provider_ref,
                           "message": f"{kind.value} resource group {group.key}: {verdict.reason}",
                           "owner_type": record.owner_type if record else None,
                           "owner_id": row["owner_id"], "owner_name": row["owner_name"],
                           "details": {"resources": [r.id for r in group.resources], "reason": verdict.reason}})
    counts = {kind.value: n for kind, n in by_kind.items()}
    skipped = VerdictKind.SKIPPED in by_kind
    payload = {"cycle_id": batch.cycle_id, "seq": batch.seq, "last": batch.last, "batch_count": batch.batch_count,
               "failures": [f.model_dump() for f in batch.failures], "groups": len(batch.groups),
               "skipped": skipped, "rows": rows, "orphans": orphans, "orphan_resources": orphan_res,
               "events": events}
    return payload, to_report, errors, counts
