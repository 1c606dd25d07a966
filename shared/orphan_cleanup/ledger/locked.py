"""The store's units of work: one transaction each, holding the backend's locks.

``LeaseUnit`` (STEP 1 and the lease) locks the backend's ``cleanup`` row;
``LockedCycle`` (every write of a running cycle) locks the ``cleanup`` row, then
the ``cycles`` row, and refuses a cycle that lost its lease (``LeaseLost``).
Neither decides anything: the pipeline reads their facts, asks ``classify``,
and hands the decision back to the same unit inside the same transaction.
State snapshots (``state``) are rebuilt from the rows each statement returns.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
import pg8000.native

from orphan_cleanup.core import evidence
from orphan_cleanup.core.backends import Backend, Mode
from orphan_cleanup.core.decisions import DeleteRecord
from orphan_cleanup.core.errors import BlastRadiusExceeded, ConfigError, LeaseLost
from orphan_cleanup.core.listing import RegionFailure, ResourceGroup
from orphan_cleanup.core.owners import Keep
from orphan_cleanup.core.redact import redact
from orphan_cleanup.core.verdicts import Outcome
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.records import (
    CYCLE_COLUMNS,
    CleanupState,
    Cycle,
    CycleRef,
    DeleteRequestRow,
    FinishedCycle,
)

#: Why a cycle failed when it recorded no reason of its own.
NO_REASON = "the cycle failed (no reason recorded)"
#: Why a cycle whose lease expired failed.
DEADLINE_REASON = "cycle did not complete before its deadline"
_REASON_CHARS = 2000

# A failed cycle's ``cycle_failed`` event (README, "The events table"): its one-line reason,
# with the region failures as details. Every path that fails a cycle writes it, in the
# transaction that fails the cycle.
CYCLE_FAILED_EVENT = ("INSERT INTO events (backend_id, cycle_id, kind, message, details)"
                      " SELECT cy.backend_id, cy.id, 'cycle_failed', coalesce(cy.error, :no_reason),"
                      " jsonb_build_object('mode', cy.mode, 'failures', cy.failures, 'started_at', cy.started_at)"
                      " FROM cycles cy WHERE cy.id = ANY(CAST(:ids AS text[]))")


def reason_line(error: str, failures: Sequence[RegionFailure] = ()) -> str:
    """A failed cycle's reason as one line, without secrets (SAFETY.md rule 22): ``error``,
    then each failed region with its error when ``error`` does not say them already."""
    text = " ".join(error.split())
    regions = [f"{f.region}: {' '.join(f.error.split())}" for f in failures
               if f.region != "*" and " ".join(f.error.split()) not in text]
    if regions:
        text = f"{text}: {'; '.join(regions)}"
    return redact(text)[:_REASON_CHARS]


_CLEANUP_COLUMNS = ("backend_id, clean_at, clean_mode, lease_owner, lease_expires_at, fence,"
                    " retry_delay_seconds, next_due_at")


class Sweep(NamedTuple):
    """A delete cycle's orphan groups after mark-then-sweep (``LockedCycle.sweep``)."""

    due: list[ResourceGroup]  # an earlier listing found them so, the window ago: deleted now
    marked: list[tuple[ResourceGroup, datetime]]  # and when each may go (its delete_after)


