"""Ledger reads: backends, the STEP 3 join, the STEP 1 activity query."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec
import pg8000.native
from pydantic import TypeAdapter, ValidationError

from orphan_cleanup.backend_rules import describe_validation
from orphan_cleanup.errors import ConfigError
from orphan_cleanup.models import Backend, LedgerRecord, ResourceGroup, is_valid_ref

BACKEND_COLUMNS = "id, provider, account, regions, settings, mode"


def backend_from_row(row: list) -> Backend:
    """A ``backends`` row as a ``Backend``. A row the model refuses (plain SQL can write
    anything) is a one-line ``ConfigError`` naming the backend and the field: only that
    backend's work fails."""
    settings = row[4] if isinstance(row[4], dict) else json.loads(row[4] or "{}")
    try:
        return Backend.model_validate({"id": row[0], "provider": row[1], "account": row[2],
                                       "regions": row[3] or (), "settings": settings, "mode": row[5]})
    except ValidationError as e:
        raise ConfigError(f"backend {row[0]!r} is misconfigured: {describe_validation(e)}"
                          f" (fix it with `orphan-cleanup backend update {row[0]}`)") from e


def get_backend(conn: pg8000.native.Connection, backend_id: str) -> Backend:
    rows = conn.run(f"SELECT {BACKEND_COLUMNS} FROM backends WHERE id = :i", i=backend_id)
    if not rows:
        raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
    return backend_from_row(rows[0])


def list_backends(conn: pg8000.native.Connection) -> list[Backend]:
    return [backend_from_row(r) for r in conn.run(f"SELECT {BACKEND_COLUMNS} FROM backends ORDER BY id")]


# ``provider:account`` of a backends row ``{t}``, as ``Backend.scope`` computes it:
# a GCP backend lists ``settings.project`` when set, else its account.
SCOPE_SQL = ("{t}.provider || ':' || CASE WHEN {t}.provider = 'gcp'"
             " THEN coalesce(nullif({t}.settings->>'project', ''), {t}.account) ELSE {t}.account END")

# STEP 3 in one statement: every ref of the batch with its owner, including
# soft-deleted owners and refs whose owner row is gone (LEFT JOIN), with the
# account of the backend each owner names (DESIGN §5 rule 10). For refs
# with leftover groups, the resource ids earlier cycles saw in orphan groups; for
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
JOIN_SQL = """
SELECT coalesce(json_agg(json_build_object(
           'provider_ref', r.provider_ref, 'owner_type', r.owner_type, 'owner_id', r.owner_id,
           'owner_name', r.owner_name, 'issued_at', r.issued_at, 'instance_found', i.id IS NOT NULL,
           'status', i.status, 'backend_id', i.backend_id, 'primary_id', i.primary_id, 'region', i.region,
           'created_at', i.created_at, 'provisioned_at', i.provisioned_at,
           'terminated_at', i.terminated_at, 'deleted_at', i.deleted_at,
           'owner_backend_scope', {scope},
           'known_orphan_resource_ids',
           CASE WHEN r.provider_ref = ANY(string_to_array(:leftover, ',')) THEN
               (SELECT coalesce(json_agg(o.resource_id), '[]') FROM orphan_resources o
                 WHERE o.backend_id = :backend AND o.provider_ref = r.provider_ref)
           ELSE '[]' END,
           'protected_primaries',
           (SELECT coalesce(json_object_agg(o.primary_id, o.reason), '{}') FROM orphans o
             WHERE o.backend_id = :backend AND o.provider_ref = r.provider_ref AND o.state = 'protected'
               AND o.reason = 'termination_protection' AND o.primary_id IS NOT NULL))), '[]')::text
  FROM provider_refs r
  LEFT JOIN instances i
         ON i.provider_ref = r.provider_ref AND i.provider_ref = ANY(string_to_array(:refs, ','))
  LEFT JOIN backends ob ON ob.id = i.backend_id
 WHERE r.provider_ref = ANY(string_to_array(:refs, ','))
""".replace("{scope}", SCOPE_SQL.format(t="ob"))

_RECORDS = TypeAdapter(list[LedgerRecord])


