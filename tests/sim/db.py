"""The database boundary of the simulation: a connection pool that injects
faults, the simulated clock inside Postgres, and a fast reset between seeds.

``SimDatabase`` is the product's ``Database`` with ``connect()`` served from a
pool (a new pg8000 connection costs ~40 ms; a step makes dozens). Everything
above ``connect()`` (transactions, error translation, every query) is the
product's own code. The pool is also the fault injector: a checkout can fail
like a refused connection, a statement can find its connection dropped before
it runs (the server rolls the transaction back) or lose its answer after it ran
(committed, but the caller sees a network error), and idle pooled backends are
killed for real with ``pg_terminate_backend`` between steps.

Clock choice (documented in README.md): the product reads every compared
timestamp from the database clock ``oc_clock()`` (SAFETY.md rule 13), and the
simulation puts that clock on simulated time:

- ``oc_sim_now()`` is the time the platform set for its transaction
  (``set_config('oc_sim.now', t, true)``: its writes carry explicit timestamps
  and may commit steps later), else the simulated clock, a one-row table
  ``oc_sim_clock`` that the engine updates (one UPDATE on the admin connection)
  whenever ``SimClock`` advances. ``oc_clock()`` becomes ``SELECT oc_sim_now()``,
  so ``listed_at``, cycle start and deadline, ``clean_at``, ``next_due_at``, the
  finish time and ``ledger_activity.at`` (the STEP 1 triggers' stamp, whose
  column default is ``oc_clock()``) are all simulated times. A platform write
  made at simulated time *t* is stamped *t* even when it commits steps later,
  exactly as ``clock_timestamp()`` behaves in production.
- ``delete_gates.expires_at`` (``now() + ttl``, compared with ``now()``): when
  *d* simulated seconds have passed, every gate's expiry moves back by *d*
  before the next piece of the cleanup runs, which is what *d* seconds passing
  would do to it.

Other ``now()`` columns (events.at, updated_at, last_seen ...) are
informational and never decide anything the invariants look at.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pg8000.native
from pg8000.exceptions import InterfaceError as PgInterfaceError

from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.ledger.db import ConnInfo, Database, connect
from tests.sim.world import Dice

SIM_CLOCK_SQL = """
CREATE TABLE IF NOT EXISTS oc_sim_clock (id int PRIMARY KEY CHECK (id = 1), t timestamptz NOT NULL);
INSERT INTO oc_sim_clock VALUES (1, clock_timestamp()) ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION oc_sim_now() RETURNS timestamptz LANGUAGE sql VOLATILE AS
$$ SELECT coalesce(CAST(nullif(current_setting('oc_sim.now', true), '') AS timestamptz),
                   (SELECT t FROM oc_sim_clock WHERE id = 1), clock_timestamp()) $$;
CREATE OR REPLACE FUNCTION oc_clock() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$ SELECT oc_sim_now() $$;
ALTER TABLE ledger_activity ALTER COLUMN at SET DEFAULT oc_clock();
"""

#: Every table a run writes, emptied between seeds (DELETE: much faster than
#: TRUNCATE on a few hundred rows). ledger_activity last: deleting instances logs activity.
TABLES = ("provider_journal", "region_listings", "events", "delete_requests", "delete_gates", "orphan_resources",
          "orphans", "cycle_groups", "cycle_batches", "cycles", "cleanup", "instances", "volumes", "provider_refs",
          "backends", "retired_coverages", "events", "ledger_activity")


def prepare(db: Database) -> None:
    """Put a migrated database on the simulated clock (idempotent)."""
    with db.transaction() as conn:
        conn.run(SIM_CLOCK_SQL)


def reset(conn: pg8000.native.Connection) -> None:
    conn.run("; ".join(f"DELETE FROM {t}" for t in TABLES))
    # A retired coverage's id is '<backend id>~<n>' from a sequence (rule 24): each seed
    # starts it afresh, so a seed names its coverages alike on every replay.
    conn.run("ALTER SEQUENCE retired_coverages_seq RESTART")


def set_db_clock(conn: pg8000.native.Connection, now: datetime) -> None:
    """The database clock (``oc_clock()`` outside platform transactions) reads ``now``."""
    conn.run("UPDATE oc_sim_clock SET t = :t WHERE id = 1", t=now)


def set_sim_now(conn: Any, now: datetime) -> None:
    """Stamp this transaction's activity rows with simulated time (see the module docstring)."""
    conn.run("SELECT set_config('oc_sim.now', :t, true)", t=now.isoformat())


