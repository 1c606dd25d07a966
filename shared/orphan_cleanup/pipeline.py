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
    DatabaseError, DependencyNotReady, LeaseLost, OrphanCleanupError, ProviderError, ProviderUnavailable,
)
from orphan_cleanup.ledger import cycles, deletes
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.queries import get_backend, load_records
from orphan_cleanup.models import (
    Action, Backend, DeleteRequest, DeleteResult, DeleteStatus, ListingBatch, RegionFailure, RegionListing,
    ResourceGroup, VerdictKind,
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


def effective_mode(settings: Settings, backend: Backend, override: str | None = None) -> str:
    return override or backend.mode or settings.mode


@dataclass
class Pipeline:
    settings: Settings
    db: Database
    provider_for: ProviderFactory
    listing_queue: Queue
    delete_queue: Queue
    reporter: Reporter = field(default_factory=Reporter)
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)

    # ---- lister: STEP 1-2 -------------------------------------------------

    def run_lister(self, backend_id: str, *, mode: str | None = None, manual: bool = False) -> dict[str, Any]:
        """STEP 1, enroll, lease, list and publish batches. Returns a summary.
        An idle scheduled run costs three statements on one connection."""
        with self.db.connection() as conn:
            backend = get_backend(conn, backend_id)
            effective = effective_mode(self.settings, backend, mode)
            if effective == "off":
                return {"backend": backend_id, "started": False, "reason": "off"}
            limits = limits_for(self.settings, backend)
            skip = None if manual else cycles.quick_skip(conn, backend_id, effective, limits, self.clock())
        if skip is not None:
            return {"backend": backend_id, "started": False, "reason": skip}
        cycles.enroll(self.db)
        started = cycles.start_cycle(self.db, backend_id, effective, limits, manual=manual, now=self.clock())
        if started.cycle is None:
            return {"backend": backend_id, "started": False, "reason": started.reason}
        cycle = started.cycle
        listed_at = self.clock()
        try:
            cycles.set_listed_at(self.db, cycle.id, listed_at)
            provider = self.provider_for(backend)
            count = 0
            for batch in self._batches(cycle, backend, listed_at, provider.iter_listing(), record_all=manual):
                self.listing_queue.publish(batch)
                count += 1
        except LeaseLost:
            return {"backend": backend_id, "started": True, "cycle_id": cycle.id, "reason": "lease_lost"}
        except Exception as exc:  # the listing raised: the cycle fails (STEP 7), never orphans
            self.reporter.error("listing failed", backend=backend_id, cycle_id=cycle.id, error=describe_error(exc))
            cycles.fail_cycle(self.db, cycle.id, f"listing failed: {describe_error(exc)}", limits, self.clock())
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
        apply status (applied, duplicate, fenced, unknown_cycle) and verdict counts."""
        with self.db.connection() as conn:
            backend = get_backend(conn, batch.backend)
            records = load_records(conn, backend.id, batch.groups)
            limits = limits_for(self.settings, backend)
            ctx = classify.ClassifyContext(
                backend_id=backend.id, listed_at=batch.listed_at, margin=timedelta(seconds=limits.margin_seconds),
                protect_key=backend.settings.protect_tag_key, tag_key=backend.settings.tag_key,
                stuck_after=timedelta(seconds=self.settings.stuck_pending_seconds))
            payload, to_report, errors, counts = build_payload(batch, records, ctx)
            result = cycles.apply_batch(conn, payload)
        if result["status"] == "duplicate":
            # The first delivery may have crashed after its apply committed and before
            # completing the listing: completing is fenced and idempotent, so retry it.
            self._complete_listing(batch.cycle_id, backend, limits, batch.mode)
        if result["status"] != "applied":
            return {"status": result["status"], "verdicts": {}}
        for row in to_report:
            self.reporter.orphan(backend.id, batch.cycle_id, row)
        for message, row in errors:
            self.reporter.error(message, backend=backend.id, provider_ref=row["provider_ref"], group=row["group_key"])
        if result["listing_complete"]:
            self._complete_listing(batch.cycle_id, backend, limits, batch.mode)
        return {"status": "applied", "verdicts": counts}

    def _complete_listing(self, cycle_id: str, backend: Backend, limits: cycles.Limits, mode: str) -> None:
        if mode != "delete":
            cycles.finish_if_complete(self.db, cycle_id, limits, self.clock())
            return
        try:
            dispatch = deletes.dispatch_deletes(self.db, cycle_id, limits, self.clock())
        except LeaseLost:
            return
        if dispatch.blocked:
            self.reporter.error("blast-radius cap: deleted nothing", backend=backend.id, reason=dispatch.blocked)
        for group in dispatch.groups:
            self.delete_queue.publish(DeleteRequest(cycle_id=cycle_id, backend=backend.id, group=group))

    # ---- deleter -----------------------------------------------------------

    def handle_delete(self, request: DeleteRequest, holder: str | None = None) -> str:
        """Gate, delete, record. Raises ``GateBusy`` when the ref's gate is held
        (the message should be redelivered later)."""
        with self.db.connection() as conn:
            backend = get_backend(conn, request.backend)
        limits = limits_for(self.settings, backend)
        group = request.group
        try:
            why_not = deletes.delete_allowed(self.db, request.cycle_id, group)
        except LeaseLost:
            return "fenced"
        if why_not == "region_tripped":
            deletes.record_delete(self.db, request.cycle_id, group, limits, now=self.clock(),
                                  skipped_reason="region_tripped",
                                  trip_region=True)
            return why_not
        if why_not is not None:
            return why_not
        # One holder per delivery: a redelivered request (an SQS duplicate, or a visibility
        # timeout while this call is still running) must wait for the gate, not share it.
        holder = holder or f"{request.cycle_id}:{group.key}:{uuid.uuid4().hex[:12]}"
        if not deletes.acquire_gate(self.db, backend.id, group.provider_ref, holder, deletes.gate_ttl(limits)):
            raise GateBusy(f"delete gate of {group.provider_ref} is held")
        try:
            changed = self._owner_changed(request, backend, limits)
            if changed is not None:
                self._record(request, group, limits, skipped_reason=changed)
                return "skipped"
            try:
                result = self.provider_for(backend).delete_resource_group(group)
            except ProviderUnavailable as exc:
                self._record(request, group, limits, error=describe_error(exc), trip_region=True)
                return "region_tripped"
            except DependencyNotReady:  # "not yet", never a failure: a later cycle retries
                result = DeleteResult(status=DeleteStatus.DELETING, pending=tuple(group.resource_ids()))
                self._record(request, group, limits, result=result)
                return result.status.value
            except ProviderError as exc:
                self._record(request, group, limits, error=describe_error(exc))
                return "failed"
            self._record(request, group, limits, result=result)
            return result.status.value
        finally:
            deletes.release_gate(self.db, backend.id, group.provider_ref, holder)

    def _owner_changed(self, request: DeleteRequest, backend: Backend, limits: cycles.Limits) -> str | None:
        """STEP 3-5 again, under the gate, right before acting. The batch was classified
        a while ago (queue latency, redeliveries) and the owner may have moved on since:
        pending or terminating again, or provisioned with this primary. Only a group that
        is still an orphan against the current ledger is deleted; otherwise why not."""
        group = request.group
        with self.db.connection() as conn:
            listed = conn.run("SELECT listed_at FROM cycles WHERE id = :c", c=request.cycle_id)
            record = load_records(conn, backend.id, [group]).get(group.provider_ref)
        if not listed or listed[0][0] is None:
            return "cycle_unknown"
        ctx = classify.ClassifyContext(
            backend_id=backend.id, listed_at=listed[0][0], margin=timedelta(seconds=limits.margin_seconds),
            protect_key=backend.settings.protect_tag_key, tag_key=backend.settings.tag_key,
            stuck_after=timedelta(seconds=self.settings.stuck_pending_seconds))
        verdict = classify.classify(group, record, ctx)
        return None if verdict.kind is VerdictKind.ORPHAN else f"owner_changed:{verdict.reason}"

    def _record(self, request: DeleteRequest, group: ResourceGroup, limits: cycles.Limits, **kw: Any) -> None:
        try:
            deletes.record_delete(self.db, request.cycle_id, group, limits, now=self.clock(), **kw)
        except LeaseLost:
            log.warning("cycle %s lost its lease: delete result of %s not recorded", request.cycle_id, group.key)


# Verdicts whose groups are written to cycle_groups even when record_all is off.
_RECORDED = frozenset({VerdictKind.ORPHAN, VerdictKind.PROTECTED, VerdictKind.SKIPPED})


def build_payload(batch: ListingBatch, records: dict, ctx: classify.ClassifyContext) -> tuple[
        dict[str, Any], list[dict[str, Any]], list[tuple[str, dict[str, Any]]], dict[str, int]]:
    """Classify a batch and shape what the fenced apply writes. Pure.

    Most groups of a healthy account are tracked: unless the cycle records
    every group, a group that is neither written nor logged is only counted
    (building its row, resources dumped to JSON, was most of this function's
    time; see bench/classifier.py)."""
    rows, orphans, orphan_res, events, to_report, errors = [], [], [], [], [], []
    by_kind: dict[VerdictKind, int] = {}
    report = batch.mode != "delete"
    record_all = batch.record_all
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
