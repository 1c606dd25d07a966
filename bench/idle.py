"""Benchmark 4: the cost of a scheduled run when nothing happened.

A backend whose last cycle was clean, with no ledger activity since
``clean_at`` (the setup's activity is dated an hour back, as if it happened
then), run by its schedule when due (the pipeline's clock moves one interval
per run). Each scheduled lister run (``Pipeline.run_lister(backend,
manual=False)``) is counted: statements (a proxy around the connection's
``run``), connections, transactions, provider calls (the in-memory cloud's
counters and how often a provider was built). Baselines in the same run:
the STEP 1 activity query alone on an open connection (the target: one small
query), and a scheduled run right after one ledger change (it must list).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

from bench.classifier import quiet_reporter
from bench.common import CountingDatabase, PgServer, Table, median
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import drain
from orphan_cleanup.ledger.queries import activity_since
from orphan_cleanup.queues.memory import InProcessQueue

BACKEND = "mem"
REPS = 20


def run(server: PgServer) -> list[Table]:
    from tests.support.memory_cloud import MemoryCloud, MemoryProvider
    from tests.support.platform import Platform, add_backend

    db = server.fresh_database("oc_bench_idle")
    try:
        add_backend(db, BACKEND, regions=("r1", "r2"))
        cloud = MemoryCloud()
        platform = Platform(db, cloud, BACKEND)
        for i in range(20):
            platform.tracked(region=("r1", "r2")[i % 2])
        with db.transaction() as conn:  # 100k older activity rows: the STEP 1 query must stay indexed
            conn.run("INSERT INTO ledger_activity (backend_id, at, kind)"
                     " SELECT CASE WHEN i % 3 = 0 THEN NULL ELSE 'b' || (i % 50) END,"
                     "        now() - interval '2 days' + i * interval '1 second', 'bench'"
                     "   FROM generate_series(1, 100000) AS i")
            conn.run("ANALYZE ledger_activity")
        builds = Counter()

        def provider_for(backend: Any) -> Any:
            builds["provider"] += 1
            return MemoryProvider(backend, cloud)

        counting = CountingDatabase(db.info)
        pipeline = Pipeline(settings=Settings(), db=counting, provider_for=provider_for,
                            listing_queue=InProcessQueue(), delete_queue=InProcessQueue(), reporter=quiet_reporter())
        first = pipeline.run_lister(BACKEND, manual=False)
        drain(pipeline)
        _backdate(db)
        with db.connection() as conn:
            clean_at, outcome = conn.run("SELECT clean_at, last_outcome FROM cleanup WHERE backend_id = :b",
                                         b=BACKEND)[0]
        assert outcome == "clean" and clean_at is not None, (first, outcome)

        table = Table("Idle cost: one scheduled lister run of a backend with no ledger activity since clean_at",
                      ["run", "listed?", "reason", "statements", "connections", "transactions",
                       "provider builds", "provider calls", "ms", "connect ms", "x floor"])
        floor = _floor(db, clean_at)
        idle = [_scheduled(pipeline, counting, cloud, builds) for _ in range(REPS)]
        _row(table, "scheduled, idle", idle, floor)
        one = [_one_statement(counting, pipeline) for _ in range(REPS)]
        assert all(r["idle"] for r in one), "the one-statement check disagrees with run_lister"
        one_ms = median([r["ms"] for r in one])
        table.add(**{"run": "proposal: idle check in one statement", "listed?": "no", "reason": "no_activity",
                     "statements": one[-1]["statements"], "connections": one[-1]["connections"], "transactions": 0,
                     "provider builds": 0, "provider calls": 0, "ms": one_ms,
                     "connect ms": median([r["connect"] for r in one]), "x floor": one_ms / (floor * 1000)})
        table.add(**{"run": "floor: STEP 1 activity query alone", "listed?": "-", "reason": "-", "statements": 1,
                     "connections": 0, "transactions": 0, "provider builds": 0, "provider calls": 0,
                     "ms": floor * 1000, "connect ms": 0.0, "x floor": 1.0})
        platform.tracked(region="r1")  # one ledger change: the next scheduled run must list
        active = [_scheduled(pipeline, counting, cloud, builds)]
        drain(pipeline)
        _row(table, "scheduled, after one ledger change", active, floor)
        table.notes += [
            f"median of {REPS} idle runs; statements = every run() on the run's connections (BEGIN/COMMIT included);"
            " connections are opened per step (each adds a startup and SET statement_timeout).",
            "ledger_activity holds 100,000 older rows; the idle decision uses its (backend_id, at) index.",
        ]
        return [table]
    finally:
        server.drop(db)


# What a scheduled run could do first (bench-only sketch, not product code): one
# autocommit statement that marks an idle, due, unleased backend processed and
# returns a row, or returns nothing when the run must go the full way (enroll,
# lease, list). Same rules as start_cycle + may_have_new_orphans for a backend
# whose mode and interval come from the process settings.
IDLE_CHECK_SQL = """
UPDATE cleanup c SET last_processed_at = :now, next_due_at = :now + make_interval(secs => :interval)
  FROM backends k
 WHERE c.backend_id = :b AND k.id = c.backend_id
   AND c.lease_owner IS NULL AND c.next_due_at <= :now
   AND c.clean_at IS NOT NULL AND c.clean_mode = coalesce(k.mode, :mode)
   AND NOT EXISTS (SELECT 1 FROM ledger_activity a WHERE a.backend_id = c.backend_id AND a.at > c.clean_at)
   AND NOT EXISTS (SELECT 1 FROM ledger_activity a WHERE a.backend_id IS NULL AND a.at > c.clean_at)
