"""One full cycle of one backend in this process (``orphan-cleanup run``):
the same steps as the deployed functions, through in-process queues."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import TypeAdapter

from orphan_cleanup.errors import ConfigError, OrphanCleanupError
from orphan_cleanup.ledger.records import CycleReport
from orphan_cleanup.messages import DeleteRequest, ListingBatch
from orphan_cleanup.models import Mode
from orphan_cleanup.pipeline import GateBusy, Pipeline
from orphan_cleanup.queues.memory import InProcessQueue

Progress = Callable[[str], None]
_batch = TypeAdapter(ListingBatch)
_delete = TypeAdapter(DeleteRequest)


def run_cycle(pipeline: Pipeline, backend_id: str, *, mode: Mode | None = None,
              progress: Progress = lambda _m: None) -> CycleReport:
    """Run lister, classifier and deleter to completion; return the C3 report.
    The pipeline's queues must be in-process ones: this process drains them."""
    lq, _ = in_process_queues(pipeline)
    progress(f"listing {backend_id} ...")
    classified = 0

    def classify_now(body: str) -> None:
        nonlocal classified
        pipeline.handle_batch(_batch.validate_json(body))
        classified += 1
        progress(f"classified batch {classified}")

    lq.consumer = classify_now
    try:
        summary = pipeline.run_lister(backend_id, mode=mode, manual=True)
    finally:
        lq.consumer = None
    if not summary.cycle_id:
        if summary.reason == "off":
            raise BackendOff(f"backend {backend_id} is off (its mode, or the global one, is off): nothing runs")
        raise CycleNotStarted(backend_id, summary.reason)
    drain(pipeline, progress)
    return pipeline.store.cycle_report(summary.cycle_id)


class BackendOff(ConfigError):
    """``off`` is final: no ``--mode`` runs a backend whose mode is off (exit 2)."""


class CycleNotStarted(OrphanCleanupError):
    """A manual run could not start a cycle (another cycle holds the lease)."""

    REASONS = {"busy": "another cycle of this backend is running (its lease has not expired)"}

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(f"no cycle started for {backend_id}: {self.REASONS.get(reason, reason)}")
        self.reason = reason


def in_process_queues(pipeline: Pipeline) -> tuple[InProcessQueue, InProcessQueue]:
    lq, dq = pipeline.listing_queue, pipeline.delete_queue
    if not isinstance(lq, InProcessQueue) or not isinstance(dq, InProcessQueue):
        raise TypeError("a manual run drains in-process queues: build the pipeline with InProcessQueue")
    return lq, dq


def drain(pipeline: Pipeline, progress: Progress = lambda _m: None) -> None:
    lq, dq = in_process_queues(pipeline)
    n_batches = n_deletes = 0
    busy_rounds = 0
    while len(lq) or len(dq):
        while (body := lq.pop()) is not None:
            pipeline.handle_batch(_batch.validate_json(body))
            n_batches += 1
            progress(f"classified batch {n_batches}")
        while (body := dq.pop()) is not None:
            try:
                pipeline.handle_delete(_delete.validate_json(body))
            except GateBusy:
                busy_rounds += 1
                if busy_rounds > 1000:
                    raise
                dq.requeue(body)
                continue
            n_deletes += 1
            progress(f"deleted group {n_deletes}")