# Mark-then-sweep (SAFETY.md rule 23), one statement (``LockedCycle.sweep``). The same group: the
# same key (ref, region, primary) and, without a primary, the same member ids. A mark keeps its
# time when this listing found the group an orphan for the same reason, and so did every listing
# of the backend since the mark: each listing in between was a delete-mode one that came as far
# as its sweep (a report-mode listing, or one that failed or was fenced before its sweep, may have
# seen the group otherwise, unrecorded: start over), none recorded the group otherwise (a keep or
# a protection its deleter found after its sweep), and the latest one that found it so is at most
# ``:gap`` seconds before this one (the window and two intervals: a backend off or failing for
# weeks confirms nothing). Else the mark starts over at this listing. A mark whose group this
# listing did not find an orphan for that reason ends, in a region that failed to list too: a
# group shown there but found tracked leaves no row to tell it from a group not shown, so not
# seen counts as changed (it delays a deletion by a window, never hastens one).
# The statement's parts see one snapshot: each table is written once (marks: the rows this
# listing found, upserted, and the others, deleted; cycle_groups: the marked ones).
_SWEEP_SQL = """
WITH cur AS (
  SELECT g.group_key, g.provider_ref, g.region, g.primary_id, g.resources, g.reason,
         CASE WHEN g.primary_id IS NULL
              THEN ARRAY(SELECT r->>'id' FROM jsonb_array_elements(g.resources) r ORDER BY 1) END AS ids
    FROM cycle_groups g WHERE g.cycle_id = :c AND g.verdict = 'orphan'),
ended AS (
  DELETE FROM orphan_marks m
   WHERE m.backend_id = :b AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.group_key = m.group_key)),
marks AS (
  INSERT INTO orphan_marks AS m (backend_id, group_key, reason, member_ids, marked_at, cycle_id)
  SELECT :b, cur.group_key, cur.reason, cur.ids, CAST(:listed AS timestamptz), :c FROM cur
  ON CONFLICT (backend_id, group_key) DO UPDATE
     SET marked_at = CASE WHEN m.reason = excluded.reason AND m.member_ids IS NOT DISTINCT FROM excluded.member_ids
                               AND m.marked_at <= excluded.marked_at
                               AND (SELECT p.listed_at FROM cycles p WHERE p.id = m.cycle_id)
                                   >= excluded.marked_at - make_interval(secs => :gap)
                               AND NOT EXISTS (SELECT 1 FROM cycles r WHERE r.backend_id = m.backend_id
                                                  AND (r.mode <> 'delete' OR NOT r.dispatched)
                                                  AND r.listed_at > m.marked_at AND r.listed_at < excluded.marked_at)
                               AND NOT EXISTS (SELECT 1 FROM cycles r JOIN cycle_groups rg ON rg.cycle_id = r.id
                                                WHERE r.backend_id = m.backend_id AND rg.group_key = m.group_key
                                                  AND r.listed_at >= m.marked_at AND r.listed_at < excluded.marked_at
                                                  AND rg.verdict <> 'orphan')
                          THEN m.marked_at ELSE excluded.marked_at END,
         reason = excluded.reason, member_ids = excluded.member_ids, cycle_id = excluded.cycle_id
  RETURNING m.group_key, m.marked_at + make_interval(secs => :w) AS delete_after),
marked AS (
  UPDATE cycle_groups g SET action = 'marked', delete_after = marks.delete_after
    FROM marks WHERE g.cycle_id = :c AND g.group_key = marks.group_key
     AND marks.delete_after > CAST(:listed AS timestamptz))
SELECT cur.provider_ref, cur.region, cur.primary_id, cur.resources,
       CASE WHEN marks.delete_after > CAST(:listed AS timestamptz) THEN marks.delete_after END
  FROM cur JOIN marks ON marks.group_key = cur.group_key ORDER BY cur.group_key"""


class GateHold(NamedTuple):
    """A per-ref delete gate held by a deletion in progress (``LedgerStore.acquire_gate``)."""

    scope: str
    ref: str
    holder: str
    ttl_seconds: int


def _cleanup(row: list[Any]) -> CleanupState:
    return CleanupState(*row)


def group_from_row(row: list[Any]) -> ResourceGroup:
    resources = row[3] if isinstance(row[3], list) else json.loads(row[3])
    return ResourceGroup.model_validate(
        {"provider_ref": row[0], "region": row[1], "primary_id": row[2], "resources": resources})


# A successful delete in the journal (SAFETY.md rule 19) of the resource ``{target}`` of the
# orphan row ``o``, since it was first seen (detaching, disassociating, cancelling and
# snapshotting delete nothing).
_DELETED = ("SELECT 1 FROM provider_journal j WHERE j.backend_id = o.backend_id AND j.provider_ref = o.provider_ref"
            " AND j.phase = 'result' AND j.outcome IN ('ok', 'gone') AND j.at >= o.first_seen"
            " AND j.call !~ '(Detach|Disassociate|reateSnapshot|Cancel)' AND j.target = {target}")


