"""Ledger reads: backends, the STEP 3 join, the STEP 1 activity query."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec
import pg8000.native
from pydantic import TypeAdapter, ValidationError

from orphan_cleanup.core.backend_rules import describe_validation
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.listing import ResourceGroup, is_valid_ref
from orphan_cleanup.core.owners import Keep, LedgerRecord, LedgerRow, Record

BACKEND_COLUMNS = "id, provider, account, regions, settings, mode"
#: A row of the ``coverages`` view (migration 0020): a backend, or a retired coverage with the
#: id of the backend it came from (SAFETY.md rule 24).
COVERAGE_COLUMNS = BACKEND_COLUMNS + ", retired_from"


def json_value(value: Any) -> Any:
    """A json/jsonb column as pg8000 returns it (decoded, or text for some types), decoded. A
    JSON string value comes back already decoded, as text that is no JSON: it is that string."""
    if not isinstance(value, (str, bytes)):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def backend_from_row(row: list) -> Backend:
    """A ``backends`` row as a ``Backend``. A row the model refuses (plain SQL can write
    anything, a ``settings`` that is not a JSON object included) is a one-line
    ``ConfigError`` naming the backend and the field: only that backend's work fails."""
    settings = {} if row[4] is None else json_value(row[4])
    if not isinstance(settings, dict):
        raise ConfigError(f"backend {row[0]!r} is misconfigured: settings: must be a JSON object, got"
                          f" {type(settings).__name__} (fix it with `orphan-cleanup backend update {row[0]}"
                          " --settings-replace '{...}'`)")
    try:
        return Backend.model_validate({"id": row[0], "provider": row[1], "account": row[2],
                                       "regions": row[3] or (), "settings": settings, "mode": row[5],
                                       "retired_from": row[6] if len(row) > 6 else None})
    except ValidationError as e:
        raise ConfigError(f"backend {row[0]!r} is misconfigured: {describe_validation(e)}"
                          f" (fix it with `orphan-cleanup backend update {row[0]}`)") from e


def get_backend(conn: pg8000.native.Connection, backend_id: str) -> Backend:
    """A backend, or a retired coverage by its own id (SAFETY.md rule 24)."""
    rows = conn.run(f"SELECT {COVERAGE_COLUMNS} FROM coverages() WHERE id = :i", i=backend_id)
    if not rows:
        raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
    return backend_from_row(rows[0])


def list_backends(conn: pg8000.native.Connection) -> list[Backend]:
    """Every backend and retired coverage (SAFETY.md rule 24): what the tick runs."""
    return [backend_from_row(r) for r in conn.run(f"SELECT {COVERAGE_COLUMNS} FROM coverages() ORDER BY id")]


# ``provider:account`` of a backends row ``{t}``, as ``Backend.scope`` computes it:
# a GCP backend lists ``settings.project`` when set, else its account.
SCOPE_SQL = ("{t}.provider || ':' || CASE WHEN {t}.provider = 'gcp'"
             " THEN coalesce(nullif({t}.settings->>'project', ''), {t}.account) ELSE {t}.account END")

# STEP 3 in one statement: every ref of the batch with its owner, including
# soft-deleted owners and refs whose owner row is gone (LEFT JOIN), the owner read from
# the table its ``owner_type`` names (``instances`` for an instance or a gateway,
# ``volumes`` for a volume: README, C1; at most one of the two joins finds a row, so
# ``coalesce`` reads the one found; any other type finds none), with the
# account of the backend each owner names (SAFETY.md rule 10). For refs
# with leftover groups, the resource ids the deletions of any backend of the same account
# saw attached to orphan VMs they deleted (rule 10: ownership is by account; a backend that
# shares the account's listing knows what another one's deletion learnt); for
# every ref, the primaries an earlier delete found termination-protected (rule 14:
# no listing shows that protection, the orphans row remembers it; an index probe
# on orphans_ref_idx per ref).
#
# Shaped for speed (bench/classifier.py measures it against the row-per-ref form):
# - the refs travel as one comma-joined text (refs match ^[a-z0-9]{12}$), not a
#   text[] parameter that pg8000 escapes element by element;
# - ``ANY`` on both sides lets Postgres read both tables through their ref
#   indexes and merge them, instead of a sequential scan of ``instances`` that
#   grows with the ledger;
# - the result is one JSON document that pydantic parses and validates in
#   Rust (timestamps included) instead of pg8000 decoding every column of
#   every row in Python (``strptime`` per timestamp was half the time).
# Which owner row STEP 3 reads (README, C1): the table ``owner_type`` names, ``volumes`` for
# ``volume`` and ``instances`` otherwise; when that table has no row of the ref but the other has,
# the other's (a platform that wrote a volumes row and left owner_type at its default): a live
# owner then reads as one, never as a hard-deleted owner whose resources are orphans (SAFETY.md
# rule 1: fail closed; a volume's statuses are no instance's, so it is skipped).
_USE_VOLUME = "(v.id IS NOT NULL AND (r.owner_type = 'volume' OR i.id IS NULL))"

