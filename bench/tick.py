"""Benchmark: N backends on one account (dstack Sky: one backend per project, all on
the same base accounts), every one due, through the scheduler.

Baseline, in the same run: one listing per backend (what per-backend schedules did:
``run_lister(backend)`` for each). After: one tick (``run_tick``) and the jobs it
queued (``run_job``), where backends sharing provider, account, regions, tag keys
and credentials are listed once. Counted: provider listing calls (the in-memory
cloud's per-region list calls), identity checks, SQL statements, wall time of the
listing side (the classification of the batches is the same work either way and is
left out: each backend's cycle still classifies its own batches).
"""

from __future__ import annotations

import time
from typing import Any

from bench.classifier import quiet_reporter
from bench.common import CountingDatabase, PgServer, Table
from orphan_cleanup.messages import ListingJob
from orphan_cleanup.pipeline import Pipeline
from orphan_cleanup.queues.memory import InProcessQueue
from orphan_cleanup.settings import Settings

REGIONS = ("r1", "r2", "r3")
VMS = 300


def run(server: PgServer, sizes: tuple[int, ...] = (1, 5, 20, 50)) -> list[Table]:
    table = Table(f"Scheduler: N backends of one account ({len(REGIONS)} regions, {VMS} tracked VMs), all due",
                  ["backends", "scheduler", "list calls", "identity checks", "statements", "listing ms",
                   "calls x baseline"])
    for n in sizes:
        base = _measure(server, n, shared=False)
        tick = _measure(server, n, shared=True)
        for name, m in (("one listing per backend (baseline)", base), ("tick + shared listing", tick)):
            table.add(**{"backends": n, "scheduler": name, "list calls": m["list"], "identity checks": m["identity"],
                         "statements": m["statements"], "listing ms": m["ms"],
                         "calls x baseline": m["list"] / base["list"]})
    table.notes.append("list calls: one per region listing; a backend's cycle classifies its own batches either way")
    return [table]


def _measure(server: PgServer, n: int, *, shared: bool) -> dict[str, Any]:
    from tests.support.memory_cloud import MemoryCloud, MemoryProvider
    from tests.support.platform import Platform, add_backend

    db = server.fresh_database("oc_bench_tick")
    try:
        cloud = MemoryCloud()
        ids = [f"proj-{i:03}" for i in range(n)]
        for b in ids:
            add_backend(db, b, regions=REGIONS)
        for i in range(VMS):
            Platform(db, cloud, ids[i % n]).tracked(region=REGIONS[i % len(REGIONS)])
        counting = CountingDatabase(db.info)
        jobs = InProcessQueue()
        pipeline = Pipeline(settings=Settings(), db=counting, provider_for=lambda b: MemoryProvider(b, cloud),
                            listing_queue=InProcessQueue(), delete_queue=InProcessQueue(), jobs_queue=jobs,
                            reporter=quiet_reporter())
        cloud.calls.clear()
        counting.counter.reset()
        start = time.perf_counter()
        if shared:
            pipeline.run_tick()
            while (body := jobs.pop()) is not None:
                pipeline.run_job(ListingJob.model_validate_json(body))
        else:
            for b in ids:
                pipeline.run_lister(b)
        ms = (time.perf_counter() - start) * 1000
        batches = len(pipeline.listing_queue)  # type: ignore[arg-type]
        assert batches >= n, (batches, n)  # every backend's cycle got its batches
        return {"list": cloud.calls["list"], "identity": cloud.calls["identity"],
                "statements": counting.counter.statements, "ms": ms}
    finally:
        server.drop(db)
