"""The ledger port: every SQL statement of the cleanup goes through ``LedgerStore``
(the provisioner-side ``LedgerClient`` and the migrations excepted).

The store records; it never decides. It returns frozen snapshots
(``ledger/records.py``) and takes the pipeline's decisions (``decisions.py``);
it never imports ``classify``.

Contracts:

- **Fencing.** Every write of a running cycle goes through ``cycle()``, whose
  ``LockedCycle`` checks ``cleanup.fence = cycles.fence``,
  ``cleanup.lease_owner = cycles.id`` and ``cycles.outcome IS NULL`` under the
  locks first: a cycle that lost its lease (or finished) raises ``LeaseLost``
  and writes nothing. ``LedgerSession.apply`` does the same check in plpgsql
  (``oc_apply_batch``) and answers ``fenced``.
- **Idempotency.** A redelivered batch (same cycle and ``seq``) applies
  nothing and answers ``duplicate``; a delete request is keyed by (cycle, group),
  so queueing it twice adds nothing and recording its end twice writes nothing
  the second time (``record_delete`` returns False: "already applied").
- **One clock** (DESIGN §5 rule 13). A method or unit taking ``now=None`` reads
  the database clock (``oc_clock()``) inside its own statement or transaction;
  only tests and the simulation pass a time.
- **Lock order**: the backend's ``cleanup`` row, then its ``cycles`` row.
- **No transaction on the hot paths**: ``session()`` is one connection
  without a transaction; the idle STEP 1 check is one read and one conditional
  write, a classified batch is three statements (cycle and backend, the join,
  the apply).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import msgspec
import pg8000.native

from orphan_cleanup.core.decisions import BatchApplication
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.models import Backend, BackendSettings, Record, ResourceGroup
from orphan_cleanup.ledger import queries, reports
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import ApplyResult, CycleContext, CycleReport, IdleSnapshot, TickRow
from orphan_cleanup.ledger.unit import LeaseUnit, LockedCycle

_log = logging.getLogger(__name__)

#: Groups per FETCH of ``report_groups``.
REPORT_PAGE = 2_000

# ``json.dumps(default=str)`` in C: the apply's document (bench/classifier.py). Non-ASCII
# text is written as UTF-8, not escaped: the database reads the same values.
_to_json = msgspec.json.Encoder(enc_hook=str).encode


def apply_payload(app: BatchApplication) -> dict[str, Any]:
    """The JSON document ``oc_apply_batch`` reads (migrations/0003_apply.sql; its
    current version, which writes ``evidence`` into cycle_groups, is in 0008_evidence.sql)."""
    rows = []
    for r in app.rows:
        d = r.as_dict()
        if r.evidence:
            d["evidence"] = r.evidence
        rows.append(d)
    # Every orphan row is also a cycle_groups row: dump each once. Only cycle_groups
    # keeps the evidence: the orphans entries leave it out.
    by_id = dict(zip(map(id, app.rows), rows, strict=True))
    orphans = []
    for o in app.orphans:
        entry = {**(by_id.get(id(o.row)) or o.row.as_dict()), "state": o.state, "reported": 1 if o.reported else 0}
        entry.pop("evidence", None)
        orphans.append(entry)
    return {"cycle_id": app.cycle_id, "seq": app.seq, "last": app.last, "batch_count": app.batch_count,
            "failures": [f.model_dump() for f in app.failures], "groups": app.groups, "skipped": app.skipped,
            "rows": rows,
            "orphans": orphans,
            "orphan_resources": [{"provider_ref": ref, "resource_id": rid} for ref, rid in app.orphan_resources],
            "events": [{"kind": f"{e.row.verdict.value}_reported", "provider_ref": e.row.group.provider_ref,
                        "message": e.message, "owner_type": e.row.owner_type, "owner_id": e.row.owner_id,
                        "owner_name": e.row.owner_name,
                        "details": {"resources": [r.id for r in e.row.group.resources], "reason": e.row.reason}}
                       for e in app.events]}


class LedgerSession:
    """One connection, no transaction: the reads and single-statement writes of
    the hot paths (STEP 1's idle check, a classified batch)."""

    def __init__(self, conn: pg8000.native.Connection) -> None:
        self.conn = conn

    def backend(self, backend_id: str) -> Backend:
        """The backend row (``ConfigError`` when unknown)."""
        return queries.get_backend(self.conn, backend_id)

    def cycle_context(self, cycle_id: str) -> CycleContext | None:
        """The cycle's row and its backend's, in one statement (None: no such cycle)."""
        columns = ", ".join(f"b.{c.strip()}" for c in queries.BACKEND_COLUMNS.split(","))
        rows = self.conn.run(f"SELECT c.id, c.backend_id, c.mode, c.listed_at, c.record_all, {columns}"
                             " FROM cycles c JOIN backends b ON b.id = c.backend_id WHERE c.id = :c", c=cycle_id)
        if not rows:
            return None
        cid, backend_id, mode, listed_at, record_all, *backend = rows[0]
        return CycleContext(id=cid, backend_id=backend_id, mode=mode, listed_at=listed_at, record_all=record_all,
                            backend=queries.backend_from_row(backend))

    def load_records(self, backend_id: str, groups: Iterable[ResourceGroup]) -> dict[str, Record]:
        """STEP 3: the ledger records of the groups' refs, keyed by ref, in one statement."""
        return queries.load_records(self.conn, backend_id, groups)

    def apply(self, app: BatchApplication) -> ApplyResult:
        """One round trip: the fenced, idempotent application of a classified batch."""
        rows = self.conn.run("SELECT oc_apply_batch(CAST(:p AS jsonb))", p=_to_json(apply_payload(app)).decode())
        r = rows[0][0] if isinstance(rows[0][0], dict) else json.loads(rows[0][0])
        return ApplyResult(status=r["status"], listing_complete=bool(r.get("listing_complete")),
                           mode=r.get("mode"), groups_listed=r.get("groups_listed"))

    def idle_snapshot(self, backend_id: str) -> IdleSnapshot | None:
        """STEP 1's facts in one read, without a lock: None when the backend has no
        cleanup row yet."""
        rows = self.conn.run(
            "SELECT c.clean_at, c.clean_mode, c.lease_owner IS NOT NULL, c.retry_delay_seconds, c.next_due_at,"
            " c.clean_at IS NOT NULL AND " + queries.ACTIVITY_EXISTS.format(since="c.clean_at", backend=":b") +
            ", oc_clock() FROM cleanup c WHERE c.backend_id = :b", b=backend_id)
        if not rows:
            return None
        clean_at, clean_mode, leased, delay, next_due, active, clock = rows[0]
        return IdleSnapshot(clean_at=clean_at, clean_mode=clean_mode, leased=bool(leased),
                            retry_delay_seconds=delay, next_due_at=next_due, activity_since_clean=bool(active),
                            now=clock)

    def tick_rows(self, known: dict[bytes, Backend] | None = None, *, horizon: bool = True) -> list[TickRow]:
        """The tick's one statement: enroll every backend once the ledger has issued refs,
        and read every backend with STEP 1's facts (activity of its whole account, DESIGN
        §5 rule 9) and the database clock. ``horizon``: a backend due later than any
        tolerance comes without facts (``TickRow.due_later``); False (a caller on a clock
        of its own) reads the facts of every backend.

        ``known``: the backends an earlier tick validated, keyed by their row's JSON;
        a row whose JSON is the same is the same ``Backend`` (a frozen model of the same
        input), not validated again. Replaced by this tick's rows (as large as the table).
        A misconfigured row is never kept: it fails, and is logged, at every tick."""
        now, rows = queries.tick_rows_from_json(self.conn.run(
            queries.TICK_SQL, horizon=queries.TICK_HORIZON_SECONDS if horizon else None)[0][0])
        seen: dict[bytes, Backend] = {}
        out = []
        for raw, facts in rows:
            key = bytes(raw)
            backend = known.get(key) if known is not None else None
            if backend is None:
                columns = json.loads(key)
                try:
                    backend = queries.backend_from_row(columns)
                except ConfigError as e:  # a misconfigured row fails that backend alone, never the tick
                    _log.error("tick: backend %s skipped: %s", columns[0], e)
                    continue
            seen[key] = backend
            if facts is None:
                out.append(TickRow(backend=backend, snapshot=None, lease_expires_at=None, due_later=True))
                continue
            enrolled, clean_at, clean_mode, leased, expires, delay, next_due, active = facts
            snapshot = IdleSnapshot(clean_at=clean_at, clean_mode=clean_mode, leased=bool(leased),
                                    retry_delay_seconds=delay, next_due_at=next_due,
                                    activity_since_clean=bool(active), now=now) if enrolled else None
            out.append(TickRow(backend=backend, snapshot=snapshot, lease_expires_at=expires))
        if known is not None:
            known.clear()
            known.update(seen)
        return out

    def mark_idle_many(self, idle: Sequence[tuple[str, IdleSnapshot, str, datetime]], now: datetime) -> set[str]:
        """``mark_idle`` for many backends in one statement: (backend id, the snapshot
        seen, the mode, next due). Returns the ids marked."""
        if not idle:
            return set()
        payload = json.dumps([{"backend_id": b, "clean_at": seen.clean_at, "mode": mode, "next_due": due}
                              for b, seen, mode, due in idle], default=str)
        return {r[0] for r in self.conn.run(
            "UPDATE cleanup c SET last_processed_at = :n, next_due_at = x.next_due"
            " FROM jsonb_to_recordset(CAST(:p AS jsonb))"
            "      AS x(backend_id text, clean_at timestamptz, mode text, next_due timestamptz)"
            " WHERE c.backend_id = x.backend_id AND c.lease_owner IS NULL AND c.clean_at = x.clean_at"
            " AND c.clean_mode = x.mode RETURNING c.backend_id", n=now, p=payload)}

    def region_baselines(self, backend_ids: Sequence[str]) -> dict[str, dict[str, tuple[int | None, int | None]]]:
        """Per backend and region: (groups of the last clean listing, groups of the
        suspect listing since), in one statement."""
        out: dict[str, dict[str, tuple[int | None, int | None]]] = {b: {} for b in backend_ids}
        for b, region, clean, suspect in self.conn.run(
                "SELECT backend_id, region, clean_groups, suspect_groups FROM region_listings"
                " WHERE backend_id = ANY(CAST(:b AS text[]))", b=list(backend_ids)):
            out[b][region] = (clean, suspect)
        return out

    def mark_suspect(self, backend_id: str, counts: dict[str, int]) -> None:
        """Remember the group counts of region listings found anomalous (one statement)."""
        self.conn.run(
            "INSERT INTO region_listings AS l (backend_id, region, suspect_groups, suspect_at)"
            " SELECT :b, r.key, r.value::integer, oc_clock() FROM jsonb_each_text(CAST(:c AS jsonb)) AS r"
            " ON CONFLICT (backend_id, region) DO UPDATE"
            " SET suspect_groups = excluded.suspect_groups, suspect_at = excluded.suspect_at",
            b=backend_id, c=json.dumps(counts))

    def mark_idle(self, backend_id: str, *, now: datetime, next_due: datetime, seen: IdleSnapshot,
                  mode: str) -> bool:
        """Mark an idle backend processed, unless its row moved since ``seen``
        (a lease, another clean cycle, a mode change). True when marked."""
        return bool(self.conn.run(
            "UPDATE cleanup SET last_processed_at = :n, next_due_at = :d WHERE backend_id = :b"
            " AND lease_owner IS NULL AND clean_at = :ca AND clean_mode = :m RETURNING 1",
            n=now, d=next_due, b=backend_id, ca=seen.clean_at, m=mode))


class LedgerStore:
    """The cleanup's ledger port (see the module docstring for its contracts)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @contextmanager
    def session(self) -> Iterator[LedgerSession]:
        with self.db.connection() as conn:
            yield LedgerSession(conn)

    @contextmanager
    def lease(self, backend_id: str, now: datetime | None = None) -> Iterator[LeaseUnit]:
        """STEP 1 and the lease of one backend, in one transaction holding its cleanup row."""
        with self.db.transaction() as conn:
            yield LeaseUnit(conn, backend_id, now)

    @contextmanager
    def cycle(self, cycle_id: str, now: datetime | None = None) -> Iterator[LockedCycle]:
        """A live cycle, fenced and locked for one transaction (``LeaseLost`` otherwise)."""
        with self.db.transaction() as conn:
            yield LockedCycle(conn, cycle_id, now)

    def enroll(self) -> int:
        """Create a cleanup row for each backend once the ledger has issued refs
        (a periodic call, so backends added by any writer are picked up)."""
        with self.db.transaction() as conn:
            return len(conn.run(
                "INSERT INTO cleanup (backend_id) SELECT b.id FROM backends b"
                " WHERE EXISTS (SELECT 1 FROM provider_refs) ON CONFLICT DO NOTHING RETURNING backend_id"))

    def load_records(self, backend_id: str, groups: Iterable[ResourceGroup]) -> dict[str, Record]:
        with self.session() as s:
            return s.load_records(backend_id, groups)

    # ---- per-ref delete gates (DESIGN §5 rule 4) ----------------------------------

    def acquire_gate(self, scope: str, ref: str, holder: str, ttl_seconds: int) -> bool:
        """Take the per-ref delete gate (a lease row). Unrelated refs never wait. The gate is
        per account (``Backend.scope``, kept in the ``backend_id`` column): backends sharing an
        account list the same groups and must not delete one at the same time. The holder may renew."""
        with self.db.transaction() as conn:
            return bool(conn.run(
                "INSERT INTO delete_gates AS g (backend_id, provider_ref, holder, expires_at)"
                " VALUES (:b, :r, :h, now() + make_interval(secs => :t))"
                " ON CONFLICT (backend_id, provider_ref) DO UPDATE SET holder = excluded.holder,"
                " expires_at = excluded.expires_at WHERE g.expires_at < now() OR g.holder = excluded.holder"
                " RETURNING holder", b=scope, r=ref, h=holder, t=ttl_seconds))

    def release_gate(self, scope: str, ref: str, holder: str) -> None:
        """Release the gate if ``holder`` holds it (else nothing)."""
        with self.db.transaction() as conn:
            conn.run("DELETE FROM delete_gates WHERE backend_id = :b AND provider_ref = :r AND holder = :h",
                     b=scope, r=ref, h=holder)

    # ---- operators ------------------------------------------------------------------

    def backends(self) -> list[Backend]:
        with self.db.connection() as conn:
            return queries.list_backends(conn)

    def backend_rows(self) -> list[reports.BackendRow]:
        """Every backend as stored, a misconfigured one included (``BackendRow.error``)."""
        with self.db.connection() as conn:
            return reports.backend_rows(conn)

    def backend_row(self, backend_id: str) -> reports.BackendRow:
        """One backend as stored (``ConfigError`` when unknown)."""
        with self.db.connection() as conn:
            return reports.backend_row(conn, backend_id)

    def update_backend(self, backend_id: str,
                       edit: Callable[[reports.BackendRow, reports.RunningCycle | None], reports.BackendRow],
                       ) -> reports.BackendRow:
        """Replace a backend's account, regions, settings and mode with ``edit(current,
        running)``'s, in one transaction holding its cleanup row and its row: ``edit`` sees
        the row as stored and the cycle holding a live lease, and raises to change nothing.
        Returns the row as stored afterwards."""
        with self.db.transaction() as conn:
            running = reports.lock_running_cycle(conn, backend_id)
            reports.write_backend(conn, edit(reports.backend_row(conn, backend_id, lock=True), running))
            return reports.backend_row(conn, backend_id)

    def remove_backend(self, backend_id: str, *, force: bool = False) -> reports.Removal:
        """Delete a backend (no future cycle), keeping its history; ``BackendBusy`` while a
        cycle of it holds a live lease, unless ``force`` fences that cycle in the same
        transaction (see ``reports.remove_backend``)."""
        with self.db.transaction() as conn:
            return reports.remove_backend(conn, backend_id, force=force)

    def add_backend(self, *, backend_id: str, provider: str, account: str, regions: Sequence[str],
                    settings: BackendSettings, mode: str | None = None) -> None:
        """Insert a backend (``ConfigError`` if its id exists); ``settings`` are stored as
        given (unset keys left out)."""
        with self.db.connection() as conn:
            reports.add_backend(conn, backend_id=backend_id, provider=provider, account=account,
                                regions=regions, settings=settings.model_dump(mode="json", exclude_unset=True),
                                mode=mode)

    def status(self, backend_id: str | None = None) -> list[reports.BackendStatus]:
        """Every backend's status (or one's), with the cycle holding its live lease."""
        with self.db.connection() as conn:
            return reports.status_rows(conn, backend_id)

    def cycle_report(self, cycle_id: str, *, groups: bool = True) -> CycleReport:
        """The C3 report; ``groups=False``: its header only (stream the groups with ``report_groups``)."""
        with self.db.connection() as conn:
            return reports.cycle_report(conn, cycle_id, with_groups=groups)

    def report_groups(self, cycle_id: str, page: int = REPORT_PAGE) -> Iterator[dict[str, Any]]:
        """The groups of the cycle's C3 report, as C3 dicts in report order, ``page`` at a
        time through a server-side cursor (one read-only transaction): memory stays flat
        whatever the cycle's size. Same order and values as ``cycle_report``'s groups."""
        with self.db.transaction() as conn:
            conn.run("SET TRANSACTION READ ONLY")
            conn.run(f"DECLARE oc_report NO SCROLL CURSOR FOR {reports.GROUP_ROWS_SQL}", c=cycle_id)
            while rows := conn.run(f"FETCH {int(page)} FROM oc_report"):
                for (doc,) in rows:
                    g = json.loads(doc)
                    yield {"provider_ref": g["provider_ref"], "region": g["region"], "primary_id": g["primary_id"],
                           "resources": g["resources"], "verdict": g["verdict"], "reason": g["reason"],
                           "action": g["action"], **({"detail": g["detail"]} if g.get("detail") else {})}
            conn.run("CLOSE oc_report")

    def backdate_owner(self, owner_id: str, seconds: int, *, provisioned_only: bool = False) -> None:
        with self.db.transaction() as conn:
            reports.backdate_owner(conn, owner_id, seconds, provisioned_only=provisioned_only)