class Leases:
    """STEP 1 and the lease of several backends in one transaction (``LedgerStore.leases``):
    their ``cleanup`` rows (created if missing) locked in one statement, in id order, so two
    holders never wait on each other, with their facts (``LeaseUnit.activity_since_clean``,
    ``account_rows``, ``baselines``); every lease taken written in one statement (``flush``,
    before the commit). A job of N backends is four statements whatever N: ``BEGIN``, the
    locks with the facts, the starts, ``COMMIT``.

    The facts come with the locks when no locked row changed while this statement waited for
    it: its facts (read in the statement's snapshot, taken before the wait) are then as of
    the lock. Otherwise (a holder changed a row: a cycle finished, a lease expired) they are
    read again, after the locks, in one more statement."""

    def __init__(self, conn: pg8000.native.Connection, backend_ids: Sequence[str], now: datetime | None) -> None:
        self.conn = conn
        ids = sorted(set(backend_ids))
        rows = conn.run(_LOCK_SQL, ids=ids)
        if len(rows) < len(ids):  # not enrolled yet: the rows of known backends are made here, then locked
            conn.run("INSERT INTO cleanup (backend_id) SELECT b.id FROM coverages() b"
                     " WHERE b.id = ANY(CAST(:ids AS text[])) ORDER BY b.id ON CONFLICT DO NOTHING", ids=ids)
            rows = conn.run(_LOCK_SQL, ids=ids)
        self.now: datetime = now or (rows[0][_N_CLEANUP] if rows else conn.run("SELECT oc_clock()")[0][0])
        self.units = {row[0]: LeaseUnit(self, _cleanup(row[:_N_CLEANUP])) for row in rows}
        self._facts: dict[str, _LeaseFacts] | None = None
        if all(row[_N_CLEANUP + 1] for row in rows):  # no row moved while the statement waited
            self._facts = {row[0]: _lease_facts(row[_N_CLEANUP + 2:]) for row in rows
                           if row[_N_CLEANUP + 2] is not None}
        self._starts: list[dict[str, Any]] = []

    def unit(self, backend_id: str) -> LeaseUnit:
        """``ConfigError`` for an id that is no backend (nor a retired coverage)."""
        if backend_id not in self.units:
            raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
        return self.units[backend_id]

    def facts(self, backend_id: str) -> _LeaseFacts:
        """What STEP 1 and the start read of ``backend_id``: activity since its ``clean_at``,
        its row now, the raw settings of every backend of its provider account (SAFETY.md
        rules 16, 18 and 24) and its region baselines. ``ConfigError`` if its row is gone."""
        if self._facts is None:
            since = {b: u.state.clean_at for b, u in self.units.items()}
            self._facts = {row[0]: _lease_facts(row) for row in self.conn.run(
                _LEASE_FACTS_SQL, ids=list(since), t=json.dumps(since, default=str))}
        found = self._facts.get(backend_id)
        if found is None:
            raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
        return found

    def flush(self) -> None:
        """Write every lease ``LeaseUnit.start`` took, in one statement: bump each fence and
        create each cycle that remembers it, with its snapshot (SAFETY.md rule 18). Its
        listing time is stamped right before its listing (``LedgerSession.stamp_listed_at``)."""
        if not self._starts:
            return
        starts, self._starts = self._starts, []
        rows = self.conn.run(_START_SQL, s=json.dumps(starts, default=str), n=self.now)
        if rows[0][0] != len(starts):  # the rows are locked: only a bug gets here
            raise LeaseLost(f"{len(starts) - rows[0][0]} of {len(starts)} leases were not taken")


class LeaseUnit:
    """STEP 1 of one backend of a ``Leases`` transaction, under its locked ``cleanup`` row."""

    def __init__(self, leases: Leases, state: CleanupState) -> None:
        self.leases = leases
        self.conn = leases.conn
        self.backend_id = state.backend_id
        self.state = state
        self.now = leases.now

    def activity_since_clean(self) -> bool:
        """Any ledger change that may concern this backend after ``clean_at`` (False if never clean)."""
        return self.state.clean_at is not None and self.leases.facts(self.backend_id).active

    def baselines(self) -> dict[str, tuple[int | None, int | None]]:
        """Per region: (groups of the last clean listing, groups of the suspect listing since)."""
        return self.leases.facts(self.backend_id).baselines

    def expire(self, retry_delay_seconds: int) -> None:
        """Fail the cycle holding an expired lease (lost message, crashed function):
        its lease goes, ``clean_at`` stays, the retry waits ``retry_delay_seconds``."""
        assert self.state.lease_owner is not None
        failed = [r[0] for r in self.conn.run(
            "UPDATE cycles SET outcome = 'failed', failed = true, finished_at = :n, error = coalesce(error, :e)"
            " WHERE id = :c AND outcome IS NULL RETURNING id", c=self.state.lease_owner, n=self.now,
            e=DEADLINE_REASON)]
        self.conn.run(CYCLE_FAILED_EVENT, ids=failed, no_reason=NO_REASON)
        self.state = _cleanup(self.conn.run(
            "UPDATE cleanup SET lease_owner = NULL, lease_expires_at = NULL, last_outcome = 'failed',"
            " last_error = :e, retry_delay_seconds = :d"
            f" WHERE backend_id = :b RETURNING {_CLEANUP_COLUMNS}", e=DEADLINE_REASON, d=retry_delay_seconds,
            b=self.backend_id)[0])

    def mark_processed(self, next_due: datetime) -> None:
        """Nothing to list: record the run and when the backend is due next."""
        self.state = _cleanup(self.conn.run(
            f"UPDATE cleanup SET last_processed_at = :n, next_due_at = :d WHERE backend_id = :b"
            f" RETURNING {_CLEANUP_COLUMNS}", n=self.now, d=next_due, b=self.backend_id)[0])

    def account_rows(self) -> tuple[Backend, list[Any]]:
        """This backend's row as it is now (under the lease's transaction) and the raw
        ``settings`` of every backend of its provider account, its own included: what the
        cycle's snapshot is made of (SAFETY.md rules 16 and 18). ``ConfigError`` if gone
        or misconfigured."""
        facts = self.leases.facts(self.backend_id)
        return queries.backend_from_row(facts.row), facts.account

    def start(self, mode: Mode, deadline: datetime, *, manual: bool,
              snapshot: dict[str, Any] | None = None) -> CycleRef:
        """Take the lease (written by ``Leases.flush``, in this transaction): the next fence
        and the cycle that remembers it, with ``snapshot``, the backend as the cycle will
        work on it (SAFETY.md rule 18)."""
        if self.state.lease_owner is not None:
            raise LeaseLost(f"backend {self.backend_id} is leased by cycle {self.state.lease_owner}")
        cycle_id = uuid.uuid4().hex
        fence = self.state.fence + 1
        self.leases._starts.append({"backend_id": self.backend_id, "id": cycle_id, "fence": fence, "mode": mode,
                                    "deadline": deadline, "manual": manual, "snapshot": snapshot})
        self.state = replace(self.state, fence=fence, lease_owner=cycle_id, lease_expires_at=deadline)
        return CycleRef(cycle_id, self.backend_id, fence, mode)