RETURNING c.backend_id
"""


def _one_statement(counting: CountingDatabase, pipeline: Pipeline) -> dict[str, Any]:
    due = _clock(pipeline) + timedelta(seconds=pipeline.settings.interval_seconds + 60)
    pipeline.clock = lambda: due
    counting.counter.reset()
    start = time.perf_counter()
    with counting.connection() as conn:
        rows = conn.run(IDLE_CHECK_SQL, now=due, interval=pipeline.settings.interval_seconds, b=BACKEND,
                        mode=pipeline.settings.mode)
    elapsed = time.perf_counter() - start
    return {"idle": bool(rows), "ms": elapsed * 1000, "statements": counting.counter.statements,
            "connections": counting.counter.connections, "connect": counting.counter.connect_seconds * 1000}


def _clock(pipeline: Pipeline) -> datetime:
    """The time the pipeline runs at: its injected clock once a run moved it on."""
    return pipeline.clock() if pipeline.clock is not None else datetime.now(timezone.utc)


def _backdate(db: Any) -> None:
    """Date every ledger change an hour back, so the last cycle's clean_at is after it."""
    with db.transaction() as conn:
        conn.run("UPDATE ledger_activity SET at = at - interval '1 hour' WHERE kind <> 'bench'")


def _floor(db: Any, clean_at: datetime) -> float:
    times = []
    with db.connection() as conn:
        for _ in range(REPS):
            start = time.perf_counter()
            assert not activity_since(conn, BACKEND, clean_at)
            times.append(time.perf_counter() - start)
    return median(times)


def _scheduled(pipeline: Pipeline, counting: CountingDatabase, cloud: Any, builds: Counter) -> dict[str, Any]:
    # The schedule fires when the backend is due: move the pipeline's clock one interval on.
    due = _clock(pipeline) + timedelta(seconds=pipeline.settings.interval_seconds + 60)
    pipeline.clock = lambda: due
    counting.counter.reset()
    calls_before, builds_before = sum(cloud.calls.values()), builds["provider"]
    start = time.perf_counter()
    summary = pipeline.run_lister(BACKEND, manual=False)
    elapsed = time.perf_counter() - start
    sql = counting.counter.sql
    return {"summary": summary, "ms": elapsed * 1000, "connect": counting.counter.connect_seconds * 1000,
            "statements": counting.counter.statements,
            "connections": counting.counter.connections, "transactions": sum(1 for s in sql if s == "BEGIN"),
            "builds": builds["provider"] - builds_before, "calls": sum(cloud.calls.values()) - calls_before}


def _row(table: Table, name: str, runs: list[dict[str, Any]], floor: float) -> None:
    last = runs[-1]
    ms = median([r["ms"] for r in runs])
    table.add(**{"run": name, "listed?": "yes" if last["summary"].started else "no",
                 "reason": last["summary"].reason, "statements": last["statements"],
                 "connections": last["connections"], "transactions": last["transactions"],
                 "provider builds": last["builds"], "provider calls": last["calls"], "ms": ms,
                 "connect ms": median([r["connect"] for r in runs]),
                 "x floor": ms / (floor * 1000)})
