"""The classifier step (STEP 3-6 of one listing batch): the cycle and its backend from
the ledger, the step 3 join, ``classify_batch``, the fenced apply; the last batch
completes the listing (report mode finishes the cycle, delete mode dispatches the
delete requests)."""

from __future__ import annotations

from dataclasses import dataclass

from orphan_cleanup.core import policy
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.errors import LeaseLost, MessageRefused
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.results import BatchResult
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.step_context import StepContext
from orphan_cleanup.ledger.records import CycleContext
from orphan_cleanup.queues.base import Queue


@dataclass
class Classifier:
    ctx: StepContext
    delete_queue: Queue  # a delete cycle's requests, one per orphan group

    def handle_batch(self, batch: ListingBatch) -> BatchResult:
        """Join, classify and apply one batch (fenced, idempotent). Returns the
        apply status (applied, duplicate, fenced, unknown_cycle) and verdict counts.
        Three statements on one connection: the cycle with its backend, the join (with the
        operator's keeps), the apply.

        The message is a hint (SAFETY.md rule 12): backend, mode and listing time
        come from the cycle's row; a batch that disagrees raises ``MessageRefused``."""
        reporter = self.ctx.reporter
        with self.ctx.store.session() as session:
            cycle = session.cycle_context(batch.cycle_id)
            if cycle is None:
                return BatchResult(status="unknown_cycle")
            self._refuse_if_tampered(batch, cycle)
            backend = cycle.backend
            assert cycle.listed_at is not None  # checked by _refuse_if_tampered
            # The operator's keeps in force at the listing time come with the records (rule 23).
            records, keeps = session.load_ledger(backend.id, batch.groups, cycle.listed_at)
            if backend.retired_from is not None \
                    and any(r.backend_id == backend.retired_from for r in records.values()):
                # A retired coverage found something its backend's owners name: it stays (rule 24).
                session.origin_seen(batch.cycle_id)
            limits = self.ctx.limits(backend)
            # The batch holds every group of a ref in a region (``cycle.lister``'s batches never
            # split one): what a live owner's other VM is judged beside (SAFETY.md rule 17). A
            # delete cycle re-reads remembered protections (rule 14).
            ctx = policy.classify_context(self.ctx.settings, backend, cycle.listed_at, limits,
                                          listed=ListedInstances(batch.groups, backend.settings.tag_key),
                                          recheck_protections=cycle.mode == "delete")
            app = classify_batch(batch, records, ctx, mode=cycle.mode, record_all=cycle.record_all, keeps=keeps)
            result = session.apply(app)
        if result.status == "duplicate":
            # The first delivery may have crashed after its apply committed and before
            # completing the listing: completing is fenced and idempotent, so retry it.
            self._complete_listing(cycle, backend, limits)
        if result.status != "applied":
            return BatchResult(status=result.status)
        reporter.count("GroupsListed", len(batch.groups), backend.id)
        for verdict, n in app.counts.items():
            reporter.count(f"Groups_{verdict}", n, backend.id)
        for row in app.to_report:
            reporter.orphan(backend.id, batch.cycle_id, row.as_dict())
        for message, row in app.errors:
            reporter.error(message, backend=backend.id, provider_ref=row.group.provider_ref,
                           group=row.group.key, region=row.group.region, primary_id=row.group.primary_id,
                           owner_id=row.owner_id, owner_name=row.owner_name)
        if result.listing_complete:
            self._complete_listing(cycle, backend, limits)
        return BatchResult(status="applied", verdicts=app.counts)

    def _refuse_if_tampered(self, batch: ListingBatch, cycle: CycleContext) -> None:
        wrong = [name for name, sent, truth in (
            ("backend", batch.backend, cycle.backend_id), ("mode", batch.mode, cycle.mode),
            ("listed_at", batch.listed_at, cycle.listed_at), ("record_all", batch.record_all, cycle.record_all))
            if sent != truth]
        if wrong:
            self.ctx.reporter.error("listing batch refused: it disagrees with its cycle", backend=cycle.backend_id,
                                    cycle_id=cycle.id, fields=",".join(wrong), seq=batch.seq)
            raise MessageRefused(f"batch {batch.seq} of cycle {cycle.id} refused: its {', '.join(wrong)}"
                                 " differ from the cycle's")

    def _complete_listing(self, cycle: CycleContext, backend: Backend, limits: Limits) -> None:
        cycle_id = cycle.id
        if cycle.mode != "delete":
            cycle_state.finish_if_complete(self.ctx.store, cycle_id, limits, self.ctx.now())
            return
        try:
            dispatch = cycle_state.dispatch_deletes(self.ctx.store, cycle_id, limits, self.ctx.now())
        except LeaseLost:
            return
        if dispatch.blocked:
            self.ctx.reporter.error("blast-radius cap: deleted nothing", backend=backend.id,
                                    reason=str(dispatch.blocked))
        for group in dispatch.groups:
            self.delete_queue.publish(DeleteRequest(cycle_id=cycle_id, backend=backend.id, group=group))
