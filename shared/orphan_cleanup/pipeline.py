"""The steps, wired only through ports: lister (STEP 1-2), classifier (STEP 3-6),
deleter (gate, re-verify, delete, record). Whichever piece finishes last
applies STEP 7 inside its fenced transaction (``bookkeeping``).

The pipeline is the only caller of the pure core (``classify``): it reads facts
from the ledger store, asks for the decision and hands it back to the store."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from orphan_cleanup import bookkeeping, policy
from orphan_cleanup.classify import Limits
from orphan_cleanup.deleter import Deleter, GateBusy, identity_failure
from orphan_cleanup.errors import DatabaseError, LeaseLost, MessageRefused, OrphanCleanupError, ProviderError
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import CycleContext, CycleRef
from orphan_cleanup.messages import DeleteRequest, ListingBatch
from orphan_cleanup.models import Backend, Mode, RegionFailure, RegionListing, ResourceGroup
from orphan_cleanup.payload import build_payload
from orphan_cleanup.providers.base import ResourceProvider, describe_error
from orphan_cleanup.queues.base import Queue
from orphan_cleanup.reporting import Reporter
from orphan_cleanup.results import BatchResult, ListerResult
from orphan_cleanup.settings import Settings

__all__ = ["GateBusy", "Pipeline", "build_payload", "effective_mode", "limits_for"]

# Re-exported for callers that import them with the pipeline; the steps call ``policy``.
effective_mode, limits_for = policy.effective_mode, policy.limits_for

log = logging.getLogger("orphan_cleanup")
ProviderFactory = Callable[[Backend], ResourceProvider]


@dataclass
class Pipeline(Deleter):
    settings: Settings
    db: Database
    provider_for: ProviderFactory
    listing_queue: Queue
    delete_queue: Queue
    reporter: Reporter = field(default_factory=Reporter)
    # None: every compared timestamp is the database's clock (DESIGN §5 rule 13).
    # Tests and the simulation may inject a time source.
    clock: Callable[[], datetime] | None = None

    # ---- lister: STEP 1-2 -------------------------------------------------

    def run_lister(self, backend_id: str, *, mode: Mode | None = None, manual: bool = False) -> ListerResult:
        """STEP 1, enroll, lease, list and publish batches. Returns a summary.
        An idle scheduled run costs three statements on one connection."""
        with self.store.session() as session:
            backend = session.backend(backend_id)
            effective = policy.effective_mode(self.settings, backend, mode)
            if effective == "off":
                return ListerResult(backend=backend_id, started=False, reason="off")
            limits = self._limits(backend)
            skip = None if manual else bookkeeping.quick_skip(session, backend_id, effective, limits, self._now())
        if skip is not None:
            return ListerResult(backend=backend_id, started=False, reason=skip)
        self.store.enroll()
        started = bookkeeping.start_cycle(self.store, backend_id, effective, limits, manual=manual, now=self._now())
        if started.cycle is None:
            return ListerResult(backend=backend_id, started=False, reason=started.reason)
        cycle = started.cycle

        def stopped(reason: str) -> ListerResult:
            return ListerResult(backend=backend_id, started=True, cycle_id=cycle.id, reason=reason)

        try:
            listed_at = bookkeeping.set_listed_at(self.store, cycle.id, self._now())
            provider = self.provider_for(backend)
            try:
                provider.verify_identity()  # DESIGN §5 rule 11: before anything is listed
            except ProviderError as exc:
                reason = identity_failure(exc)
                self.reporter.error("identity check failed", backend=backend_id, cycle_id=cycle.id, error=reason)
                bookkeeping.fail_cycle(self.store, cycle.id, reason, limits, self._now(),
                                       failures=[RegionFailure(region="*", error=reason)])
                return stopped("identity_failed")
            count = 0
            for batch in self._batches(cycle, backend, listed_at, provider.iter_listing(), record_all=manual):
                self.listing_queue.publish(batch)
                count += 1
        except LeaseLost:
            return stopped("lease_lost")
        except Exception as exc:  # the listing raised: the cycle fails (STEP 7), never orphans
            self.reporter.error("listing failed", backend=backend_id, cycle_id=cycle.id, error=describe_error(exc))
            bookkeeping.fail_cycle(self.store, cycle.id, f"listing failed: {describe_error(exc)}", limits,
                                   self._now())
            if not isinstance(exc, (OrphanCleanupError, DatabaseError)):
                raise
            return stopped("listing_failed")
        return ListerResult(backend=backend_id, started=True, cycle_id=cycle.id, reason=started.reason,
                            batches=count, mode=effective)

    def _batches(self, cycle: CycleRef, backend: Backend, listed_at: datetime,
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

    def handle_batch(self, batch: ListingBatch) -> BatchResult:
        """Join, classify and apply one batch (fenced, idempotent). Returns the
        apply status (applied, duplicate, fenced, unknown_cycle) and verdict counts.
        Three statements on one connection: the cycle with its backend, the join, the apply.

        The message is a hint (DESIGN §5 rule 12): backend, mode and listing time
        come from the cycle's row; a batch that disagrees raises ``MessageRefused``."""
        with self.store.session() as session:
            cycle = session.cycle_context(batch.cycle_id)
            if cycle is None:
                return BatchResult(status="unknown_cycle")
            self._refuse_if_tampered(batch, cycle)
            backend = cycle.backend
            records = session.load_records(backend.id, batch.groups)
            limits = self._limits(backend)
            assert cycle.listed_at is not None  # checked by _refuse_if_tampered
            ctx = self._context(backend, cycle.listed_at, limits)
            app = build_payload(batch, records, ctx, mode=cycle.mode, record_all=cycle.record_all)
            result = session.apply(app)
        if result.status == "duplicate":
            # The first delivery may have crashed after its apply committed and before
            # completing the listing: completing is fenced and idempotent, so retry it.
            self._complete_listing(cycle, backend, limits)
        if result.status != "applied":
            return BatchResult(status=result.status)
        for row in app.to_report:
            self.reporter.orphan(backend.id, batch.cycle_id, row.as_dict())
        for message, row in app.errors:
            self.reporter.error(message, backend=backend.id, provider_ref=row.group.provider_ref,
                                group=row.group.key)
        if result.listing_complete:
            self._complete_listing(cycle, backend, limits)
        return BatchResult(status="applied", verdicts=app.counts)

    def _refuse_if_tampered(self, batch: ListingBatch, cycle: CycleContext) -> None:
        wrong = [name for name, sent, truth in (
            ("backend", batch.backend, cycle.backend_id), ("mode", batch.mode, cycle.mode),
            ("listed_at", batch.listed_at, cycle.listed_at), ("record_all", batch.record_all, cycle.record_all))
            if sent != truth]
        if wrong:
            self.reporter.error("listing batch refused: it disagrees with its cycle", backend=cycle.backend_id,
                                cycle_id=cycle.id, fields=",".join(wrong), seq=batch.seq)
            raise MessageRefused(f"batch {batch.seq} of cycle {cycle.id} refused: its {', '.join(wrong)}"
                                 " differ from the cycle's")

    def _complete_listing(self, cycle: CycleContext, backend: Backend, limits: Limits) -> None:
        cycle_id = cycle.id
        if cycle.mode != "delete":
            bookkeeping.finish_if_complete(self.store, cycle_id, limits, self._now())
            return
        try:
            dispatch = bookkeeping.dispatch_deletes(self.store, cycle_id, limits, self._now())
        except LeaseLost:
            return
        if dispatch.blocked:
            self.reporter.error("blast-radius cap: deleted nothing", backend=backend.id, reason=str(dispatch.blocked))
        for group in dispatch.groups:
            self.delete_queue.publish(DeleteRequest(cycle_id=cycle_id, backend=backend.id, group=group))
