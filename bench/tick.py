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

import json
import time
from datetime import datetime
from typing import Any

import msgspec

from bench.classifier import quiet_reporter
from bench.common import CountingDatabase, PgServer, Table
from orphan_cleanup.core.messages import ListingJob
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.records import IdleSnapshot, TickRow
from orphan_cleanup.ledger.session import LedgerSession
from orphan_cleanup.queues.memory import InProcessQueue

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


# The baseline, measured in the same run: the tick's statement as it was before it left
# out the facts of backends due later than the horizon (one row of 15 columns per
# backend, the clock in every row), read the way ``LedgerSession.tick_rows`` read it
# (every backend validated by pydantic at every tick).
BASELINE_TICK_SQL = (
    "WITH enrolled AS (INSERT INTO cleanup (backend_id) SELECT b.id FROM backends b"
    "  WHERE EXISTS (SELECT 1 FROM provider_refs)"
    "  AND NOT EXISTS (SELECT 1 FROM cleanup k WHERE k.backend_id = b.id)"  # an anti-join: no conflict per row
    "  ON CONFLICT DO NOTHING RETURNING backend_id),"
    " scoped AS (SELECT s.id, " + queries.SCOPE_SQL.format(t="s") + " AS scope,"
    "  (SELECT max(a.at) FROM ledger_activity a WHERE a.backend_id = s.id) AS last_at FROM backends s),"
    " by_scope AS (SELECT scope, max(last_at) AS last_at FROM scoped GROUP BY scope),"
    " unknown AS (SELECT max(at) AS last_at FROM ledger_activity WHERE backend_id IS NULL),"
    " clk AS (SELECT oc_clock() AS now)"  # once per statement: one clock reading for every backend
    " SELECT coalesce(json_agg(json_build_array("
    + ", ".join(f"b.{c.strip()}" for c in queries.BACKEND_COLUMNS.split(",")) + ","
    " c.backend_id IS NOT NULL OR e.backend_id IS NOT NULL, c.clean_at, c.clean_mode,"
    " c.lease_owner IS NOT NULL, c.lease_expires_at, coalesce(c.retry_delay_seconds, 0), c.next_due_at,"
    " c.clean_at IS NOT NULL AND coalesce(bs.last_at > c.clean_at OR u.last_at > c.clean_at, false), clk.now)"
    " ORDER BY b.id), '[]')::text"
    " FROM backends b LEFT JOIN cleanup c ON c.backend_id = b.id"
    " LEFT JOIN enrolled e ON e.backend_id = b.id"
    # LEFT: a backend whose scope is NULL (no account) keeps its row, with no account activity (as before)
    " LEFT JOIN scoped sc ON sc.id = b.id LEFT JOIN by_scope bs ON bs.scope = sc.scope"
    " CROSS JOIN unknown u CROSS JOIN clk")
_BASELINE_ROWS = msgspec.json.Decoder(list[tuple[Any, Any, Any, Any, Any, Any, bool, datetime | None, str | None,
                                                 bool, datetime | None, int, datetime | None, bool, datetime]])


def _baseline_tick_rows(session: LedgerSession, *_: Any, **__: Any) -> list[TickRow]:
    out = []
    for row in _BASELINE_ROWS.decode(session.conn.run(BASELINE_TICK_SQL)[0][0]):
        backend = queries.backend_from_row(list(row[:6]))
        enrolled, clean_at, clean_mode, leased, expires, delay, next_due, active, clock = row[6:]
        snapshot = IdleSnapshot(clean_at=clean_at, clean_mode=clean_mode, leased=bool(leased),
                                retry_delay_seconds=delay, next_due_at=next_due,
                                activity_since_clean=bool(active), now=clock) if enrolled else None
        out.append(TickRow(backend=backend, snapshot=snapshot, lease_expires_at=expires))
    return out


# Steady state: a backend is due an interval (an hour) after its last run, so with a
# tick a minute the due times are spread over the hour: here each backend in one of 60
# minutes (a hash of its id, so every account has backends in most minutes), two
# minutes' worth (next_due_at 1 s ago, and 59 s ahead: within the 60 s tolerance) due.
SCENARIOS = {
    "steady: due times spread over the hour":
        "now() - interval '1 second' + make_interval(mins => ((hashtext(id)::bigint & 2147483647) % 60)::integer)",
    "worst: every backend due": "now() - interval '1 second'",
}