JOIN_SQL = """
SELECT coalesce(json_agg(json_build_object(
           'provider_ref', r.provider_ref, 'owner_type', r.owner_type, 'owner_id', r.owner_id,
           'owner_name', r.owner_name, 'issued_at', r.issued_at,
           'instance_found', i.id IS NOT NULL OR v.id IS NOT NULL,
           'status', CASE WHEN {usev} THEN v.status ELSE i.status END,
           'backend_id', CASE WHEN {usev} THEN v.backend_id ELSE i.backend_id END,
           'primary_id', CASE WHEN {usev} THEN v.primary_id ELSE i.primary_id END,
           'region', CASE WHEN {usev} THEN v.region ELSE i.region END,
           'created_at', CASE WHEN {usev} THEN v.created_at ELSE i.created_at END,
           'provisioned_at', CASE WHEN {usev} THEN v.provisioned_at ELSE i.provisioned_at END,
           'terminated_at', CASE WHEN {usev} THEN NULL ELSE i.terminated_at END,
           'deleted_at', CASE WHEN {usev} THEN v.deleted_at ELSE i.deleted_at END,
           'owner_backend_scope', ob.scope,
           'known_orphan_resource_ids',
           CASE WHEN r.provider_ref = ANY(string_to_array(:leftover, ',')) THEN
               (SELECT coalesce(json_agg(DISTINCT o.resource_id), '[]') FROM orphan_resources o
                 WHERE o.provider_ref = r.provider_ref AND o.backend_id IN (
                       SELECT kb.id FROM coverages() kb, coverages() me WHERE me.id = :backend
                          AND {kscope} = {mescope}))
           ELSE '[]' END,
           'protected_primaries',
           (SELECT coalesce(json_object_agg(o.primary_id, o.reason), '{}') FROM orphans o
             WHERE o.backend_id = :backend AND o.provider_ref = r.provider_ref AND o.state = 'protected'
               AND o.reason = 'termination_protection' AND o.primary_id IS NOT NULL))), '[]')::text
  FROM provider_refs r
  LEFT JOIN instances i
         ON i.provider_ref = r.provider_ref AND i.provider_ref = ANY(string_to_array(:refs, ','))
  LEFT JOIN volumes v
         ON v.provider_ref = r.provider_ref AND v.provider_ref = ANY(string_to_array(:refs, ','))
  LEFT JOIN LATERAL (
       SELECT {scope} AS scope FROM coverages() ob
        WHERE ob.origin = CASE WHEN {usev} THEN v.backend_id ELSE i.backend_id END
        ORDER BY {scope} = (SELECT {mescope} FROM coverages() me WHERE me.id = :backend) DESC,
                 ob.retired_from IS NOT NULL LIMIT 1) ob ON true
 WHERE r.provider_ref = ANY(string_to_array(:refs, ','))
""".replace("{usev}", _USE_VOLUME).replace("{scope}", SCOPE_SQL.format(t="ob")) \
    .replace("{kscope}", SCOPE_SQL.format(t="kb")).replace("{mescope}", SCOPE_SQL.format(t="me"))

_RECORDS = TypeAdapter(list[LedgerRecord])


_RECORD_ROWS = msgspec.json.Decoder(list[LedgerRow])


