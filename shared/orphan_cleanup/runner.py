"""One full cycle of one backend in this process (``orphan-cleanup run``):
the same steps as the deployed functions, through in-process queues."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter

from orphan_cleanup.errors import ConfigError, OrphanCleanupError
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.models import DeleteRequest, ListingBatch, Mode
from orphan_cleanup.pipeline import GateBusy, Pipeline
from orphan_cleanup.queues.memory import InProcessQueue

Progress = Callable[[str], None]
_batch = TypeAdapter(ListingBatch)
_delete = TypeAdapter(DeleteRequest)


def run_cycle(pipeline: Pipeline, backend_id: str, *, mode: Mode | None = None,
              progress: Progress = lambda _m: None) -> dict[str, Any]:
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
    if not summary.get("cycle_id"):
        if summary.get("reason") == "off":
            raise BackendOff(f"backend {backend_id} is off (its mode, or the global one, is off): nothing runs")
        raise CycleNotStarted(backend_id, summary.get("reason", "unknown"))
    drain(pipeline, progress)
    return cycle_report(pipeline.db, summary["cycle_id"])


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


def cycle_report(db: Database, cycle_id: str) -> dict[str, Any]:
    with db.connection() as conn:
        c = conn.run("SELECT backend_id, mode, listed_at, outcome, failures, blocked_reason, error"
                     " FROM cycles WHERE id = :c", c=cycle_id)[0]
        # The report's groups as one JSON text built by Postgres, keeping only each
        # resource's kind and id: decoding full rows of a 100k-group run cost ~400 MB.
        groups = conn.run(
            "SELECT coalesce(json_agg(json_build_object('provider_ref', g.provider_ref, 'region', g.region,"
            " 'primary_id', g.primary_id, 'resources', (SELECT coalesce(json_agg(json_build_object("
            "  'kind', x->>'kind', 'id', x->>'id')), '[]') FROM jsonb_array_elements(g.resources) AS x),"
            " 'verdict', g.verdict, 'reason', g.reason, 'action', g.action)"
            " ORDER BY g.provider_ref, g.region, g.primary_id), '[]')::text"
            " FROM cycle_groups g WHERE g.cycle_id = :c", c=cycle_id)[0][0]
    failures = c[4] if isinstance(c[4], list) else json.loads(c[4] or "[]")
    return {
        "backend": c[0], "cycle_id": cycle_id, "mode": c[1],
        "listed_at": c[2].isoformat() if c[2] else None,
        "outcome": c[3] or "unsettled",
        "failures": [{"region": f["region"], "error": f["error"]} for f in failures],
        "groups": json.loads(groups),
        "blocked_reason": c[5],
        "error": c[6],
    }
