"""Benchmark: ``orphan-cleanup report`` on a year of history.

A synthetic ledger built with ``generate_series``: 100 backends (a third priced), a year
of orphans at 20 per backend per day (730,000 rows: each deleted 1 to 12 hours after it
became one, first listed 2 to 20 minutes after that; the last day's still open; one in 50
gone unlisted), and the cycles and cycle_groups such a history leaves (a cycle per backend
every 4 hours, a group row per orphan). Timed in the same run: the report's statement for
the stack and for one backend, over 30 days and over the whole year (``LedgerStore.
leak_report``, priced as the CLI prices it), the CLI itself (``report --json`` in a
subprocess: Python's start included), and the baselines: a bare count of the same
period's orphans (the floor: every row the report aggregates, counted) and ``orphans
--json`` (the read-only command beside it). ``--quick``: 10 backends, 60 days.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import PgServer, Table, median, stopwatch
from orphan_cleanup.cli.report_figures import price_tables, report_doc
from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.ledger.leaks import REPORT_END, explain, period
from orphan_cleanup.ledger.store import LedgerStore

PRICES = ('{"prices": {"instance_hour": {"m5.large": 0.096, "p3.2xlarge": 3.06, "g5.xlarge": 1.006},'
          ' "disk_gb_month": 0.08, "address_hour": 0.005}}')
PER_DAY = 20


def build(db: Database, backends: int, days: int) -> int:
    """The synthetic history; returns the orphans rows written."""
    # The build's statements run longer than a cycle's.
    conn = connect(db.info, timeout=1800, statement_timeout_ms=1_800_000)
    try:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " SELECT 'b' || i, 'aws', lpad(i::text, 12, '0'), '{us-east-1}',"
                 " CASE WHEN i % 3 = 0 THEN CAST(:p AS jsonb) ELSE '{}'::jsonb END"
                 " FROM generate_series(1, :n) AS i", p=PRICES, n=backends)
        # Orphan k of a backend became one at now - days + k * (1 day / PER_DAY), give or take.
        conn.run(f"""
            INSERT INTO orphans (backend_id, group_key, provider_ref, region, primary_id, resources, verdict, reason,
                                 state, first_seen, last_seen, orphan_since, deleted_at, size)
            SELECT 'b' || b, 'g' || b || '-' || k, lpad(to_hex(b * 1000000 + k), 12, '0'), 'us-east-1',
                   'i-' || b || '-' || k, '[]', 'orphan',
                   (ARRAY['owner_terminated', 'owner_deleted', 'primary_mismatch', 'owner_soft_deleted',
                          'leftover_of_orphan'])[1 + k % 5],
                   CASE WHEN since > now() - interval '1 day' THEN 'open' WHEN k % 50 = 0 THEN 'gone'
                        ELSE 'deleted' END,
                   since + (2 + k % 19) * interval '1 minute',
                   CASE WHEN since > now() - interval '1 day' THEN now()
                        ELSE since + (1 + k % 12) * interval '1 hour' END,
                   since,
                   CASE WHEN since > now() - interval '1 day' OR k % 50 = 0 THEN NULL
                        ELSE since + (1 + k % 12) * interval '1 hour' END,
                   jsonb_build_object('instance_type', (ARRAY['m5.large', 'p3.2xlarge', 'g5.xlarge'])[1 + k % 3],
                                      'disk_gb', 8 + (k % 4) * 50)
              FROM generate_series(1, :n) AS b, generate_series(0, :d * {PER_DAY} - 1) AS k,
                   LATERAL (SELECT now() - :d * interval '1 day' + k * interval '1 day' / {PER_DAY}
                                   + (b % 60) * interval '1 minute' AS since) s""", n=backends, d=days)
        conn.run("INSERT INTO cycles (id, backend_id, fence, mode, started_at, listed_at, deadline, outcome,"
                 " finished_at, groups_listed)"
                 " SELECT 'c' || b || '-' || k, 'b' || b, k, 'delete', t, t, t + interval '15 minutes', 'clean',"
                 " t + interval '1 minute', 40"
                 " FROM generate_series(1, :n) AS b, generate_series(0, :d * 6 - 1) AS k,"
                 " LATERAL (SELECT now() - :d * interval '1 day' + k * interval '4 hours' AS t) s", n=backends, d=days)
        conn.run(f"INSERT INTO cycle_groups (cycle_id, group_key, provider_ref, region, primary_id, resources,"
                 f" verdict, reason, action)"
                 f" SELECT 'c' || substr(o.group_key, 2, strpos(o.group_key, '-') - 2) || '-'"
                 f" || least(:d * 6 - 1, (split_part(o.group_key, '-', 2)::int * 6) / {PER_DAY}),"
                 " o.group_key, o.provider_ref, o.region, o.primary_id, o.resources, 'orphan', o.reason, 'deleted'"
                 " FROM orphans o", d=days)
        n = int(conn.run("SELECT count(*) FROM orphans")[0][0])
        conn.run("VACUUM ANALYZE orphans")
        conn.run("VACUUM ANALYZE cycles")
        conn.run("VACUUM ANALYZE cycle_groups")
    finally:
        conn.close()
    return n


def _in_process(db: Database, seconds: int, backend: str | None, reps: int) -> tuple[float, dict[str, Any]]:
    store = LedgerStore(db)
    times, doc = [], {}
    for _ in range(reps):
        with stopwatch() as t:
            figures, _ = store.leak_report(seconds, backend)
            doc = report_doc(figures, price_tables(figures.prices, warn=False))
        times.append(t[0])
    return median(times) * 1000, doc


def _floor(db: Database, seconds: int, backend: str | None, reps: int) -> float:
    """A bare count of the period's orphans: the rows the report reads, counted."""
    where = " AND o.backend_id = :b" if backend else ""
    times = []
    with db.connection() as conn:
        for _ in range(reps):
            since, until = period(conn, seconds)
            with stopwatch() as t:
                conn.run(f"SELECT count(*) FROM orphans o WHERE o.verdict = 'orphan' AND {REPORT_END} >= :s"
                         f" AND coalesce(o.orphan_since, o.first_seen) <= :u{where}", s=since, u=until,
                         **({"b": backend} if backend else {}))
            times.append(t[0])
    return median(times) * 1000


