"""The steps of a cycle, composed: the lister (the tick, STEP 1-2: ``lister.py``), the
classifier (STEP 3-6: ``classifier.py``) and the deleter (gate, re-verify, delete, record:
``deleter.py``), each on the one ``StepContext`` a ``Pipeline`` makes, with the queues it
uses. Whichever piece finishes last applies STEP 7 inside its fenced transaction
(``cycle_state``).

The steps are the only callers of the pure core (``classify``, ``delete_rules``,
``policy``): they read facts from the ledger store, ask for the decision and hand it
back to the store. The ``Pipeline`` is what the entry points, the CLI, the demo and the
manual runner hold: it answers each call with the step that owns it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Generic, TypeVar, overload

from orphan_cleanup.core.backends import Mode
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch, ListingJob
from orphan_cleanup.core.results import BatchResult, JobResult, ListerResult, TickResult
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.core.verdicts import DeleteOutcome
from orphan_cleanup.cycle.classifier import Classifier
from orphan_cleanup.cycle.deleter import Deleter
from orphan_cleanup.cycle.lister import Lister, StartedCycle
from orphan_cleanup.cycle.python_gc import gc_paused
from orphan_cleanup.cycle.reporting import Reporter
from orphan_cleanup.cycle.step_context import ProviderFactory, StepContext
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.queues.base import Queue

T = TypeVar("T")


class _Kept(Generic[T]):
    """An attribute of the ``Pipeline`` kept by one of its parts (``part``: the shared
    context or a step): read there and replaced there, so that every step sees a
    replacement (a test's clock, a provider factory) at its next call."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, pipeline: None, owner: type) -> _Kept[T]: ...

    @overload
    def __get__(self, pipeline: Pipeline, owner: type) -> T: ...

    def __get__(self, pipeline: Pipeline | None, owner: type) -> T | _Kept[T]:
        return self if pipeline is None else getattr(getattr(pipeline, self.part), self.name)

    def __set__(self, pipeline: Pipeline, value: T) -> None:
        setattr(getattr(pipeline, self.part), self.name, value)


class Pipeline:
    """Built by ``entrypoints/bootstrap.build_pipeline`` (tests build it directly)."""

    settings: _Kept[Settings] = _Kept("context")
    db: _Kept[Database] = _Kept("context")
    provider_for: _Kept[ProviderFactory] = _Kept("context")
    reporter: _Kept[Reporter] = _Kept("context")
    clock: _Kept[Callable[[], datetime] | None] = _Kept("context")
    listing_queue: _Kept[Queue] = _Kept("lister")
    jobs_queue: _Kept[Queue | None] = _Kept("lister")
    ledger_keys: _Kept[bool] = _Kept("lister")
    delete_queue: _Kept[Queue] = _Kept("classifier")

    def __init__(self, *, settings: Settings, db: Database, provider_for: ProviderFactory, listing_queue: Queue,
                 delete_queue: Queue, reporter: Reporter | None = None, jobs_queue: Queue | None = None,
                 clock: Callable[[], datetime] | None = None, ledger_keys: bool = True) -> None:
        """``jobs_queue``: the tick's listing jobs (the deployed functions; None where there
        is no tick). ``clock``: None, every compared timestamp is the database's (SAFETY.md
        rule 13); tests and the simulation may inject one. ``ledger_keys``: False in the
        deployed functions, which refuse a backend whose row holds a service-account key
        (or a key file path): ``policy.ledger_key_refusal``; the CLI and the demo accept them."""
        self.context = StepContext(settings=settings, db=db, provider_for=provider_for,
                                   reporter=Reporter() if reporter is None else reporter, clock=clock)
        self.lister = Lister(self.context, listing_queue, jobs_queue, ledger_keys)
        self.classifier = Classifier(self.context, delete_queue)
        self.deleter = Deleter(self.context)

    @property
    def store(self) -> LedgerStore:
        return self.context.store

    # ---- the lister ------------------------------------------------------------------

    @gc_paused  # 10,000 rows of acyclic, short-lived objects: see python_gc
    def run_tick(self) -> TickResult:
        return self.lister.run_tick()

    def run_job(self, job: ListingJob) -> JobResult:
        return self.lister.run_job(job)

    def run_lister(self, backend_id: str, *, mode: Mode | None = None, manual: bool = False) -> ListerResult:
        return self.lister.run_lister(backend_id, mode=mode, manual=manual)

    def start_cycle(self, backend_id: str, *, mode: Mode | None, manual: bool) -> StartedCycle | ListerResult:
        return self.lister.start_cycle(backend_id, mode=mode, manual=manual)

    def list_cycles(self, group: list[StartedCycle]) -> list[ListerResult]:
        return self.lister.list_cycles(group)

    # ---- the classifier and the deleter ------------------------------------------------

    @gc_paused  # its objects are acyclic and short-lived: see python_gc
    def handle_batch(self, batch: ListingBatch) -> BatchResult:
        return self.classifier.handle_batch(batch)

    def handle_delete(self, request: DeleteRequest, holder: str | None = None) -> DeleteOutcome:
        return self.deleter.handle_delete(request, holder)