def shift_gates(conn: pg8000.native.Connection, seconds: int) -> None:
    """``seconds`` of simulated time pass for the gates' ``now()``-based expiry."""
    conn.run("UPDATE delete_gates SET expires_at = expires_at - make_interval(secs => :d)", d=seconds)


class DbFaults:
    """Decides, per checkout and per statement, whether the connection fails."""

    def __init__(self, dice: Dice) -> None:
        self.dice = dice

    def refuse_connect(self) -> bool:
        return self.dice.roll("db_connect_error")

    def drop_before(self) -> bool:
        return self.dice.roll("db_drop")

    def lose_ack(self) -> bool:
        return self.dice.roll("db_ack_lost")


class PooledConnection:
    """One checkout of a pooled pg8000 connection. ``close()`` gives it back."""

    def __init__(self, pool: ConnectionPool, raw: pg8000.native.Connection) -> None:
        self._pool = pool
        self._raw: pg8000.native.Connection | None = raw

    def run(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        raw = self._raw
        if raw is None:
            raise PgInterfaceError("connection is closed")
        faults = self._pool.faults
        if faults is not None and faults.drop_before():
            self._discard()
            self._pool.note(f"db: connection dropped before `{_short(sql)}`")
            raise PgInterfaceError("network error: connection dropped (injected)")
        try:
            result = raw.run(sql, *args, **kwargs)
        except BaseException:
            # pg8000 errors, or a raw socket error (ConnectionResetError) from a killed backend.
            self._discard()
            raise
        if faults is not None and faults.lose_ack():
            self._discard()
            self._pool.note(f"db: answer lost after `{_short(sql)}` ran")
            raise PgInterfaceError("network error: connection dropped after the statement (injected)")
        return result

    @property
    def columns(self) -> Any:
        return self._raw.columns if self._raw is not None else None

    @property
    def row_count(self) -> int:
        return self._raw.row_count if self._raw is not None else -1

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            self._pool.release(raw)

    def _discard(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            self._pool.discard(raw)


def _short(sql: str) -> str:
    text = " ".join(sql.split())
    return text[:48] + ("…" if len(text) > 48 else "")


class ConnectionPool:
    """Idle pg8000 connections to one database, with optional fault injection."""

    def __init__(self, info: ConnInfo, faults: DbFaults | None = None,
                 note: Callable[[str], None] = lambda _m: None) -> None:
        self.info = info
        self.faults = faults
        self.note = note
        self._idle: list[pg8000.native.Connection] = []
        self._pids: dict[int, int] = {}
        self.opened = 0

    def acquire(self) -> PooledConnection:
        if self.faults is not None and self.faults.refuse_connect():
            self.note("db: connection refused")
            raise DatabaseError("cannot connect to the database: connection refused (injected)")
        raw = self._idle.pop() if self._idle else self._open()
        return PooledConnection(self, raw)

    def _open(self) -> pg8000.native.Connection:
        raw = connect(self.info, application_name="oc-sim")
        # A lock wait in a single-threaded simulation would be a deadlock: fail fast instead.
        raw.run("SET lock_timeout = '5s'")
        # Durability of a test database does not matter: commits need not wait for the WAL flush.
        raw.run("SET synchronous_commit = off")
        self._pids[id(raw)] = raw.run("SELECT pg_backend_pid()")[0][0]
        self.opened += 1
        return raw

    def release(self, raw: pg8000.native.Connection) -> None:
        if getattr(raw, "_transaction_status", b"I") != b"I":
            try:
                raw.run("ROLLBACK")
            except Exception:  # noqa: BLE001 - a broken connection is simply dropped
                self.discard(raw)
                return
        self._idle.append(raw)

    def discard(self, raw: pg8000.native.Connection) -> None:
        self._pids.pop(id(raw), None)
        try:
            raw.close()
        except Exception:  # noqa: BLE001 - already broken
            pass

    def kill_next(self, admin: pg8000.native.Connection) -> int:
        """Terminate the server side of the connection the next checkout gets: that
        use fails for real (one failure, whatever the pool's size: determinism)."""
        if not self._idle:
            self._idle.append(self._open())
        pid = self._pids.get(id(self._idle[-1]))
        if pid is None:
            return 0
        # pg_terminate_backend only signals: wait until the backend is gone.
        admin.run("SELECT pg_terminate_backend(:p, 5000)", p=pid)
        return 1

    def close_all(self) -> None:
        for raw in self._idle:
            self.discard(raw)
        self._idle.clear()


class SimDatabase(Database):
    """The product's ``Database``, its connections served by a ``ConnectionPool``."""

    def __init__(self, pool: ConnectionPool) -> None:
        super().__init__(pool.info)
        self.pool = pool

    def connect(self) -> Any:
        return self.pool.acquire()