def _cli(db: Database, *args: str, reps: int) -> float:
    env = {**os.environ, "DATABASE_URL": db.info.url(), "NO_COLOR": "1"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root / "shared"), str(root), env.get("PYTHONPATH", "")])
    times = []
    for _ in range(reps):
        with stopwatch() as t:
            subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=env, check=True,
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
        times.append(t[0])
    return median(times) * 1000


def run(server: PgServer, quick: bool = False) -> list[Table]:
    backends, days, reps = (10, 60, 3) if quick else (100, 365, 5)
    db = server.fresh_database("oc_bench_report")
    try:
        with stopwatch() as built:
            rows = build(db, backends, days)
        table = Table(f"report: {rows:,} orphans rows ({backends} backends x {days} days x {PER_DAY}/day)",
                      ["query", "orphans counted", "ms", "floor ms", "x floor"])
        with db.connection() as conn:
            since, until = period(conn, 30 * 86400)
            plan = explain(conn, since, until)
            plan_one = explain(conn, since, until, "b1")
        for label, seconds, backend in (("stack, 30d", 30 * 86400, None), ("one backend, 30d", 30 * 86400, "b1"),
                                        (f"stack, {days}d (all of it)", days * 86400, None)):
            ms, doc = _in_process(db, seconds, backend, reps)
            floor = _floor(db, seconds, backend, reps)
            counted = sum(r["count"] for r in doc["by_backend"])
            table.add(**{"query": f"leak_report + pricing, {label}", "orphans counted": counted, "ms": ms,
                         "floor ms": floor, "x floor": ms / floor if floor else None})
        cli_reps = 2 if quick else 3
        report_ms = _cli(db, "report", "--json", reps=cli_reps)
        report_one_ms = _cli(db, "report", "--json", "--backend", "b1", reps=cli_reps)
        orphans_ms = _cli(db, "orphans", "--json", reps=cli_reps)
        table.add(**{"query": "CLI: report --json (stack, 30d)", "ms": report_ms, "floor ms": orphans_ms,
                     "x floor": report_ms / orphans_ms})
        table.add(**{"query": "CLI: report --json --backend b1", "ms": report_one_ms, "floor ms": orphans_ms,
                     "x floor": report_one_ms / orphans_ms})
        table.add(**{"query": "CLI baseline: orphans --json", "ms": orphans_ms, "floor ms": orphans_ms,
                     "x floor": 1.0})
        uses = [line.strip() for line in (plan + "\n" + plan_one).splitlines() if "orphans_report_" in line]
        table.notes += [
            f"ledger built in {built[0]:.0f} s; median of {reps} (CLI: {cli_reps}) runs; floor of a leak_report row:"
            " a bare count of the same period's orphans (same WHERE); floor of a CLI row: `orphans --json`.",
            "one statement for the figures (ledger/leaks.py); the plan's index use: "
            + ("; ".join(uses) if uses else "NONE (sequential scan)"),
        ]
        print("EXPLAIN of the report's statement (stack, 30d):", file=sys.stderr)
        print(plan, file=sys.stderr)
        return [table]
    finally:
        server.drop(db)
