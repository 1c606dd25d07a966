"""Shared helpers of the benchmarks: a Postgres server, counting proxies,
timing, results tables.

Every figure a benchmark prints is measured next to its baseline in the same
run; the tables show ratios, not absolute targets.
"""

from __future__ import annotations

import atexit
import os
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pg8000.native

from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.ledger.embedded import ensure_database, start_embedded
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.ledger.url import ConnInfo, parse_database_url

# ---- results ---------------------------------------------------------------------------


@dataclass
class Table:
    """One printed table: a title, columns, rows (dicts keyed by column), notes."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, **row: Any) -> None:
        self.rows.append(row)

    def render(self) -> str:
        cells = [[_fmt(r.get(c)) for c in self.columns] for r in self.rows]
        widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
                  for i, c in enumerate(self.columns)]
        line = "  ".join("-" * w for w in widths)
        out = [f"== {self.title}", "  ".join(c.ljust(w) for c, w in zip(self.columns, widths)), line]
        out += ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        out += [f"   {n}" for n in self.notes]
        return "\n".join(out)

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "notes": self.notes}


def _numeric(v: str) -> bool:
    return bool(v) and (v[0].isdigit() or v[0] in "-.") and v[-1] not in ":"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_tables(make: Callable[[], list[Table]]) -> None:
    """A benchmark module run on its own (``python -m bench.NAME``): its tables, then the time."""
    started = time.perf_counter()
    for table in make():
        print(table.render(), flush=True)
        print(flush=True)
    print(f"total {time.perf_counter() - started:.0f} s", flush=True)


# ---- timing ------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB.

    Linux's ``VmHWM`` belongs to this process image; ``ru_maxrss`` survives
    ``execve`` and so reports the parent's size in a freshly spawned child."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- Postgres ----------------------------------------------------------------------------


class PgServer:
    """The server every database benchmark uses: ``info`` (tests pass theirs),
    ``DATABASE_URL`` when set, otherwise an embedded Postgres in a temp dir
    deleted at exit."""

    def __init__(self, info: ConnInfo | None = None) -> None:
        url = os.environ.get("DATABASE_URL")
        if info is not None or url:
            self.info = info or parse_database_url(url or "")
            return
        runtime = tempfile.mkdtemp(prefix="oc-bench-xdg-")
        os.chmod(runtime, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = runtime
        data = tempfile.mkdtemp(prefix="oc-bench-pg-")
        # Registered before the server's own atexit hook, so it runs after the server stopped.
        atexit.register(shutil.rmtree, data, True)
        atexit.register(shutil.rmtree, runtime, True)
        self.info: ConnInfo = start_embedded(data, cleanup="delete")

    def fresh_database(self, prefix: str = "oc_bench") -> Database:
        """A new, migrated database (dropped by the server's cleanup, or by ``drop``)."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        db = Database(ensure_database(self.info, name))
        migrate(db)
        return db

    def clone(self, template: Database, prefix: str) -> Database:
        """A copy of ``template`` (which must have no open connection)."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        admin = connect(self.info.with_database("postgres"))
        try:
            admin.run(f'CREATE DATABASE "{name}" TEMPLATE "{template.info.database}"')
        finally:
            admin.close()
        return Database(self.info.with_database(name))

    def drop(self, db: Database) -> None:
        admin = connect(self.info.with_database("postgres"))
        try:
            admin.run(f'DROP DATABASE IF EXISTS "{db.info.database}" WITH (FORCE)')
        finally:
            admin.close()


# ---- counting proxies ---------------------------------------------------------------------


class CountingConnection:
    """Wraps a pg8000 connection and counts every ``run`` (one statement each)."""

    def __init__(self, conn: pg8000.native.Connection, counter: StatementCounter) -> None:
        self._conn = conn
        self._counter = counter

    def run(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._counter.statements += 1
        self._counter.sql.append(" ".join(sql.split())[:80])
        return self._conn.run(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@dataclass
class StatementCounter:
    statements: int = 0
    connections: int = 0
    connect_seconds: float = 0.0
    sql: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.statements = self.connections = 0
        self.connect_seconds = 0.0
        self.sql.clear()


class CountingDatabase(Database):
    """A ``Database`` whose connections count statements. Connection setup
    (startup handshake and ``SET statement_timeout``) is counted apart, in
    ``connections``."""

    def __init__(self, info: ConnInfo, counter: StatementCounter | None = None) -> None:
        super().__init__(info)
        self.counter = counter or StatementCounter()

    def connect(self) -> Any:
        start = time.perf_counter()
        conn = super().connect()
        self.counter.connect_seconds += time.perf_counter() - start
        self.counter.connections += 1
        return CountingConnection(conn, self.counter)


def call_counter(fn: Callable[..., Any], counts: dict[str, int], key: str) -> Callable[..., Any]:
    def wrapped(*a: Any, **kw: Any) -> Any:
        counts[key] = counts.get(key, 0) + 1
        return fn(*a, **kw)
    return wrapped