class _LeaseFacts(NamedTuple):
    row: list[Any]
    active: bool
    account: list[Any]
    baselines: dict[str, tuple[int | None, int | None]]


def _lease_facts(row: Sequence[Any]) -> _LeaseFacts:
    *columns, active, settings, baselines = row
    return _LeaseFacts(row=list(columns), active=bool(active), account=[queries.json_value(s) for s in settings or ()],
                       baselines={r: (c, s) for r, c, s in queries.json_value(baselines) or ()})


def _facts_sql(since: str) -> str:
    """A backend ``b``'s facts (``_LeaseFacts``), activity read since ``since`` (NULL: never clean)."""
    return (f"{', '.join('b.' + c.strip() for c in queries.COVERAGE_COLUMNS.split(','))},"
            f" {since} IS NOT NULL AND " + queries.ACTIVITY_EXISTS.format(since=since, backend="b.id") + ","
            " ARRAY(SELECT s.settings::text FROM coverages() s WHERE " + queries.SCOPE_SQL.format(t="s") + " = "
            + queries.SCOPE_SQL.format(t="b") + "),"
            " (SELECT json_agg(json_build_array(l.region, l.clean_groups, l.suspect_groups))"
            "    FROM region_listings l WHERE l.backend_id = b.id)::text")


_N_CLEANUP = len(_CLEANUP_COLUMNS.split(","))

# The cleanup rows locked in id order, each with the clock, whether it is the version the
# statement's snapshot holds (no holder changed it while the statement waited) and its
# backend's facts (NULL columns: no such backend).
_LOCK_SQL = (
    f"SELECT {', '.join('cl.' + c.strip() for c in _CLEANUP_COLUMNS.split(','))}, oc_clock(),"
    " cl.xmin::text = (SELECT s.xmin::text FROM cleanup s WHERE s.backend_id = cl.backend_id),"
    f" {_facts_sql('cl.clean_at')}"
    " FROM cleanup cl LEFT JOIN coverages() b ON b.id = cl.backend_id"
    " WHERE cl.backend_id = ANY(CAST(:ids AS text[])) ORDER BY cl.backend_id FOR UPDATE OF cl")

# The facts again, after the locks. ``:t``: each backend's clean_at (JSON object; null: never clean).
_LEASE_FACTS_SQL = (
    f"SELECT {_facts_sql('x.since')}"
    " FROM coverages() b"
    " JOIN jsonb_each_text(CAST(:t AS jsonb)) AS e(id, since_text) ON e.id = b.id"
    " CROSS JOIN LATERAL (SELECT CAST(e.since_text AS timestamptz) AS since) AS x"
    " WHERE b.id = ANY(CAST(:ids AS text[]))")

_START_SQL = """
WITH s AS (SELECT * FROM jsonb_to_recordset(CAST(:s AS jsonb))
             AS x(backend_id text, id text, fence bigint, mode text, deadline timestamptz, manual boolean,
                  snapshot jsonb)),
l AS (UPDATE cleanup cl SET fence = s.fence, lease_owner = s.id, lease_expires_at = s.deadline
        FROM s WHERE cl.backend_id = s.backend_id AND cl.fence = s.fence - 1 AND cl.lease_owner IS NULL
      RETURNING cl.backend_id),
c AS (INSERT INTO cycles (id, backend_id, fence, mode, started_at, deadline, manual, record_all, backend_snapshot)
      SELECT s.id, s.backend_id, s.fence, s.mode, :n, s.deadline, s.manual, s.manual, s.snapshot
        FROM s JOIN l ON l.backend_id = s.backend_id RETURNING 1)
SELECT count(*) FROM c"""


