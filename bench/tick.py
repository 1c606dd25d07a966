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
SCALE_BACKENDS = 10_000  # enrolled backends of ``tick_at_scale``
VMS = 300


def run(server: PgServer, sizes: tuple[int, ...] = (1, 5, 20, 50),
        scale_backends: int = SCALE_BACKENDS) -> list[Table]:
    """The shared-listing table, then the tick's statement at ``scale_backends`` backends."""
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
    return [table, tick_at_scale(server, scale_backends)]


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


# ---- the tick's statement at 10,000 enrolled backends (issue #17 item 5) ----------------


def enroll_many(db: Any, n: int, accounts: int = 100) -> None:
    """``n`` enrolled backends over ``accounts`` accounts, each cleaned an hour ago in
    report mode and due now, with ledger activity before their clean (so STEP 1's
    EXISTS probes find rows to skip): the tick finds every one idle. Two statements."""
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " SELECT 'proj-' || lpad(i::text, 5, '0'), 'aws', (100000000000 + i % :a)::text, '{r1}', '{}',"
                 " 'report' FROM generate_series(0, :n - 1) AS i", n=n, a=accounts)
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id, issued_at)"
                 " SELECT lpad(i::text, 12, '0'), 'inst-' || i, now() - interval '2 hours'"
                 " FROM generate_series(0, 999) AS i")
        conn.run("UPDATE ledger_activity SET at = now() - interval '2 hours'")
        conn.run("INSERT INTO cleanup (backend_id, clean_at, clean_mode, next_due_at)"
                 " SELECT id, now() - interval '1 hour', 'report', now() - interval '1 second' FROM backends")
        conn.run("ANALYZE")


def tick_at_scale(server: PgServer, n: int = SCALE_BACKENDS, reps: int = 5) -> Table:
    from bench.common import median
    from orphan_cleanup.ledger import queries

    db = server.fresh_database("oc_bench_tick_scale")
    try:
        enroll_many(db, n)
        with db.connection() as conn:
            plan = conn.run("EXPLAIN (ANALYZE, FORMAT JSON) " + queries.TICK_SQL)[0][0]
            plan = plan if isinstance(plan, list) else __import__("json").loads(plan)
            explain_ms = plan[0]["Execution Time"]
            stmt = []
            for _ in range(reps):
                start = time.perf_counter()
                rows = queries.tick_rows_from_json(conn.run(queries.TICK_SQL)[0][0])
                stmt.append(time.perf_counter() - start)
            assert len(rows) == n
        counting = CountingDatabase(db.info)
        pipeline = Pipeline(settings=Settings(), db=counting, provider_for=_no_provider,
                            listing_queue=InProcessQueue(), delete_queue=InProcessQueue(), jobs_queue=InProcessQueue(),
                            reporter=quiet_reporter())
        counting.counter.reset()
        start = time.perf_counter()
        result = pipeline.run_tick()
        tick_ms = (time.perf_counter() - start) * 1000
        assert not result.jobs and len(result.skipped) == n, result.skipped  # every backend idle: marked
        statements = counting.counter.statements
        with db.connection() as conn:
            marked = conn.run("SELECT count(*) FROM cleanup WHERE last_processed_at IS NOT NULL")[0][0]
        assert marked == n
    finally:
        server.drop(db)
    table = Table(f"Tick: due selection at {n:,} enrolled backends (100 accounts, every one idle)",
                  ["backends", "TICK_SQL ms (fetch)", "server exec ms (EXPLAIN ANALYZE)", "run_tick ms",
                   "statements", "idle marked"])
    table.add(**{"backends": n, "TICK_SQL ms (fetch)": median(stmt) * 1000,
                 "server exec ms (EXPLAIN ANALYZE)": explain_ms, "run_tick ms": tick_ms,
                 "statements": statements, "idle marked": marked})
    table.notes += [f"TICK_SQL ms = median of {reps} runs of the statement with pg8000 on an open connection, "
                    "its document decoded into rows (queries.tick_rows_from_json); run_tick = the statement, "
                    "STEP 1 in Python for every row, and mark_idle_many.",
                    "statements = run_tick's on the wire: the tick's one statement and one mark_idle_many "
                    "for every idle backend, whatever the count."]
    return table


def _no_provider(_backend: Any) -> Any:
    raise AssertionError("the tick makes no provider call")