def tick_at_scale(server: PgServer, n: int = SCALE_BACKENDS, reps: int = 5) -> Table:
    """The tick's statement and ``run_tick`` at ``n`` enrolled backends, baseline and
    now, in both scenarios, the same run (interleaved, the state restored before each run)."""
    table = Table(f"Tick: due selection at {n:,} enrolled backends (100 accounts, no activity since the cleans)",
                  ["scenario", "statement", "rows with facts", "document KB", "server ms (EXPLAIN ANALYZE)",
                   "round trip ms", "run_tick ms", "run_tick ms (warm)", "statements", "idle marked",
                   "round trip x baseline", "run_tick x baseline"])
    for scenario, due_at in SCENARIOS.items():
        db = server.fresh_database("oc_bench_tick_scale")
        try:
            enroll_many(db, n)
            with db.connection() as conn:
                conn.run("VACUUM ANALYZE")  # as autovacuum leaves a table in steady state
                conn.run("CREATE TABLE bench_due AS SELECT id AS backend_id,"
                         " (" + due_at + ") - now() AS due_in"
                         " FROM backends")
            st = _measure_statements(db, n, reps)
            base, now_ = st["baseline"], st["now"]
            runs = _measure_run_tick(db, n, reps)
        finally:
            server.drop(db)
        for name, st, ms, warm in (("baseline (one row of facts per backend)", base, runs["baseline"], None),
                                   ("now (facts within the horizon only)", now_, runs["cold"], runs["warm"])):
            table.add(**{"scenario": scenario, "statement": name, "rows with facts": st["facts"],
                         "document KB": st["bytes"] / 1024, "server ms (EXPLAIN ANALYZE)": st["explain"],
                         "round trip ms": st["round trip"], "run_tick ms": ms,
                         "run_tick ms (warm)": warm if warm is not None else "-",
                         "statements": runs["statements"], "idle marked": runs["marked"],
                         "round trip x baseline": st["round trip"] / base["round trip"],
                         "run_tick x baseline": ms / runs["baseline"]})
    table.notes += [
        f"medians of {reps} runs (EXPLAIN: 3), baseline and now alternated (run_tick: baseline, now, now warm), "
        "the cleanup rows restored before each run_tick (same due times relative to the clock, "
        "last_processed_at NULL, VACUUM)",
        "round trip = the statement with pg8000 on an open connection and its document decoded "
        "(queries.tick_rows_from_json; the baseline: its row-per-backend document); server ms = EXPLAIN ANALYZE",
        "run_tick = the statement, the rows as TickRows, STEP 1 in Python for every row with facts and "
        "mark_idle_many for the idle ones, on a fresh pipeline (its first tick: every backend validated); "
        "warm = the same pipeline's next tick (backends whose row did not change are not validated again); "
        "baseline = run_tick with the statement and row reading it had before (bench/tick.py "
        "_baseline_tick_rows in place of LedgerSession.tick_rows) and the collector on, as it ran before "
        "(now: paused over run_tick, python_gc)",
        "statements = run_tick's on the wire: the tick's one statement and one mark_idle_many, whatever the count"]
    return table


def _restore(db: Any) -> None:
    with db.connection() as conn:
        conn.run("UPDATE cleanup c SET next_due_at = now() + d.due_in, last_processed_at = NULL"
                 " FROM bench_due d WHERE d.backend_id = c.backend_id")
        conn.run("VACUUM ANALYZE cleanup")


def _measure_statements(db: Any, n: int, reps: int) -> dict[str, dict[str, Any]]:
    """The baseline statement and the tick's, alternated on one connection."""
    from bench.common import median

    _restore(db)
    forms = {"baseline": (BASELINE_TICK_SQL, {}),
             "now": (queries.TICK_SQL, {"horizon": queries.TICK_HORIZON_SECONDS})}
    explain: dict[str, list[float]] = {k: [] for k in forms}
    times: dict[str, list[float]] = {k: [] for k in forms}
    out: dict[str, dict[str, Any]] = {}
    with db.connection() as conn:
        for _ in range(3):
            for name, (sql, params) in forms.items():
                plan = conn.run("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, **params)[0][0]
                plan = plan if isinstance(plan, list) else json.loads(plan)
                explain[name].append(plan[0]["Execution Time"])
        for _ in range(reps):
            for name, (sql, params) in forms.items():
                start = time.perf_counter()
                doc = conn.run(sql, **params)[0][0]
                if name == "baseline":
                    rows: list[Any] = _BASELINE_ROWS.decode(doc)
                    facts = len(rows)
                else:
                    _, rows = queries.tick_rows_from_json(doc)
                    facts = sum(1 for _, f in rows if f is not None)
                times[name].append(time.perf_counter() - start)
                assert len(rows) == n
                out[name] = {"bytes": len(doc), "facts": facts}
    for name in forms:
        out[name] |= {"explain": median(explain[name]), "round trip": median(times[name]) * 1000}
    return out


def _measure_run_tick(db: Any, n: int, reps: int) -> dict[str, Any]:
    from bench.common import median

    times: dict[str, list[float]] = {"baseline": [], "cold": [], "warm": []}
    counting = CountingDatabase(db.info)
    statements, marked = set(), set()
    for _ in range(reps):
        for kind in times:
            pipeline = Pipeline(settings=Settings(), db=counting, provider_for=_no_provider,
                                listing_queue=InProcessQueue(), delete_queue=InProcessQueue(),
                                jobs_queue=InProcessQueue(), reporter=quiet_reporter())
            if kind == "warm":
                _restore(db)
                pipeline.run_tick()  # the pipeline's first tick: its backends validated
            _restore(db)
            counting.counter.reset()
            real = LedgerSession.tick_rows
            if kind == "baseline":
                LedgerSession.tick_rows = _baseline_tick_rows  # type: ignore[method-assign]
            # the baseline: run_tick as it was, without the collector paused (python_gc)
            run = type(pipeline).run_tick.__wrapped__ if kind == "baseline" else type(pipeline).run_tick
            try:
                start = time.perf_counter()
                result = run(pipeline)
                times[kind].append(time.perf_counter() - start)
            finally:
                LedgerSession.tick_rows = real  # type: ignore[method-assign]
            statements.add(counting.counter.statements)
            assert not result.jobs and len(result.skipped) == n, result.skipped  # no activity: none listed
            with db.connection() as conn:
                marked.add(conn.run("SELECT count(*) FROM cleanup WHERE last_processed_at IS NOT NULL")[0][0])
    assert len(statements) == 1 and len(marked) == 1, (statements, marked)  # the same work every run
    return {k: median(v) * 1000 for k, v in times.items()} | {"statements": statements.pop(), "marked": marked.pop()}


def _no_provider(_backend: Any) -> Any:
    raise AssertionError("the tick makes no provider call")