def records_from_json(doc: str | bytes) -> Sequence[Record]:
    """JOIN_SQL's document as records: ``LedgerRow``s, whose fields equal (values and
    types) those of ``TypeAdapter(list[LedgerRecord]).validate_json(doc)``
    (tests/unit/test_record_decode.py, and bench/floors.py checks it on every measured
    batch).

    msgspec parses and type-checks the document in C, timestamps included, and builds
    no pydantic model per ref (those were most of this step's time, and their scattered
    dicts slowed the classifier reading them). Anything msgspec refuses (a null where a
    string is due, a timestamp it cannot read, a missing or unknown key) goes to
    pydantic, which decides as before: ``LedgerRecord``s or the same error."""
    try:
        rows: list[LedgerRow] = _RECORD_ROWS.decode(doc)
        return rows
    except msgspec.MsgspecError:
        return _RECORDS.validate_json(doc)


def load_records(conn: pg8000.native.Connection, backend_id: str,
                 groups: Iterable[ResourceGroup]) -> dict[str, Record]:
    """STEP 3: the ledger records of the groups' refs, keyed by ref, in one statement."""
    refs = _ref_lists(groups)
    if refs is None:
        return {}
    rows = conn.run(JOIN_SQL, refs=refs[0], leftover=refs[1], backend=backend_id)
    return {record.provider_ref: record for record in records_from_json(rows[0][0])}


def _ref_lists(groups: Iterable[ResourceGroup]) -> tuple[str, str] | None:
    """JOIN_SQL's ``:refs`` and ``:leftover`` (the refs of groups without a primary), or None
    for no group. A value that is not a valid ref cannot be in provider_refs (CHECK
    constraint), nor kept: leaving it out changes no answer and keeps the comma-joined list
    unambiguous. (In no particular order: the join reads them as a set.)"""
    refs: set[str] = set()
    leftover: set[str] = set()
    for g in groups:
        refs.add(g.provider_ref)
        if g.primary_id is None:
            leftover.add(g.provider_ref)
    if not refs:
        return None
    return ",".join(r for r in refs if is_valid_ref(r)), ",".join(r for r in leftover if is_valid_ref(r))


# The operator's keeps in force for backend ``{backend}`` at ``{t}`` (SAFETY.md rule 23), one
# row per ref (the longest, when backends of the account kept it twice): its own, and those
# of every backend of its account (a keep holds account-wide, as ownership: rules 10 and 16).
# ``{refs}``: the refs asked about. Read from orphan_keeps itself, so a ref without a
# provider_refs row (an unknown ref a cycle recorded) is kept too.
KEEPS_SQL = ("SELECT DISTINCT ON (k.provider_ref) k.provider_ref, k.reason, k.kept_at, k.until"
             " FROM orphan_keeps k LEFT JOIN coverages() kb ON kb.id = {backend}"
             " WHERE k.provider_ref = ANY({refs}) AND (k.until IS NULL OR k.until > {t})"
             " AND (k.backend_id = {backend} OR k.scope = " + SCOPE_SQL.format(t="kb") + ")"
             " ORDER BY k.provider_ref, k.until DESC NULLS FIRST")

# STEP 3 with the keeps, still one statement per batch: JOIN_SQL's document, and beside it
# the batch's refs kept at the listing time ``:t``, as ``{ref: keep}``.
LEDGER_SQL = ("SELECT (" + JOIN_SQL + "), (SELECT coalesce(json_object_agg(k.provider_ref, json_build_object("
              "'reason', k.reason, 'kept_at', k.kept_at, 'until', k.until)), '{}')::text FROM ("
              + KEEPS_SQL.format(backend=":backend", refs="string_to_array(:refs, ',')",
                                 t="CAST(:t AS timestamptz)") + ") k)")

_KEEPS = msgspec.json.Decoder(dict[str, Keep])


def load_ledger(conn: pg8000.native.Connection, backend_id: str, groups: Iterable[ResourceGroup],
                listed_at: datetime) -> tuple[dict[str, Record], dict[str, Keep]]:
    """STEP 3 in one statement: the groups' records, keyed by ref (``load_records``), and the
    backend's keeps of those refs in force at ``listed_at``, keyed by ref."""
    refs = _ref_lists(groups)
    if refs is None:
        return {}, {}
    rows = conn.run(LEDGER_SQL, refs=refs[0], leftover=refs[1], backend=backend_id, t=listed_at)
    return ({record.provider_ref: record for record in records_from_json(rows[0][0])},
            _KEEPS.decode(rows[0][1]))


