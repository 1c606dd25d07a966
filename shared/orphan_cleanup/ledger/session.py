"""One connection without a transaction: the reads and single-statement writes of the
hot paths (step 1's idle check, the tick, a classified batch), and the document the fenced
batch apply reads. The contracts are ``store``'s (its module docstring)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec
import pg8000.native

from orphan_cleanup.core.backends import Backend, from_snapshot
from orphan_cleanup.core.costs import size_of
from orphan_cleanup.core.decisions import BatchApplication
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.owners import Keep, Record
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.records import ApplyResult, CycleContext, IdleSnapshot, TickRow

_log = logging.getLogger("orphan_cleanup.ledger.store")

# ``json.dumps(default=str)`` in C: the apply's document (bench/classifier.py). Non-ASCII
# text is written as UTF-8, not escaped: the database reads the same values.
_to_json = msgspec.json.Encoder(enc_hook=str).encode


def apply_payload(app: BatchApplication) -> dict[str, Any]:
    """The JSON document ``oc_apply_batch`` reads (migrations/0003_apply.sql; its
    current version, which also writes the orphans' ``orphan_since`` and ``size``, is in
    0018_report.sql)."""
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
        # What ``report`` reads (migration 0018): since when it is an orphan, and its size as listed.
        entry["orphan_since"] = o.orphan_since
        entry["size"] = size_of(entry["resources"])
        orphans.append(entry)
    return {"cycle_id": app.cycle_id, "seq": app.seq, "last": app.last, "batch_count": app.batch_count,
            "failures": [f.model_dump() for f in app.failures], "groups": app.groups, "skipped": app.skipped,
            "rows": rows,
            "orphans": orphans,
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

    def cycle_context(self, cycle_id: str, *, account: bool = False) -> CycleContext | None:
        """The cycle's row and its backend, in one statement (None: no such cycle, or its
        backend row is gone). The backend is the cycle's snapshot (SAFETY.md rule 18),
        with the row's own mode beside it (``off`` still stops what is left of a cycle);
        a cycle without a snapshot (older than migration 0011) reads the row. ``account``:
        with the raw settings of every backend of its provider account now (rule 16)."""
        columns = ", ".join(f"b.{c.strip()}" for c in queries.COVERAGE_COLUMNS.split(","))
        settings = (", ARRAY(SELECT s.settings::text FROM coverages() s WHERE " + queries.SCOPE_SQL.format(t="s")
                    + " = " + queries.SCOPE_SQL.format(t="b") + ")") if account else ""
        rows = self.conn.run(f"SELECT c.id, c.backend_id, c.mode, c.listed_at, c.record_all,"
                             f" c.backend_snapshot::text, {columns}{settings}"
                             " FROM cycles c JOIN coverages() b ON b.id = c.backend_id WHERE c.id = :c", c=cycle_id)
        if not rows:
            return None
        cid, backend_id, mode, listed_at, record_all, snapshot, *row = rows[0]
        same_account = [queries.json_value(v) for v in row.pop() or ()] if account else None
        try:
            current: Backend | None = queries.backend_from_row(row)
        except ConfigError:
            if snapshot is None:
                raise
            current = None
        if snapshot is None:
            backend = current
        else:
            key = current.settings.key_text if current is not None else None
            backend = from_snapshot(json.loads(snapshot), key)
        assert backend is not None
        return CycleContext(id=cid, backend_id=backend_id, mode=mode, listed_at=listed_at, record_all=record_all,
                            backend=backend, row_mode=row[5], row=current, account=same_account)

    def origin_seen(self, cycle_id: str) -> None:
        """A retired coverage's cycle found a group whose owner names the backend it came
        from: the coverage does not retire after it (SAFETY.md rule 24)."""
        self.conn.run("UPDATE cycles SET origin_seen = true WHERE id = :c AND NOT origin_seen", c=cycle_id)

    def load_records(self, backend_id: str, groups: Iterable[ResourceGroup]) -> dict[str, Record]:
        """STEP 3: the ledger records of the groups' refs, keyed by ref, in one statement."""
        return queries.load_records(self.conn, backend_id, groups)

    def load_ledger(self, backend_id: str, groups: Iterable[ResourceGroup],
                    listed_at: datetime) -> tuple[dict[str, Record], dict[str, Keep]]:
        """STEP 3 with the operator's keeps in force at ``listed_at``, in one statement."""
        return queries.load_ledger(self.conn, backend_id, groups, listed_at)

    def apply(self, app: BatchApplication) -> ApplyResult:
        """One round trip: the fenced, idempotent application of a classified batch."""
        rows = self.conn.run("SELECT oc_apply_batch(CAST(:p AS jsonb))", p=_to_json(apply_payload(app)).decode())
        r = rows[0][0] if isinstance(rows[0][0], dict) else json.loads(rows[0][0])
        return ApplyResult(status=r["status"], listing_complete=bool(r.get("listing_complete")),
                           mode=r.get("mode"), groups_listed=r.get("groups_listed"))

    def backend_and_idle(self, backend_id: str) -> tuple[Backend, IdleSnapshot | None]:
        """The backend's row (``ConfigError`` when unknown) and STEP 1's facts, in one read
        without a lock (None when the backend has no cleanup row yet)."""
        columns = ", ".join(f"b.{c.strip()}" for c in queries.COVERAGE_COLUMNS.split(","))
        rows = self.conn.run(
            f"SELECT {columns}, c.backend_id IS NOT NULL, c.clean_at, c.clean_mode, c.lease_owner IS NOT NULL,"
            " c.retry_delay_seconds, c.next_due_at,"
            " c.clean_at IS NOT NULL AND " + queries.ACTIVITY_EXISTS.format(since="c.clean_at", backend=":b") +
            ", oc_clock() FROM coverages() b LEFT JOIN cleanup c ON c.backend_id = b.id WHERE b.id = :b",
            b=backend_id)
        if not rows:
            raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
        *row, enrolled, clean_at, clean_mode, leased, delay, next_due, active, clock = rows[0]
        backend = queries.backend_from_row(row)
        if not enrolled:
            return backend, None
        return backend, IdleSnapshot(clean_at=clean_at, clean_mode=clean_mode, leased=bool(leased),
                                     retry_delay_seconds=delay, next_due_at=next_due,
                                     activity_since_clean=bool(active), now=clock)

    def tick_rows(self, known: dict[bytes, Backend] | None = None, *, horizon: bool = True) -> list[TickRow]:
        """The tick's one statement: enroll every backend once the ledger has issued refs,
        and read every backend with STEP 1's facts (activity of its whole account, SAFETY.md
        rule 9) and the database clock. ``horizon``: a backend due later than any
        tolerance comes without facts (``TickRow.due_later``); False (a caller on a clock
        of its own) reads the facts of every backend.

        ``known``: the backends an earlier tick validated, keyed by their row's JSON;
        a row whose JSON is the same is the same ``Backend`` (a frozen model of the same
        input), not validated again. Replaced by this tick's rows (as large as the table).
        A misconfigured row is never kept: it fails, and is logged, at every tick."""
        (doc, stale_doc), = self.conn.run(queries.TICK_SQL,
                                          horizon=queries.TICK_HORIZON_SECONDS if horizon else None)
        now, rows = queries.tick_rows_from_json(doc)
        stale: dict[str, int] = json.loads(stale_doc)
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
                out.append(TickRow(backend=backend, snapshot=None, lease_expires_at=None, due_later=True,
                                   stale_seconds=stale.get(backend.id)))
                continue
            enrolled, clean_at, clean_mode, leased, expires, delay, next_due, active = facts
            snapshot = IdleSnapshot(clean_at=clean_at, clean_mode=clean_mode, leased=bool(leased),
                                    retry_delay_seconds=delay, next_due_at=next_due,
                                    activity_since_clean=bool(active), now=now) if enrolled else None
            out.append(TickRow(backend=backend, snapshot=snapshot, lease_expires_at=expires,
                               stale_seconds=stale.get(backend.id)))
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

    def stamp_listed_at(self, cycles: dict[str, str], listed_at: datetime | None = None) -> dict[str, datetime]:
        """Stamp the listing time of live cycles (``cycles``: cycle id -> backend id) right before
        their listing's first provider call: ``listed_at``, else the database clock after the
        locks (SAFETY.md rule 13). One fenced statement (``_FENCED``); returns the cycles stamped,
        with their time: one not returned lost its lease or finished, and is not listed."""
        return {r[0]: r[1] for r in self.conn.run(
            "UPDATE cycles c SET listed_at = coalesce(CAST(:t AS timestamptz), oc_clock())" + _FENCED
            + " RETURNING c.id, c.listed_at", t=listed_at, ids=list(cycles), backends=list(cycles.values()))}

    def record_region_groups(self, counts: dict[str, dict[str, int]], backends: dict[str, str]) -> set[str]:
        """The group count of each region each cycle listed and believed (by cycle id; ``backends``:
        cycle id -> backend id): the backend's next baselines if the cycle finishes clean
        (migration 0010's trigger). One fenced statement (``_FENCED``); returns the cycles
        recorded: one not returned lost its lease or finished (SAFETY.md rule 6)."""
        return {r[0] for r in self.conn.run(
            "UPDATE cycles c SET region_groups = CAST(:g AS jsonb) -> c.id" + _FENCED + " RETURNING c.id",
            g=json.dumps(counts), ids=list(counts), backends=[backends[c] for c in counts])}

    def mark_suspect(self, cycle_id: str, backend_id: str, counts: dict[str, int]) -> None:
        """Remember the group counts of region listings found anomalous (one statement), if the
        cycle that listed them still holds its lease: a fenced cycle's listing is no baseline
        (SAFETY.md rule 6)."""
        self.conn.run(
            "INSERT INTO region_listings AS l (backend_id, region, suspect_groups, suspect_at)"
            " SELECT :b, r.key, r.value::integer, oc_clock() FROM jsonb_each_text(CAST(:c AS jsonb)) AS r"
            " WHERE EXISTS (SELECT 1 FROM cycles c JOIN cleanup cl ON cl.backend_id = c.backend_id"
            "                WHERE c.id = :cycle AND c.backend_id = :b AND c.outcome IS NULL"
            "                  AND cl.fence = c.fence AND cl.lease_owner = c.id)"
            " ON CONFLICT (backend_id, region) DO UPDATE"
            " SET suspect_groups = excluded.suspect_groups, suspect_at = excluded.suspect_at",
            b=backend_id, c=json.dumps(counts), cycle=cycle_id)

    def mark_idle(self, backend_id: str, *, now: datetime, next_due: datetime, seen: IdleSnapshot,
                  mode: str) -> bool:
        """Mark an idle backend processed, unless its row moved since ``seen``
        (a lease, another clean cycle, a mode change). True when marked."""
        return bool(self.conn.run(
            "UPDATE cleanup SET last_processed_at = :n, next_due_at = :d WHERE backend_id = :b"
            " AND lease_owner IS NULL AND clean_at = :ca AND clean_mode = :m RETURNING 1",
            n=now, d=next_due, b=backend_id, ca=seen.clean_at, m=mode))


# A write of live cycles (``:ids``; ``:backends``, their backends), fenced (SAFETY.md rule 6) in
# one statement that keeps the store's lock order: the backends' cleanup rows first, locked in
# id order, then the cycle rows the update locks. Only a cycle that still holds its backend's
# lease at its fence, unfinished, is written.
_FENCED = (" FROM (SELECT backend_id, fence, lease_owner FROM cleanup WHERE backend_id = ANY(CAST(:backends AS text[]))"
           "        ORDER BY backend_id FOR UPDATE) AS cl"
           " WHERE c.id = ANY(CAST(:ids AS text[])) AND c.outcome IS NULL AND cl.backend_id = c.backend_id"
           " AND cl.fence = c.fence AND cl.lease_owner = c.id")