class _RecordRow(msgspec.Struct, forbid_unknown_fields=True):
    """One element of JOIN_SQL's document, typed as ``LedgerRecord`` declares its fields
    (in its order; every key required, none other allowed, as the frozen model forbids extras)."""

    provider_ref: str
    owner_type: str
    owner_id: str | None
    owner_name: str | None
    issued_at: datetime | None
    instance_found: bool
    status: str | None
    backend_id: str | None
    primary_id: str | None
    region: str | None
    created_at: datetime | None
    provisioned_at: datetime | None
    terminated_at: datetime | None
    deleted_at: datetime | None
    owner_backend_scope: str | None
    known_orphan_resource_ids: frozenset[str]
    protected_primaries: dict[str, str]


_RECORD_ROWS = msgspec.json.Decoder(list[_RecordRow])
_RECORD_FIELDS = tuple(LedgerRecord.model_fields)
assert _RECORD_FIELDS == _RecordRow.__struct_fields__, "_RecordRow must mirror LedgerRecord"
_new, _set, _asdict = object.__new__, object.__setattr__, msgspec.structs.asdict


def records_from_json(doc: str | bytes) -> list[LedgerRecord]:
    """JOIN_SQL's document as ``LedgerRecord``s, equal (values, types, fields set) to
    ``TypeAdapter(list[LedgerRecord]).validate_json(doc)`` (tests/unit/test_record_decode.py,
    and bench/floors.py checks it on every measured batch).

    msgspec parses and type-checks the document in C (timestamps included) against
    ``_RecordRow``, which declares each field with the type pydantic would produce for it
    from JSON (a status stays a ``str``, as pydantic's smart union keeps a JSON string);
    the models are then built as ``model_construct`` builds them, without a pydantic
    validation per row. Anything msgspec refuses (a null where a string is due, a
    timestamp it cannot read, a missing or unknown key) goes to pydantic, which decides as
    before: the same records or the same error."""
    try:
        rows = _RECORD_ROWS.decode(doc)
    except msgspec.MsgspecError:
        return _RECORDS.validate_json(doc)
    fields = frozenset(_RECORD_FIELDS)
    out = []
    for row in rows:
        record = _new(LedgerRecord)
        _set(record, "__dict__", _asdict(row))  # the model's fields, in its order
        _set(record, "__pydantic_fields_set__", set(fields))
        _set(record, "__pydantic_extra__", None)
        _set(record, "__pydantic_private__", None)
        out.append(record)
    return out


def load_records(conn: pg8000.native.Connection, backend_id: str,
                 groups: Iterable[ResourceGroup]) -> dict[str, LedgerRecord]:
    """STEP 3: the ledger records of the groups' refs, keyed by ref, in one statement."""
    refs: set[str] = set()
    leftover: set[str] = set()
    for g in groups:
        refs.add(g.provider_ref)
        if g.primary_id is None:
            leftover.add(g.provider_ref)
    if not refs:
        return {}
    # A value that is not a valid ref cannot be in provider_refs (CHECK constraint):
    # leaving it out changes no answer and keeps the comma-joined list unambiguous.
    rows = conn.run(JOIN_SQL, refs=",".join(sorted(r for r in refs if is_valid_ref(r))),
                    leftover=",".join(sorted(r for r in leftover if is_valid_ref(r))), backend=backend_id)
    return {record.provider_ref: record for record in records_from_json(rows[0][0])}


# STEP 1's question as an SQL expression over a backend id ``{backend}`` (``:b`` unless
# given) and a time ``{since}``
# (DESIGN §5 rule 9). A backend lists every owner's VMs in its account, so the
# activity of every backend of the same provider and account counts; rows with a
# NULL backend (a new ref, or an owner whose ``backend_id`` names no backend row:
# the trigger logs those as NULL, migration 0007) may concern any backend. Both
# branches read the (backend_id, at) index.
ACTIVITY_EXISTS = (
    "(EXISTS (SELECT 1 FROM ledger_activity WHERE at > {since} AND backend_id = ANY(ARRAY("
    "    SELECT s.id FROM backends me JOIN backends s ON " + SCOPE_SQL.format(t="s") + " = "
    + SCOPE_SQL.format(t="me") + " WHERE me.id = {backend})))"
    " OR EXISTS (SELECT 1 FROM ledger_activity WHERE backend_id IS NULL AND at > {since}))")


