"""The steps, wired only through ports: lister (the tick, STEP 1-2: ``lister.py``),
classifier (STEP 3-6, here), deleter (gate, re-verify, delete, record: ``deleter.py``). Whichever piece finishes last
applies STEP 7 inside its fenced transaction (``cycle_state``).

The pipeline is the only caller of the pure core (``classify``): it reads facts
from the ledger store, asks for the decision and hands it back to the store."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from orphan_cleanup.core import policy
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.errors import LeaseLost, MessageRefused
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.results import BatchResult
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.lister import Lister
from orphan_cleanup.cycle.python_gc import gc_paused
from orphan_cleanup.cycle.reporting import Reporter
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import CycleContext
from orphan_cleanup.providers.base import ResourceProvider
from orphan_cleanup.queues.base import Queue

log = logging.getLogger("orphan_cleanup")
ProviderFactory = Callable[[Backend], ResourceProvider]


@dataclass
class Pipeline(Lister):
    settings: Settings
    db: Database
    provider_for: ProviderFactory
    listing_queue: Queue
    delete_queue: Queue
    reporter: Reporter = field(default_factory=Reporter)
    # The tick's listing jobs (the deployed functions); None where there is no tick.
    jobs_queue: Queue | None = None
    # None: every compared timestamp is the database's clock (SAFETY.md rule 13).
    # Tests and the simulation may inject a time source.
    clock: Callable[[], datetime] | None = None
    # The deployed functions refuse backends whose row holds a service-account key (or a
    # key file path): ``policy.ledger_key_refusal``. The CLI and the demo accept them.
    ledger_keys: bool = True

    # ---- classifier: STEP 3-6 ---------------------------------------------

    @gc_paused  # its objects are acyclic and short-lived: see python_gc
    def handle_batch(self, batch: ListingBatch) -> BatchResult:
        """Join, classify and apply one batch (fenced, idempotent). Returns the
        apply status (applied, duplicate, fenced, unknown_cycle) and verdict counts.
        Three statements on one connection: the cycle with its backend, the join, the apply.

        The message is a hint (SAFETY.md rule 12): backend, mode and listing time
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
            # The batch holds every group of a ref in a region (``cycle.lister``'s batches never
            # split one): what a live owner's other VM is judged beside (SAFETY.md rule 17). A
            # delete cycle re-reads remembered protections (rule 14).
            ctx = policy.classify_context(self.settings, backend, cycle.listed_at, limits,
                                          listed=ListedInstances(batch.groups, backend.settings.tag_key),
                                          recheck_protections=cycle.mode == "delete")
            app = classify_batch(batch, records, ctx, mode=cycle.mode, record_all=cycle.record_all)
            result = session.apply(app)
        if result.status == "duplicate":
            # The first delivery may have crashed after its apply committed and before
            # completing the listing: completing is fenced and idempotent, so retry it.
            self._complete_listing(cycle, backend, limits)
        if result.status != "applied":
            return BatchResult(status=result.status)
        self.reporter.count("GroupsListed", len(batch.groups), backend.id)
        for verdict, n in app.counts.items():
            self.reporter.count(f"Groups_{verdict}", n, backend.id)
        for row in app.to_report:
            self.reporter.orphan(backend.id, batch.cycle_id, row.as_dict())
        for message, row in app.errors:
            self.reporter.error(message, backend=backend.id, provider_ref=row.group.provider_ref,
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
            self.reporter.error("listing batch refused: it disagrees with its cycle", backend=cycle.backend_id,
                                cycle_id=cycle.id, fields=",".join(wrong), seq=batch.seq)
            raise MessageRefused(f"batch {batch.seq} of cycle {cycle.id} refused: its {', '.join(wrong)}"
                                 " differ from the cycle's")

    def _complete_listing(self, cycle: CycleContext, backend: Backend, limits: Limits) -> None:
        cycle_id = cycle.id
        if cycle.mode != "delete":
            cycle_state.finish_if_complete(self.store, cycle_id, limits, self._now())
            return
        try:
            dispatch = cycle_state.dispatch_deletes(self.store, cycle_id, limits, self._now())
        except LeaseLost:
            return
        if dispatch.blocked:
            self.reporter.error("blast-radius cap: deleted nothing", backend=backend.id, reason=str(dispatch.blocked))
        for group in dispatch.groups:
            self.delete_queue.publish(DeleteRequest(cycle_id=cycle_id, backend=backend.id, group=group))