class LockedCycle:
    """A live cycle, locked (cleanup row, then cycle row) for one transaction.

    Constructing it raises ``LeaseLost`` when the cycle is unknown, finished, or
    its backend's fence or lease moved on: a stale holder writes nothing."""

    def __init__(self, conn: pg8000.native.Connection, cycle_id: str, now: datetime | None, *,
                 lock: bool = True) -> None:
        """``lock=False`` (``LedgerStore.cycle_read``): the rows read without a lock, and
        outside a transaction; then only ``finish`` may write, as one guarded statement."""
        self.conn = conn
        self.locked = lock
        # One statement, locking in the store's order: ``FOR UPDATE OF cl, c`` takes the cleanup
        # row, then the cycle row; each comes back as its latest committed version. Unlocked,
        # the rows' versions (``xmin``) come with them, for ``finish``'s guard.
        rows = conn.run(
            "SELECT cl.fence, cl.lease_owner, cl.clean_at, cl.retry_delay_seconds, oc_clock(),"
            " cl.xmin::text, c.xmin::text, " + ", ".join(f"c.{col.strip()}" for col in CYCLE_COLUMNS.split(","))
            + " FROM cycles c JOIN cleanup cl ON cl.backend_id = c.backend_id WHERE c.id = :c"
            + (" FOR UPDATE OF cl, c" if lock else ""), c=cycle_id)
        if not rows:
            raise LeaseLost(f"cycle {cycle_id} is unknown")
        fence, owner, self._clean_at, self._retry_delay, clock, *versions = rows[0][:7]
        self._versions = versions
        self.state = Cycle.from_row(rows[0][7:])
        self.check_lease(fence, owner)
        self.now: datetime = now or clock
        self.finished: FinishedCycle | None = None  # set by ``finish``: the store's hook, after commit

    def check_lease(self, fence: int, lease_owner: str | None) -> None:
        """The fence (SAFETY.md rule 6): the backend's fence and lease are still this
        cycle's and the cycle is not finished, or ``LeaseLost``."""
        c = self.state
        if fence != c.fence or lease_owner != c.id or c.outcome is not None:
            raise LeaseLost(f"cycle {c.id} lost its lease")

    def _update(self, assignments: str, **params: Any) -> None:
        rows = self.conn.run(f"UPDATE cycles SET {assignments} WHERE id = :_id RETURNING {CYCLE_COLUMNS}",
                             _id=self.state.id, **params)
        self.state = Cycle.from_row(rows[0])

    def extend_lease(self, seconds: int, gate: GateHold | None = None) -> datetime:
        """Move the lease's end (and the cycle's deadline) to ``seconds`` from now and
        return it; renew ``gate`` too, only while its holder still holds it (a released
        gate is never taken again here)."""
        until = self.now + timedelta(seconds=seconds)
        self.conn.run("UPDATE cleanup SET lease_expires_at = :d WHERE backend_id = :b", d=until,
                      b=self.state.backend_id)
        self._update("deadline = :d", d=until)
        if gate is not None:
            self.conn.run("UPDATE delete_gates SET expires_at = now() + make_interval(secs => :t)"
                          " WHERE backend_id = :s AND provider_ref = :r AND holder = :h",
                          t=gate.ttl_seconds, s=gate.scope, r=gate.ref, h=gate.holder)
        return until

    def schedule_inputs(self) -> tuple[datetime | None, int]:
        """The backend's ``clean_at`` and current retry delay (read with the lock)."""
        return self._clean_at, self._retry_delay

    def stamp_listed_at(self, listed_at: datetime | None = None) -> datetime:
        """The cycle's listing time: ``listed_at``, else the database clock now."""
        self._update("listed_at = coalesce(CAST(:t AS timestamptz), oc_clock())", t=listed_at)
        assert self.state.listed_at is not None
        return self.state.listed_at

    def fail(self, error: str, failures: Sequence[RegionFailure] | None = None) -> None:
        """The listing (or the identity check before it) failed; ``failures`` replace the cycle's.
        The cycle's error is the one-line reason (``reason_line``): the failed regions with theirs."""
        if failures is not None:
            self._update("failures = CAST(:f AS jsonb)", f=json.dumps([f.model_dump() for f in failures]))
        self._update("failed = true, error = :e", e=reason_line(error, self.state.failures))

    def sweep(self, window_seconds: int, gap_seconds: int) -> Sweep:
        """Mark, then sweep (SAFETY.md rule 23), in one statement: this cycle's orphan groups
        that an earlier delete-mode listing, at least ``window_seconds`` before this one, found
        an orphan for the same reason, as every listing since did (``due``), and the others,
        which it marks (``cycle_groups.action = 'marked'``, ``delete_after``). Every mark of the
        backend is brought up to date with this listing (``_SWEEP_SQL``): kept, started over, or
        ended. ``gap_seconds``: the longest time between two listings that confirm each other."""
        c = self.state
        rows = self.conn.run(_SWEEP_SQL, c=c.id, b=c.backend_id, listed=c.listed_at, w=window_seconds,
                             gap=gap_seconds)
        due = [group_from_row(r[:4]) for r in rows if r[4] is None]
        marked = [(group_from_row(r[:4]), r[4]) for r in rows if r[4] is not None]
        if marked:
            self._update("unsettled = true")
        return Sweep(due=due, marked=marked)

    def block_deletes(self, why: BlastRadiusExceeded) -> None:
        """The blast-radius cap: delete nothing, report every orphan due (a marked one stays
        marked), say why."""
        self._update("dispatched = true, blocked_reason = :r, unsettled = true", r=str(why))
        self.conn.run("UPDATE cycle_groups SET action = 'reported' WHERE cycle_id = :c AND verdict = 'orphan'"
                      " AND action <> 'marked'", c=self.state.id)
        self.conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, details)"
                      " VALUES (:b, :c, 'delete_blocked', :m, CAST(:d AS jsonb))",
                      b=self.state.backend_id, c=self.state.id, m=f"deleted nothing: {why}",
                      d=json.dumps({"orphans": why.to_delete, "listed": why.listed}))

    def queue_deletes(self, groups: Sequence[ResourceGroup]) -> None:
        """Register one delete request per group (keyed by (cycle, group): idempotent)."""
        self.conn.run("INSERT INTO delete_requests (cycle_id, group_key)"
                      " SELECT :c, x FROM unnest(CAST(:keys AS text[])) AS x ON CONFLICT DO NOTHING",
                      c=self.state.id, keys=[g.key for g in groups])
        self._update("dispatched = true, open_deletes = open_deletes + :n, planned_deletes = :n", n=len(groups))

    def queued_groups(self) -> list[ResourceGroup]:
        """The groups whose delete requests this cycle registered and nobody handled yet."""
        rows = self.conn.run("SELECT g.provider_ref, g.region, g.primary_id, g.resources FROM delete_requests d"
                             " JOIN cycle_groups g ON g.cycle_id = d.cycle_id AND g.group_key = d.group_key"
                             " WHERE d.cycle_id = :c AND d.state = 'queued' AND g.verdict = 'orphan'"
                             " ORDER BY d.group_key", c=self.state.id)
        return [group_from_row(r) for r in rows]

    def mark_dispatched(self) -> None:
        self._update("dispatched = true")

    def delete_request(self, group_key: str) -> DeleteRequestRow:
        # The request's state and, with the group, the operator's keep of its ref if one is in
        # force (SAFETY.md rule 23: a keep written after the plan wins), in one statement. In
        # force at the listing time, as the classifier reads keeps: a keep that ended since
        # then still holds (the safe direction).
        rows = self.conn.run(
            "SELECT d.state, g.provider_ref, g.region, g.primary_id, g.resources, g.evidence->>'lp',"
            " CASE WHEN k.provider_ref IS NOT NULL THEN json_build_object('reason', k.reason, 'kept_at', k.kept_at,"
            "   'until', k.until)::text END"
            " FROM delete_requests d"
            " LEFT JOIN cycle_groups g ON g.cycle_id = d.cycle_id AND g.group_key = d.group_key"
            "  AND g.verdict = 'orphan'"
            " LEFT JOIN (" + queries.KEEPS_SQL.format(
                backend=":b", t="CAST(:t AS timestamptz)",
                refs="ARRAY(SELECT provider_ref FROM cycle_groups WHERE cycle_id = :c AND group_key = :k)")
            + ") k ON k.provider_ref = g.provider_ref"
            " WHERE d.cycle_id = :c AND d.group_key = :k",
            c=self.state.id, k=group_key, b=self.state.backend_id, t=self.state.listed_at)
        if not rows:
            return DeleteRequestRow(None, None)
        state, *recorded = rows[0]
        if recorded[0] is None:
            return DeleteRequestRow(state, None)
        keep = msgspec.json.decode(recorded[5], type=Keep) if recorded[5] else None
        return DeleteRequestRow(state, group_from_row(recorded), listed_primary=recorded[4], keep=keep)

    def record_delete(self, group: ResourceGroup, rec: DeleteRecord) -> bool:
        """Record one deletion's end, once per (cycle, group), in one statement (``_RECORD_SQL``):
        False (and nothing written) when it was recorded already."""
        detail = json.dumps({"result": rec.result.model_dump(mode="json") if rec.result else None,
                             "error": rec.error, "skipped": rec.skipped_reason})
        c = self.state
        # What the deleter saw attached to the orphan VM it terminated: its leftovers later.
        attached = (list(rec.result.attached) if rec.result is not None and rec.result.attached
                    and group.primary_id in rec.result.deleted else [])
        note = evidence.snapshot_note(rec.result.snapshots, rec.result.snapshots_pending) if rec.result else None
        protection_detail = (json.dumps((rec.protection_detail or rec.protection)[:200])
                             if rec.protection is not None else None)
        rows = self.conn.run(
            _RECORD_SQL, s=rec.request_state, r=detail, _id=c.id, k=group.key, a=rec.action.value, e=rec.error,
            o=rec.orphan_state, b=c.backend_id, keep=rec.keeps_protection, note=note,
            prot=rec.protection, pd=protection_detail, kind=f"orphan_{rec.action.value}", m=rec.message,
            ref=group.provider_ref, u=rec.unsettled or rec.trip_region, f=rec.failed, t=rec.trip_region,
            region=group.region,
            fe=reason_line(f"delete of {group.provider_ref} in {group.region} failed: {rec.error or '?'}"))
        if not rows:
            return False
        self.state = Cycle.from_row(rows[0])
        if attached:
            # Through the definer's function, which reads the request recorded above: the
            # deleter's role may not write orphan_resources (docs/DATABASE.md, "One role per function").
            self.conn.run("SELECT oc_record_orphan_resources(:c, :k, CAST(:ids AS text[]))",
                          c=c.id, k=group.key, ids=attached)
        return True

    def finish(self, outcome: Outcome, *, clean_at: datetime | None, next_due_at: datetime,
               retry_delay_seconds: int) -> None:
        """STEP 7 as decided, in one statement: the outcome, the failed cycle's event, the
        orphans this listing did not see again closed, the backend's schedule, the lease
        released. (Its parts see one snapshot and write different tables; the triggers on
        the cycle's outcome run after them, as they ran after the outcome's own statement.)

        Unlocked (``cycle_read``), the statement locks the cleanup row, then the cycle row,
        and writes only if neither changed since they were read (their ``xmin``): then
        ``finished`` is set; otherwise nothing is written and it stays None (decide again
        under the locks: ``LedgerStore.cycle``)."""
        c = self.state
        target = "UPDATE cycles SET outcome = :o, finished_at = :n WHERE id = :_id"
        if not self.locked:
            target = ("UPDATE cycles c SET outcome = :o, finished_at = :n"
                      " FROM (SELECT xmin::text AS version FROM cleanup WHERE backend_id = :b FOR UPDATE) AS cl"
                      " WHERE c.id = :_id AND c.outcome IS NULL AND cl.version = :clv AND c.xmin::text = :cv")
        parts = [f"fin AS ({target} RETURNING {_columns('cycles' if self.locked else 'c')})"]
        params: dict[str, Any] = dict(o=outcome.value, n=self.now, _id=c.id, ca=clean_at, m=c.mode, due=next_due_at,
                                      delay=retry_delay_seconds, e=c.error, b=c.backend_id)
        if not self.locked:
            params.update(clv=self._versions[0], cv=self._versions[1])
        done = " AND EXISTS (SELECT 1 FROM fin)"
        if outcome is Outcome.FAILED:
            parts.append(f"failed_event AS ({CYCLE_FAILED_EVENT}{done})")
            params.update(ids=[c.id], no_reason=NO_REASON)
        if not c.failed and c.listing_done:
            parts.append(f"vanished AS ({_VANISHED_SQL}{done})")
            params.update(regions=[f.region for f in c.failures])
        parts.append(
            "released AS (UPDATE cleanup SET clean_at = :ca,"
            " clean_mode = CASE WHEN :o = 'clean' THEN :m ELSE clean_mode END, last_processed_at = :n,"
            " next_due_at = :due, retry_delay_seconds = :delay, last_outcome = :o, last_error = :e,"
            f" lease_owner = NULL, lease_expires_at = NULL WHERE backend_id = :b{done})")
        rows = self.conn.run("WITH " + ", ".join(parts) + f" SELECT {CYCLE_COLUMNS} FROM fin", **params)
        if not rows:
            assert not self.locked, "a locked cycle's outcome is written"
            return
        self.state = Cycle.from_row(rows[0])
        self.finished = FinishedCycle(backend_id=c.backend_id, cycle_id=c.id, mode=c.mode, outcome=outcome.value)