def activity_since(conn: pg8000.native.Connection, backend_id: str, since: datetime) -> bool:
    """STEP 1: any ledger change that may concern ``backend_id`` after ``since``. One indexed query."""
    rows = conn.run("SELECT " + ACTIVITY_EXISTS.format(since=":t", backend=":b"), b=backend_id, t=since)
    return bool(rows[0][0])


# The tick (DESIGN C5): enrollment, STEP 1's facts and due selection for every backend
# in one statement. Rows the CTE inserts are not visible to the SELECT (one snapshot):
# a backend enrolled by this very statement reads as never cleaned.
#
# STEP 1's activity (``ACTIVITY_EXISTS``: any row after the clean of a backend of the
# same account, or of no known backend) as the latest such row, so it scales with the
# number of backends (bench/tick.py: 10,000): the newest activity of each backend is one
# backward probe of the (backend_id, at) index, folded per account (``scope``), compared
# with each backend's clean. ``EXISTS (at > since)`` is ``max(at) > since``; a NULL
# (no row) is no activity. The per-backend ``ACTIVITY_EXISTS`` form ran the account
# self-join for every backend: quadratic, more than 10 s at 10,000 backends.
TICK_SQL = (
    "WITH enrolled AS (INSERT INTO cleanup (backend_id) SELECT b.id FROM backends b"
    "  WHERE EXISTS (SELECT 1 FROM provider_refs)"
    "  AND NOT EXISTS (SELECT 1 FROM cleanup k WHERE k.backend_id = b.id)"  # an anti-join: no conflict per row
    "  ON CONFLICT DO NOTHING RETURNING backend_id),"
    " scoped AS (SELECT s.id, " + SCOPE_SQL.format(t="s") + " AS scope,"
    "  (SELECT max(a.at) FROM ledger_activity a WHERE a.backend_id = s.id) AS last_at FROM backends s),"
    " by_scope AS (SELECT scope, max(last_at) AS last_at FROM scoped GROUP BY scope),"
    " unknown AS (SELECT max(at) AS last_at FROM ledger_activity WHERE backend_id IS NULL),"
    " clk AS (SELECT oc_clock() AS now)"  # once per statement: one clock reading for every backend
    " SELECT coalesce(json_agg(json_build_array("
    + ", ".join(f"b.{c.strip()}" for c in BACKEND_COLUMNS.split(",")) + ","
    " c.backend_id IS NOT NULL OR e.backend_id IS NOT NULL, c.clean_at, c.clean_mode,"
    " c.lease_owner IS NOT NULL, c.lease_expires_at, coalesce(c.retry_delay_seconds, 0), c.next_due_at,"
    " c.clean_at IS NOT NULL AND coalesce(bs.last_at > c.clean_at OR u.last_at > c.clean_at, false), clk.now)"
    " ORDER BY b.id), '[]')::text"
    " FROM backends b LEFT JOIN cleanup c ON c.backend_id = b.id"
    " LEFT JOIN enrolled e ON e.backend_id = b.id"
    # LEFT: a backend whose scope is NULL (no account) keeps its row, with no account activity (as before)
    " LEFT JOIN scoped sc ON sc.id = b.id LEFT JOIN by_scope bs ON bs.scope = sc.scope"
    " CROSS JOIN unknown u CROSS JOIN clk")

# One element of TICK_SQL's document: the backend's columns (validated by
# ``backend_from_row``), then STEP 1's facts, typed as the columns they come from.
TickRowTuple = tuple[Any, Any, Any, Any, Any, Any, bool, datetime | None, str | None, bool, datetime | None, int,
                     datetime | None, bool, datetime]
_TICK_ROWS = msgspec.json.Decoder(list[TickRowTuple])


def tick_rows_from_json(doc: str | bytes) -> list[list[Any]]:
    """TICK_SQL's document as rows, in the layout ``conn.run`` gave when the statement
    returned one row per backend (one JSON document: pg8000 decoding four timestamps per
    backend in Python was most of the statement's time at 10,000 backends, bench/tick.py).
    A timestamp msgspec cannot read (``infinity``, written by plain SQL) stays the text
    pg8000 handed back for it."""
    try:
        return [list(row) for row in _TICK_ROWS.decode(doc)]
    except msgspec.MsgspecError:
        rows = json.loads(doc)
        for row in rows:
            for i in (7, 10, 12, 14):
                if isinstance(row[i], str):
                    try:
                        row[i] = datetime.fromisoformat(row[i])
                    except ValueError:
                        pass
        return rows