# STEP 1's question as an SQL expression over a backend id ``{backend}`` (``:b`` unless
# given) and a time ``{since}``
# (SAFETY.md rule 9). A backend lists every owner's VMs in its account, so the
# activity of every backend of the same provider and account counts; rows with a
# NULL backend (a new ref, or an owner whose ``backend_id`` names no backend row:
# the trigger logs those as NULL, migration 0007) may concern any backend. Both
# branches read the (backend_id, at) index. A retired coverage of the account (SAFETY.md
# rule 24) counts with its own id and that of the backend its owners name.
ACTIVITY_EXISTS = (
    "(EXISTS (SELECT 1 FROM ledger_activity WHERE at > {since} AND backend_id = ANY(ARRAY("
    "    SELECT unnest(ARRAY[s.origin, s.id]) FROM coverages() me JOIN coverages() s"
    " ON " + SCOPE_SQL.format(t="s") + " = " + SCOPE_SQL.format(t="me") + " WHERE me.id = {backend})))"
    " OR EXISTS (SELECT 1 FROM ledger_activity WHERE backend_id IS NULL AND at > {since}))")


def activity_since(conn: pg8000.native.Connection, backend_id: str, since: datetime) -> bool:
    """STEP 1: any ledger change that may concern ``backend_id`` after ``since``. One indexed query."""
    rows = conn.run("SELECT " + ACTIVITY_EXISTS.format(since=":t", backend=":b"), b=backend_id, t=since)
    return bool(rows[0][0])

# The tick (docs/DEPLOY.md): enrollment, STEP 1's facts and due selection for every backend
# in one statement. Rows the CTE inserts are not visible to the SELECT (one snapshot):
# a backend enrolled by this very statement reads as never cleaned.
#
# Most backends are not due at a given tick (an interval of an hour, a tick a minute).
# A backend holding no lease whose ``next_due_at`` is later than the clock plus
# ``:horizon`` seconds is not due whatever its limits (``classify.not_due``: the
# tolerance is at most ``TICK_HORIZON_SECONDS``, none during a backoff); such a row
# carries its backend's columns only (facts NULL). Every other row (a lease, no cleanup
# row, a NULL ``next_due_at``, due within the horizon) carries STEP 1's facts, and
# Python decides. A NULL ``:horizon`` (a caller on a clock of its own) sends the facts
# of every row. The facts left out are most of the document (bench/tick.py: 0.7 MB
# instead of 2 MB at 10,000 backends).
#
# STEP 1's activity (``ACTIVITY_EXISTS``: any row after the clean of a backend of the
# same account, or of no known backend) as the latest such row, so it scales with the
# number of backends (bench/tick.py: 10,000): the newest activity of each backend is one
# backward probe of the (backend_id, at) index, folded per account (``scope``: every
# backend of the account, due or not), compared with each backend's clean. ``EXISTS
# (at > since)`` is ``max(at) > since``; a NULL (no row) is no activity. The per-backend
# ``ACTIVITY_EXISTS`` form ran the account self-join for every backend: quadratic, more
# than 10 s at 10,000 backends. (Probing only the accounts of rows within the horizon
# saved nothing measurable: with due times spread over the hour, nearly every account
# has one.)
#
# The document: ``[clock, [[backend columns, facts or null], ...]]``, in backend id
# order, the clock read once for the statement (SAFETY.md rule 13); a second column
# holds each enrolled backend's staleness (``{id: seconds since its last clean cycle}``).
TICK_HORIZON_SECONDS = 60  # the largest tolerance classify.due_tolerance gives (tests/integration/test_tick_horizon.py)