# One deletion's end (``LockedCycle.record_delete``), one statement: the request, guarded
# (``state = 'queued'``: once per (cycle, group)); every other part writes only if it did.
# - the group's action and error; the snapshots kept of its data join its C3 ``detail``; a
#   protection the delete found (SAFETY.md rule 14) becomes its verdict, reason and detail;
# - the orphan row: one remembering a protection keeps it, with its verdict and reason, as
#   ``delete_rules`` decided (``:keep``); otherwise it is the orphan its cycle classified again
#   (or the protection just found). When it became 'deleted' is the report's deletion time
#   (C3 ``report``; one clock, rule 13);
# - the event, targeting the owner by the id and name kept in provider_refs;
# - the cycle's counters.
# Its parts see one snapshot (the orphan row reads the group's verdict as it was) and each row
# is written once.
_RECORD_SQL = """
WITH req AS (
  UPDATE delete_requests SET state = :s, attempts = attempts + 1, result = CAST(:r AS jsonb), updated_at = now()
   WHERE cycle_id = :_id AND group_key = :k AND state = 'queued' RETURNING 1),
grp AS (
  UPDATE cycle_groups SET action = :a, error = :e, updated_at = now(),
         verdict = CASE WHEN CAST(:prot AS text) IS NOT NULL THEN 'protected' ELSE verdict END,
         reason = coalesce(CAST(:prot AS text), reason),
         evidence = CASE
           WHEN CAST(:prot AS text) IS NOT NULL
             THEN jsonb_set(coalesce(evidence, '{}'::jsonb), '{d}', CAST(:pd AS jsonb))
           WHEN CAST(:note AS text) IS NOT NULL
             THEN jsonb_set(coalesce(evidence, '{}'::jsonb), '{d}',
                            to_jsonb(concat_ws('; ', evidence->>'d', CAST(:note AS text))))
           ELSE evidence END
   WHERE cycle_id = :_id AND group_key = :k AND EXISTS (SELECT 1 FROM req) RETURNING 1),
orphan AS (
  UPDATE orphans o SET state = CASE WHEN o.state = 'protected' AND o.reason = 'termination_protection' AND :keep
                                    THEN o.state ELSE :o END,
         last_error = :e,
         deleted_at = CASE WHEN :o = 'deleted' AND NOT (o.state = 'protected'
                                AND o.reason = 'termination_protection' AND :keep)
                           THEN oc_clock() ELSE o.deleted_at END,
         verdict = CASE WHEN CAST(:prot AS text) IS NOT NULL THEN 'protected' WHEN :keep THEN o.verdict
                        ELSE g.verdict END,
         reason = CASE WHEN CAST(:prot AS text) IS NOT NULL THEN CAST(:prot AS text) WHEN :keep THEN o.reason
                       ELSE g.reason END
    FROM cycle_groups g
   WHERE o.backend_id = :b AND o.group_key = :k AND g.cycle_id = :_id AND g.group_key = :k
     AND EXISTS (SELECT 1 FROM req) RETURNING 1),
event AS (
  INSERT INTO events (backend_id, cycle_id, kind, message, provider_ref, owner_type, owner_id, owner_name, details)
  SELECT :b, :_id, :kind, :m, :ref, r.owner_type, r.owner_id, r.owner_name, CAST(:r AS jsonb)
    FROM (SELECT 1) AS one LEFT JOIN provider_refs r ON r.provider_ref = :ref
   WHERE EXISTS (SELECT 1 FROM req) RETURNING 1),
counted AS (
  UPDATE cycles SET open_deletes = open_deletes - 1, unsettled = unsettled OR :u, failed = failed OR :f,
         tripped_regions = CASE WHEN :t AND NOT (CAST(:region AS text) = ANY(tripped_regions))
                                THEN array_append(tripped_regions, CAST(:region AS text)) ELSE tripped_regions END,
         error = CASE WHEN :f THEN coalesce(error, :fe) ELSE error END
   WHERE id = :_id AND EXISTS (SELECT 1 FROM req) RETURNING """ + CYCLE_COLUMNS + """)
SELECT * FROM counted"""


