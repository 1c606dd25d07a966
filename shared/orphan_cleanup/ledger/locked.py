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
from orphan_cleanup.ledger.queries import activity_since
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


class LeaseUnit:
    """STEP 1 of one backend under its locked ``cleanup`` row (created if missing)."""

    def __init__(self, conn: pg8000.native.Connection, backend_id: str, now: datetime | None) -> None:
        self.conn = conn
        self.backend_id = backend_id
        self.now: datetime = now or conn.run("SELECT oc_clock()")[0][0]
        conn.run("INSERT INTO cleanup (backend_id) VALUES (:b) ON CONFLICT DO NOTHING", b=backend_id)
        self.state = _cleanup(conn.run(f"SELECT {_CLEANUP_COLUMNS} FROM cleanup WHERE backend_id = :b FOR UPDATE",
                                       b=backend_id)[0])

    def activity_since_clean(self) -> bool:
        """Any ledger change that may concern this backend after ``clean_at`` (False if never clean)."""
        return self.state.clean_at is not None and activity_since(self.conn, self.backend_id, self.state.clean_at)

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
        rows = self.conn.run(f"SELECT {queries.COVERAGE_COLUMNS} FROM coverages() WHERE id = :b", b=self.backend_id)
        if not rows:
            raise ConfigError(f"unknown backend {self.backend_id!r} (see `orphan-cleanup backend list`)")
        return queries.backend_from_row(rows[0]), queries.account_settings(self.conn, self.backend_id)

    def start(self, mode: Mode, deadline: datetime, *, manual: bool,
              snapshot: dict[str, Any] | None = None) -> CycleRef:
        """Take the lease: bump the fence and create the cycle that remembers it, with
        ``snapshot``, the backend as the cycle will work on it (SAFETY.md rule 18)."""
        if self.state.lease_owner is not None:
            raise LeaseLost(f"backend {self.backend_id} is leased by cycle {self.state.lease_owner}")
        cycle_id = uuid.uuid4().hex
        self.state = _cleanup(self.conn.run(
            "UPDATE cleanup SET fence = fence + 1, lease_owner = :c, lease_expires_at = :d WHERE backend_id = :b"
            f" RETURNING {_CLEANUP_COLUMNS}", c=cycle_id, d=deadline, b=self.backend_id)[0])
        self.conn.run("INSERT INTO cycles (id, backend_id, fence, mode, started_at, deadline, manual, record_all,"
                      " backend_snapshot) VALUES (:c, :b, :f, :m, :n, :d, :man, :man, CAST(:snap AS jsonb))",
                      c=cycle_id, b=self.backend_id, f=self.state.fence, m=mode, n=self.now, d=deadline, man=manual,
                      snap=None if snapshot is None else json.dumps(snapshot))
        return CycleRef(cycle_id, self.backend_id, self.state.fence, mode)