TICK_SQL = (
    "WITH enrolled AS (INSERT INTO cleanup (backend_id) SELECT b.id FROM coverages() b"
    "  WHERE EXISTS (SELECT 1 FROM provider_refs)"
    "  AND NOT EXISTS (SELECT 1 FROM cleanup k WHERE k.backend_id = b.id)"  # an anti-join: no conflict per row
    "  ON CONFLICT DO NOTHING RETURNING backend_id),"
    " scoped AS (SELECT s.id, " + SCOPE_SQL.format(t="s") + " AS scope,"
    "  CASE WHEN s.retired_from IS NULL"
    "   THEN (SELECT max(a.at) FROM ledger_activity a WHERE a.backend_id = s.id)"
    # a retired coverage: the activity of owners naming its backend, and its own (a keep's end)
    "   ELSE greatest((SELECT max(a.at) FROM ledger_activity a WHERE a.backend_id = s.origin),"
    "                 (SELECT max(a.at) FROM ledger_activity a WHERE a.backend_id = s.id)) END AS last_at"
    "  FROM coverages() s),"
    " by_scope AS (SELECT scope, max(last_at) AS last_at FROM scoped GROUP BY scope),"
    " unknown AS (SELECT max(at) AS last_at FROM ledger_activity WHERE backend_id IS NULL),"
    " clk AS (SELECT oc_clock() AS now)"  # once per statement: one clock reading for every backend
    " SELECT json_build_array((SELECT now FROM clk), coalesce(json_agg(json_build_array(json_build_array("
    + ", ".join(f"b.{c.strip()}" for c in COVERAGE_COLUMNS.split(",")) + "),"
    "  CASE WHEN NOT coalesce(c.lease_owner IS NULL"
    "   AND c.next_due_at > clk.now + make_interval(secs => CAST(:horizon AS integer)), false)"
    "  THEN json_build_array(c.backend_id IS NOT NULL OR e.backend_id IS NOT NULL, c.clean_at, c.clean_mode,"
    "   c.lease_owner IS NOT NULL, c.lease_expires_at, coalesce(c.retry_delay_seconds, 0), c.next_due_at,"
    "   c.clean_at IS NOT NULL AND coalesce(bs.last_at > c.clean_at OR u.last_at > c.clean_at, false)) END)"
    " ORDER BY b.id), '[]'))::text,"
    # A second column, for the tick's StalestBackendSeconds: each enrolled backend's seconds
    # since its last clean cycle (since enrolment without one), ``{id: seconds}``.
    # (A time plain SQL set to an infinity gives no staleness: no row in the map.)
    " (SELECT coalesce(json_object_agg(k.backend_id, CAST(greatest(0, extract(epoch FROM"
    "   kc.now - coalesce(k.clean_at, k.created_at))) AS bigint)), '{}')::text FROM cleanup k CROSS JOIN clk kc"
    "   WHERE isfinite(coalesce(k.clean_at, k.created_at)))"
    " FROM coverages() b LEFT JOIN cleanup c ON c.backend_id = b.id"
    " LEFT JOIN enrolled e ON e.backend_id = b.id"
    # LEFT: a backend whose scope is NULL (no account) keeps its row, with no account activity (as before)
    " LEFT JOIN scoped sc ON sc.id = b.id LEFT JOIN by_scope bs ON bs.scope = sc.scope"
    " CROSS JOIN unknown u CROSS JOIN clk")

# STEP 1's facts of one row of TICK_SQL's document, typed as the columns they come from:
# enrolled, clean_at, clean_mode, leased, lease_expires_at, retry delay, next_due_at, activity.
TickFacts = tuple[bool, datetime | None, str | None, bool, datetime | None, int, datetime | None, bool]
# A row: the backend's columns, undecoded (``backend_from_row`` reads them; their bytes
# are the key under which the tick keeps the backend it validated), and its facts.
TickDocRow = tuple[msgspec.Raw, TickFacts | None]
_TICK_DOC = msgspec.json.Decoder(tuple[datetime, list[TickDocRow]])
_TICK_DOC_TEXT = msgspec.json.Decoder(tuple[Any, list[tuple[msgspec.Raw, list[Any] | None]]])


def _timestamp(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    return value


def tick_rows_from_json(doc: str | bytes) -> tuple[datetime, list[tuple[msgspec.Raw, list[Any] | None]]]:
    """TICK_SQL's document: the statement's clock and, per backend in id order, its
    columns (undecoded JSON) and STEP 1's facts (None: due later than the horizon).
    One document, not a row per backend: pg8000 decoding four timestamps per backend in
    Python was most of the statement's time at 10,000 backends (bench/tick.py). A
    timestamp msgspec cannot read (``infinity``, written by plain SQL) stays the text
    pg8000 handed back for it."""
    try:
        now, rows = _TICK_DOC.decode(doc)
        return now, [(raw, None if facts is None else list(facts)) for raw, facts in rows]
    except msgspec.MsgspecError:
        now, text_rows = _TICK_DOC_TEXT.decode(doc)
        for _, facts in text_rows:
            if facts is not None:
                for i in (1, 4, 6):
                    facts[i] = _timestamp(facts[i])
        return _timestamp(now), text_rows