def _columns(alias: str) -> str:
    return ", ".join(f"{alias}.{col.strip()}" for col in CYCLE_COLUMNS.split(","))


# Orphan rows a complete listing (``finish``: not failed, every batch in) did not see again are
# closed, except in regions (or their zones) whose listing failed (``:regions``): those may still
# exist. Closed as 'deleted' when the journal holds, since the orphan was first seen, a successful
# delete of its VM (the call whose target is its primary) or, for a group without a VM, of each
# of its resources: one whose cycle lost its lease before recording it (SAFETY.md rule 19).
# Otherwise 'gone'. ``deleted_at``: when the report counts it deleted.
_DELETED_ANY = ("CASE WHEN o.primary_id IS NOT NULL THEN EXISTS (" + _DELETED.format(target="o.primary_id") + ")"
                " ELSE jsonb_array_length(o.resources) > 0 AND NOT EXISTS (SELECT 1 FROM"
                " jsonb_array_elements(o.resources) AS r WHERE NOT EXISTS ("
                + _DELETED.format(target="(r->>'id')") + ")) END")
_VANISHED_SQL = (
    f"UPDATE orphans o SET state = CASE WHEN {_DELETED_ANY} THEN 'deleted' ELSE 'gone' END,"
    f" deleted_at = CASE WHEN o.deleted_at IS NULL AND {_DELETED_ANY} THEN oc_clock() ELSE o.deleted_at END"
    " WHERE o.backend_id = :b AND o.last_cycle_id IS DISTINCT FROM :_id"
    " AND o.state IN ('open', 'deleting', 'delete_failed', 'protected')"
    " AND NOT EXISTS (SELECT 1 FROM unnest(CAST(:regions AS text[])) AS f(region)"
    "                 WHERE o.region = f.region OR o.region LIKE f.region || '-%')")