class LockedCycle:
    """A live cycle, locked (cleanup row, then cycle row) for one transaction.

    Constructing it raises ``LeaseLost`` when the cycle is unknown, finished, or
    its backend's fence or lease moved on: a stale holder writes nothing."""

    def __init__(self, conn: pg8000.native.Connection, cycle_id: str, now: datetime | None) -> None:
        self.conn = conn
        lease = conn.run(
            "SELECT cl.fence, cl.lease_owner, cl.clean_at, cl.retry_delay_seconds, oc_clock() FROM cleanup cl"
            " WHERE cl.backend_id = (SELECT backend_id FROM cycles WHERE id = :c) FOR UPDATE", c=cycle_id)
        row = conn.run(f"SELECT {CYCLE_COLUMNS} FROM cycles WHERE id = :c FOR UPDATE", c=cycle_id)
        if not lease or not row:
            raise LeaseLost(f"cycle {cycle_id} is unknown")
        self.state = Cycle.from_row(row[0])
        fence, owner, self._clean_at, self._retry_delay, clock = lease[0]
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

    def record_region_groups(self, counts: dict[str, int]) -> None:
        """The group count of each region this cycle listed and believed: the
        backend's next baselines if the cycle finishes clean (migration 0010's trigger)."""
        self._update("region_groups = CAST(:g AS jsonb)", g=json.dumps(counts))

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
        state = self.conn.run("SELECT state FROM delete_requests WHERE cycle_id = :c AND group_key = :k",
                              c=self.state.id, k=group_key)
        if not state:
            return DeleteRequestRow(None, None)
        # With the group, the operator's keep of its ref if one is in force (SAFETY.md rule 23:
        # a keep written after the plan wins), in the same statement. In force at the listing
        # time, as the classifier reads keeps: a keep that ended since then still holds (the
        # safe direction).
        recorded = self.conn.run(
            "SELECT g.provider_ref, g.region, g.primary_id, g.resources, g.evidence->>'lp',"
            " CASE WHEN k.provider_ref IS NOT NULL THEN json_build_object('reason', k.reason, 'kept_at', k.kept_at,"
            "   'until', k.until)::text END"
            " FROM cycle_groups g LEFT JOIN (" + queries.KEEPS_SQL.format(
                backend=":b", t="CAST(:t AS timestamptz)",
                refs="ARRAY(SELECT provider_ref FROM cycle_groups WHERE cycle_id = :c AND group_key = :k)")
            + ") k ON k.provider_ref = g.provider_ref"
            " WHERE g.cycle_id = :c AND g.group_key = :k AND g.verdict = 'orphan'",
            c=self.state.id, k=group_key, b=self.state.backend_id, t=self.state.listed_at)
        if not recorded:
            return DeleteRequestRow(state[0][0], None)
        keep = msgspec.json.decode(recorded[0][5], type=Keep) if recorded[0][5] else None
        return DeleteRequestRow(state[0][0], group_from_row(recorded[0]), listed_primary=recorded[0][4], keep=keep)

    def record_delete(self, group: ResourceGroup, rec: DeleteRecord) -> bool:
        """Record one deletion's end, once per (cycle, group): False (and nothing
        written) when it was recorded already."""
        detail = json.dumps({"result": rec.result.model_dump(mode="json") if rec.result else None,
                             "error": rec.error, "skipped": rec.skipped_reason})
        c = self.state
        if not self.conn.run("UPDATE delete_requests SET state = :s, attempts = attempts + 1,"
                             " result = CAST(:r AS jsonb), updated_at = now()"
                             " WHERE cycle_id = :c AND group_key = :k AND state = 'queued' RETURNING 1",
                             s=rec.request_state, r=detail, c=c.id, k=group.key):
            return False
        self.conn.run("UPDATE cycle_groups SET action = :a, error = :e, updated_at = now()"
                      " WHERE cycle_id = :c AND group_key = :k", a=rec.action.value, e=rec.error, c=c.id, k=group.key)
        # A row remembering a protection (SAFETY.md rule 14) keeps it, with its verdict and
        # reason, as ``delete_rules`` decided (``rec.keeps_protection``); otherwise the row is
        # the orphan its cycle classified again.
        # When it became 'deleted' is the report's deletion time (C3 ``report``; one clock, rule 13).
        self.conn.run("UPDATE orphans o SET state = CASE WHEN o.state = 'protected' AND o.reason ="
                      " 'termination_protection' AND :keep THEN o.state ELSE :s END, last_error = :e,"
                      " deleted_at = CASE WHEN :s = 'deleted' AND NOT (o.state = 'protected' AND o.reason ="
                      " 'termination_protection' AND :keep) THEN oc_clock() ELSE o.deleted_at END,"
                      " verdict = CASE WHEN :keep THEN o.verdict ELSE g.verdict END,"
                      " reason = CASE WHEN :keep THEN o.reason ELSE g.reason END"
                      " FROM cycle_groups g WHERE o.backend_id = :b AND o.group_key = :k"
                      " AND g.cycle_id = :c AND g.group_key = :k",
                      s=rec.orphan_state, e=rec.error, b=c.backend_id, k=group.key, c=c.id,
                      keep=rec.keeps_protection)
        if rec.result is not None and rec.result.attached and group.primary_id in rec.result.deleted:
            # What the deleter saw attached to the orphan VM it terminated: its leftovers later.
            # Through the definer's function: the deleter's role may not write orphan_resources
            # (docs/DATABASE.md, "One role per function").
            self.conn.run("SELECT oc_record_orphan_resources(:c, :k, CAST(:ids AS text[]))",
                          c=c.id, k=group.key, ids=list(rec.result.attached))
        note = evidence.snapshot_note(rec.result.snapshots, rec.result.snapshots_pending) if rec.result else None
        if note is not None:
            # The snapshots kept of the group's data join its C3 ``detail``.
            self.conn.run("UPDATE cycle_groups SET evidence = jsonb_set(coalesce(evidence, '{}'::jsonb), '{d}',"
                          " to_jsonb(concat_ws('; ', evidence->>'d', CAST(:n AS text))))"
                          " WHERE cycle_id = :c AND group_key = :k", n=note, c=c.id, k=group.key)
        if rec.protection is not None:
            # The delete found a protection (rule 14): the group's verdict, as reported and remembered.
            d = json.dumps((rec.protection_detail or rec.protection)[:200])
            self.conn.run("UPDATE cycle_groups SET verdict = 'protected', reason = :r,"
                          " evidence = jsonb_set(coalesce(evidence, '{}'::jsonb), '{d}', CAST(:d AS jsonb))"
                          " WHERE cycle_id = :c AND group_key = :k", r=rec.protection, d=d, c=c.id, k=group.key)
            self.conn.run("UPDATE orphans SET verdict = 'protected', reason = :r WHERE backend_id = :b"
                          " AND group_key = :k", r=rec.protection, b=c.backend_id, k=group.key)
        # The event targets the owner by the id and name kept in provider_refs.
        self.conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, provider_ref, owner_type, owner_id,"
                      " owner_name, details) SELECT :b, :c, :kind, :m, :ref, r.owner_type, r.owner_id, r.owner_name,"
                      " CAST(:d AS jsonb) FROM (SELECT 1) AS one LEFT JOIN provider_refs r ON r.provider_ref = :ref",
                      b=c.backend_id, c=c.id, kind=f"orphan_{rec.action.value}", m=rec.message,
                      ref=group.provider_ref, d=detail)
        self._update("open_deletes = open_deletes - 1, unsettled = unsettled OR :u, failed = failed OR :f,"
                     " tripped_regions = CASE WHEN :t AND NOT (CAST(:r AS text) = ANY(tripped_regions))"
                     "   THEN array_append(tripped_regions, CAST(:r AS text)) ELSE tripped_regions END,"
                     " error = CASE WHEN :f THEN coalesce(error, :e) ELSE error END",
                     u=rec.unsettled or rec.trip_region, f=rec.failed, t=rec.trip_region, r=group.region,
                     e=reason_line(f"delete of {group.provider_ref} in {group.region} failed: {rec.error or '?'}"))
        return True

    def finish(self, outcome: Outcome, *, clean_at: datetime | None, next_due_at: datetime,
               retry_delay_seconds: int) -> None:
        """STEP 7 as decided: the outcome, the backend's schedule, the lease released."""
        c = self.state
        self._update("outcome = :o, finished_at = :n", o=outcome.value, n=self.now)
        self.finished = FinishedCycle(backend_id=c.backend_id, cycle_id=c.id, mode=c.mode, outcome=outcome.value)
        if outcome is Outcome.FAILED:
            self.conn.run(CYCLE_FAILED_EVENT, ids=[c.id], no_reason=NO_REASON)
        self._close_vanished_orphans(c)
        self.conn.run(
            "UPDATE cleanup SET clean_at = :ca, clean_mode = CASE WHEN :o = 'clean' THEN :m ELSE clean_mode END,"
            " last_processed_at = :n, next_due_at = :due, retry_delay_seconds = :d, last_outcome = :o,"
            " last_error = :e, lease_owner = NULL, lease_expires_at = NULL WHERE backend_id = :b",
            ca=clean_at, o=outcome.value, m=c.mode, n=self.now, due=next_due_at, d=retry_delay_seconds,
            e=c.error, b=c.backend_id)

    def _close_vanished_orphans(self, c: Cycle) -> None:
        """Orphan rows this complete listing did not see again are closed, except in
        regions (or their zones) whose listing failed: those may still exist. Closed as
        'deleted' when the journal holds, since the orphan was first seen, a successful
        delete of its VM (the call whose target is its primary) or, for a group without a
        VM, of each of its resources: one whose cycle lost its lease before recording it
        (SAFETY.md rule 19). Otherwise 'gone'."""
        if c.failed or not c.listing_done:
            return
        vm, member = _DELETED.format(target="o.primary_id"), _DELETED.format(target="(r->>'id')")
        deleted = (f"CASE WHEN o.primary_id IS NOT NULL THEN EXISTS ({vm})"
                   " ELSE jsonb_array_length(o.resources) > 0 AND NOT EXISTS (SELECT 1 FROM"
                   f" jsonb_array_elements(o.resources) AS r WHERE NOT EXISTS ({member})) END")
        self.conn.run(
            # deleted_at: when the report counts it deleted (a deleter that lost its lease did not record it)
            f"UPDATE orphans o SET state = CASE WHEN {deleted} THEN 'deleted' ELSE 'gone' END,"
            f" deleted_at = CASE WHEN o.deleted_at IS NULL AND {deleted} THEN oc_clock() ELSE o.deleted_at END"
            " WHERE o.backend_id = :b AND o.last_cycle_id IS DISTINCT FROM :c"
            " AND o.state IN ('open', 'deleting', 'delete_failed', 'protected')"
            " AND NOT EXISTS (SELECT 1 FROM unnest(CAST(:f AS text[])) AS f(region)"
            "                 WHERE o.region = f.region OR o.region LIKE f.region || '-%')",
            b=c.backend_id, c=c.id, f=[f.region for f in c.failures])
