"""Cycle bookkeeping in the database: enrollment, due selection, lease and
fence (STEP 1), fenced application of batches and deletions, STEP 7.

Lock order everywhere: the backend's ``cleanup`` row, then its ``cycles`` row.
Every write of a cycle checks ``cleanup.fence = cycles.fence``,
``cleanup.lease_owner = cycles.id`` and ``cycles.outcome IS NULL`` first.

One clock (DESIGN §5 rule 13): a function taking ``now: datetime | None`` reads
the database clock (``oc_clock()``) inside its own statement or transaction when
``now`` is None, which is what every deployed caller passes. Only tests and the
simulation inject a time.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pg8000.native

from orphan_cleanup import classify
from orphan_cleanup.errors import LeaseLost
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.queries import ACTIVITY_EXISTS, BACKEND_COLUMNS, activity_since, backend_from_row
from orphan_cleanup.models import Backend, Mode, Outcome, RegionFailure


@dataclass(frozen=True)
class Limits:
    """Effective per-backend limits (process settings overridden by backend settings)."""

    interval_seconds: int
    margin_seconds: int
    max_backoff_seconds: int
    cycle_deadline_seconds: int
    max_deletes: int
    max_delete_share: float


@dataclass(frozen=True)
class CycleRef:
    id: str
    backend_id: str
    fence: int
    mode: Mode


@dataclass(frozen=True)
class CycleContext:
    """What a cycle's own row says about it: the truth that queue messages only
    hint at (DESIGN §5 rule 12)."""

    id: str
    backend_id: str
    mode: Mode
    listed_at: datetime | None
    record_all: bool
    backend: Backend  # the cycle's backend row, as it is now


def db_now(conn: pg8000.native.Connection) -> datetime:
    """The database clock, the only clock compared with the ledger."""
    return conn.run("SELECT oc_clock()")[0][0]


def cycle_context(conn: pg8000.native.Connection, cycle_id: str) -> CycleContext | None:
    """The cycle's row and its backend's, in one statement (None: no such cycle)."""
    columns = ", ".join(f"b.{c.strip()}" for c in BACKEND_COLUMNS.split(","))
    rows = conn.run(f"SELECT c.id, c.backend_id, c.mode, c.listed_at, c.record_all, {columns}"
                    " FROM cycles c JOIN backends b ON b.id = c.backend_id WHERE c.id = :c", c=cycle_id)
    if not rows:
        return None
    cid, backend_id, mode, listed_at, record_all, *backend = rows[0]
    return CycleContext(id=cid, backend_id=backend_id, mode=mode, listed_at=listed_at, record_all=record_all,
                        backend=backend_from_row(backend))


@dataclass(frozen=True)
class StartResult:
    cycle: CycleRef | None
    reason: str  # started: never_cleaned|mode_changed|activity|manual; else: no_activity|busy|off


def enroll(db: Database) -> int:
    """Create a cleanup row for each backend once the ledger has issued refs
    (a periodic call, so backends added by any writer are picked up)."""
    with db.transaction() as conn:
        rows = conn.run(
            "INSERT INTO cleanup (backend_id) SELECT b.id FROM backends b"
            " WHERE EXISTS (SELECT 1 FROM provider_refs) ON CONFLICT DO NOTHING RETURNING backend_id"
        )
    return len(rows)


def due_tolerance(limits: Limits) -> timedelta:
    """A schedule firing every interval lands a little before ``next_due_at``
    (which counts from the end of the last cycle): accept that much early.
    A backoff after a failure is waited out exactly."""
    return timedelta(seconds=min(60, limits.interval_seconds // 10))


def _not_due(next_due: datetime | None, delay: int, limits: Limits, now: datetime) -> bool:
    """At most once per interval; a failed backend waits out its backoff."""
    tolerance = timedelta(0) if delay else due_tolerance(limits)
    return next_due is not None and next_due > now + tolerance


def quick_skip(conn: pg8000.native.Connection, backend_id: str, mode: str, limits: Limits,
               now: datetime | None = None) -> str | None:
    """The idle path of a scheduled run, without a transaction or lock: one read
    (the cleanup row with STEP 1's activity query) and, when there is nothing to
    do, one conditional write marking the row processed. Returns why the run is
    skipped, or None when the locked ``start_cycle`` must decide (a lease, or any
    reason to list). It applies the same rules as ``start_cycle``."""
    rows = conn.run(
        "SELECT c.clean_at, c.clean_mode, c.lease_owner, c.retry_delay_seconds, c.next_due_at,"
        " c.clean_at IS NOT NULL AND " + ACTIVITY_EXISTS.format(since="c.clean_at") +
        ", oc_clock() FROM cleanup c WHERE c.backend_id = :b", b=backend_id)
    if not rows or rows[0][2] is not None:
        return None
    clean_at, clean_mode, _, delay, next_due, active, db_clock = rows[0]
    now = now or db_clock
    if _not_due(next_due, delay, limits, now):
        return "not_due"
    go, reason = classify.may_have_new_orphans(
        clean_at=clean_at, clean_mode=clean_mode, mode=mode, activity_since_clean=bool(active))
    if go:
        return None
    marked = conn.run(
        "UPDATE cleanup SET last_processed_at = :n, next_due_at = :d WHERE backend_id = :b"
        " AND lease_owner IS NULL AND clean_at = :ca AND clean_mode = :m RETURNING 1",
        n=now, d=now + timedelta(seconds=limits.interval_seconds), b=backend_id, ca=clean_at, m=mode)
    return reason if marked else None


def start_cycle(db: Database, backend_id: str, mode: Mode, limits: Limits, *, manual: bool,
                now: datetime | None = None) -> StartResult:
    """STEP 1 and the lease. A live lease makes this a no-op ("busy"); an expired
    one fails its cycle first. A scheduled run with no reason to list only marks
    the row processed. Otherwise bumps the fence and creates the cycle."""
    with db.transaction() as conn:
        now = now or db_now(conn)
        conn.run("INSERT INTO cleanup (backend_id) VALUES (:b) ON CONFLICT DO NOTHING", b=backend_id)
        row = conn.run(
            "SELECT clean_at, clean_mode, lease_owner, lease_expires_at, fence, retry_delay_seconds, next_due_at"
            " FROM cleanup WHERE backend_id = :b FOR UPDATE", b=backend_id)[0]
        clean_at, clean_mode, lease_owner, lease_expires, fence, delay, next_due = row
        if lease_owner is not None:
            if lease_expires is not None and lease_expires > now:
                return StartResult(None, "busy")
            _expire_cycle(conn, backend_id, lease_owner, now, delay, limits)
        elif not manual and _not_due(next_due, delay, limits, now):
            return StartResult(None, "not_due")
        if not manual:
            active = clean_at is not None and activity_since(conn, backend_id, clean_at)
            go, reason = classify.may_have_new_orphans(
                clean_at=clean_at, clean_mode=clean_mode, mode=mode, activity_since_clean=active)
            if not go:
                conn.run("UPDATE cleanup SET last_processed_at = :n, next_due_at = :d WHERE backend_id = :b",
                         n=now, d=now + timedelta(seconds=limits.interval_seconds), b=backend_id)
                return StartResult(None, reason)
        else:
            reason = "manual"
        cycle_id = uuid.uuid4().hex
        new_fence = fence + 1
        deadline = now + timedelta(seconds=limits.cycle_deadline_seconds)
        conn.run("UPDATE cleanup SET fence = :f, lease_owner = :c, lease_expires_at = :d WHERE backend_id = :b",
                 f=new_fence, c=cycle_id, d=deadline, b=backend_id)
        conn.run("INSERT INTO cycles (id, backend_id, fence, mode, started_at, deadline, manual, record_all)"
                 " VALUES (:c, :b, :f, :m, :n, :d, :man, :man)",
                 c=cycle_id, b=backend_id, f=new_fence, m=mode, n=now, d=deadline, man=manual)
    return StartResult(CycleRef(cycle_id, backend_id, new_fence, mode), reason)


def _expire_cycle(conn: pg8000.native.Connection, backend_id: str, cycle_id: str, now: datetime,
                  delay: int, limits: Limits) -> None:
    """A cycle past its deadline (lost message, crashed function) is failed: its
    lease goes, ``clean_at`` stays, the retry is backed off."""
    conn.run("UPDATE cycles SET outcome = 'failed', failed = true, finished_at = :n,"
             " error = coalesce(error, 'cycle did not complete before its deadline')"
             " WHERE id = :c AND outcome IS NULL", c=cycle_id, n=now)
    new_delay = classify.backoff_delay(delay, limits.interval_seconds, limits.max_backoff_seconds)
    conn.run("UPDATE cleanup SET lease_owner = NULL, lease_expires_at = NULL, last_outcome = 'failed',"
             " last_error = 'cycle did not complete before its deadline', retry_delay_seconds = :d"
             " WHERE backend_id = :b", d=new_delay, b=backend_id)


def lock_cycle(conn: pg8000.native.Connection, cycle_id: str) -> dict[str, Any]:
    """Lock a live cycle (cleanup row, then cycle row) or raise ``LeaseLost``."""
    rows = conn.run(
        "SELECT cl.fence, cl.lease_owner FROM cleanup cl"
        " WHERE cl.backend_id = (SELECT backend_id FROM cycles WHERE id = :c) FOR UPDATE", c=cycle_id)
    crow = conn.run(
        "SELECT id, backend_id, fence, mode, listed_at, expected_batches, applied_batches, open_deletes,"
        " groups_listed, failures, unsettled, failed, tripped_regions, outcome, dispatched, error"
        " FROM cycles WHERE id = :c FOR UPDATE", c=cycle_id)
    if not rows or not crow:
        raise LeaseLost(f"cycle {cycle_id} is unknown")
    c = dict(zip(["id", "backend_id", "fence", "mode", "listed_at", "expected_batches", "applied_batches",
                  "open_deletes", "groups_listed", "failures", "unsettled", "failed", "tripped_regions",
                  "outcome", "dispatched", "error"], crow[0]))
    if rows[0][0] != c["fence"] or rows[0][1] != cycle_id or c["outcome"] is not None:
        raise LeaseLost(f"cycle {cycle_id} lost its lease")
    return c


def set_listed_at(db: Database, cycle_id: str, listed_at: datetime | None = None) -> datetime:
    """Stamp the cycle's listing time (the database clock unless given) right
    before the first provider call, and return it."""
    with db.transaction() as conn:
        lock_cycle(conn, cycle_id)
        return conn.run("UPDATE cycles SET listed_at = coalesce(CAST(:t AS timestamptz), oc_clock())"
                        " WHERE id = :c RETURNING listed_at", t=listed_at, c=cycle_id)[0][0]


def apply_batch(conn: pg8000.native.Connection, payload: dict[str, Any]) -> dict[str, Any]:
    """One round trip: fenced, idempotent application of a classified batch."""
    rows = conn.run("SELECT oc_apply_batch(CAST(:p AS jsonb))", p=json.dumps(payload, default=str))
    result = rows[0][0]
    return result if isinstance(result, dict) else json.loads(result)


def is_complete(c: dict[str, Any]) -> bool:
    return (c["expected_batches"] is not None and c["applied_batches"] >= c["expected_batches"]
            and c["open_deletes"] <= 0)


def facts(c: dict[str, Any]) -> classify.CycleFacts:
    failures = c["failures"] if isinstance(c["failures"], list) else json.loads(c["failures"] or "[]")
    return classify.CycleFacts(
        listing_failed=bool(c["failed"]),
        region_failures=len(failures),
        skipped=bool(c["unsettled"]),
        tripped_regions=len(c["tripped_regions"] or ()),
    )


def finish(conn: pg8000.native.Connection, c: dict[str, Any], limits: Limits,
           now: datetime | None = None) -> Outcome:
    """STEP 7, exactly once, inside the caller's fenced transaction."""
    now = now or db_now(conn)
    result = classify.outcome(facts(c))
    row = conn.run("SELECT clean_at, retry_delay_seconds FROM cleanup WHERE backend_id = :b",
                   b=c["backend_id"])[0]
    sched = classify.next_schedule(
        result, now=now, listed_at=c["listed_at"], clean_at=row[0], retry_delay_seconds=row[1],
        interval_seconds=limits.interval_seconds, margin_seconds=limits.margin_seconds,
        max_backoff_seconds=limits.max_backoff_seconds)
    conn.run("UPDATE cycles SET outcome = :o, finished_at = :n WHERE id = :c", o=result.value, n=now, c=c["id"])
    _close_vanished_orphans(conn, c)
    conn.run(
        "UPDATE cleanup SET clean_at = :ca, clean_mode = CASE WHEN :o = 'clean' THEN :m ELSE clean_mode END,"
        " last_processed_at = :n, next_due_at = :due, retry_delay_seconds = :d, last_outcome = :o,"
        " last_error = :e, lease_owner = NULL, lease_expires_at = NULL WHERE backend_id = :b",
        ca=sched.clean_at, o=result.value, m=c["mode"], n=now, due=sched.next_due_at,
        d=sched.retry_delay_seconds, e=c.get("error"), b=c["backend_id"])
    return result


def _close_vanished_orphans(conn: pg8000.native.Connection, c: dict[str, Any]) -> None:
    """Orphan rows this complete listing did not see again are closed ('gone'),
    except in regions (or their zones) whose listing failed: those may still exist."""
    if c["failed"] or c["expected_batches"] is None or c["applied_batches"] < c["expected_batches"]:
        return
    failures = c["failures"] if isinstance(c["failures"], list) else json.loads(c["failures"] or "[]")
    conn.run(
        "UPDATE orphans o SET state = 'gone' WHERE o.backend_id = :b AND o.last_cycle_id IS DISTINCT FROM :c"
        " AND o.state IN ('open', 'deleting', 'delete_failed', 'protected')"
        " AND NOT EXISTS (SELECT 1 FROM unnest(CAST(:f AS text[])) AS f(region)"
        "                 WHERE o.region = f.region OR o.region LIKE f.region || '-%')",
        b=c["backend_id"], c=c["id"], f=[f["region"] for f in failures])


def fail_cycle(db: Database, cycle_id: str, error: str, limits: Limits,
               now: datetime | None = None, failures: list[RegionFailure] | None = None) -> Outcome | None:
    """The listing (or the identity check before it) failed: the cycle fails now
    (STEP 7 failed), with ``failures`` recorded when given. ``None`` if it was fenced."""
    try:
        with db.transaction() as conn:
            c = lock_cycle(conn, cycle_id)
            if failures is not None:
                dumped = [f.model_dump() for f in failures]
                conn.run("UPDATE cycles SET failures = CAST(:f AS jsonb) WHERE id = :c",
                         f=json.dumps(dumped), c=cycle_id)
                c.update(failures=dumped)
            conn.run("UPDATE cycles SET failed = true, error = :e WHERE id = :c", e=error[:2000], c=cycle_id)
            c.update(failed=True, error=error[:2000])
            return finish(conn, c, limits, now)
    except LeaseLost:
        return None


def finish_if_complete(db: Database, cycle_id: str, limits: Limits,
                       now: datetime | None = None) -> Outcome | None:
    """Finish a report-mode cycle whose batches are all in. Fenced; at most once."""
    try:
        with db.transaction() as conn:
            c = lock_cycle(conn, cycle_id)
            if not is_complete(c):
                return None
            return finish(conn, c, limits, now)
    except LeaseLost:
        return None
