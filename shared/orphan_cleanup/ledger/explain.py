"""The read behind ``orphan-cleanup explain``: the latest cycles of a backend that
recorded a ref (or a group holding a resource id), each with the group as
recorded, its verdict and evidence, and the delete request's end.

Read-only: one ``READ ONLY`` transaction (a snapshot), never any DDL. A database
that lacks the tables or the ``evidence`` column (not migrated, or not up to
0008) is ``SchemaNotMigrated``, never a migration (the CLI checks the schema
version first: ``migrate.require_current_schema``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pg8000.native
from pg8000.exceptions import DatabaseError as PgDatabaseError

from orphan_cleanup.core.errors import ConfigError, DatabaseError, SchemaNotMigrated
from orphan_cleanup.core.listing import ResourceGroup, is_valid_ref
from orphan_cleanup.ledger.db import Database, describe, sqlstate
from orphan_cleanup.ledger.queries import SCOPE_SQL

#: undefined_table, undefined_column, undefined_function: the schema predates what explain reads.
_NOT_MIGRATED = frozenset({"42P01", "42703", "42883"})


@dataclass(frozen=True)
class DeleteRow:
    """A cycle's ``delete_requests`` row for one group: its state and recorded end
    (``result``: {result: DeleteResult | None, error, skipped}; None while queued)."""

    state: str
    attempts: int
    result: dict[str, Any] | None
    updated_at: datetime | None


@dataclass(frozen=True)
class ExplainedGroup:
    """One recorded group of one cycle, as the cycle recorded it."""

    cycle_id: str
    listed_at: datetime
    mode: str
    manual: bool
    outcome: str | None
    blocked_reason: str | None
    group: ResourceGroup
    verdict: str
    reason: str
    action: str
    error: str | None
    evidence: dict[str, Any] | None
    delete: DeleteRow | None


# The latest ``:n`` cycles of the backend holding a matching group, then every matching
# group of those cycles with its delete request. {match} is a condition on ``g``.
_SQL = """
WITH hit AS (
    SELECT g.cycle_id, g.group_key FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id
     WHERE c.backend_id = :b AND ({match})),
recent AS (
    SELECT c.id, c.started_at FROM cycles c WHERE c.id IN (SELECT cycle_id FROM hit)
     ORDER BY c.started_at DESC, c.id DESC LIMIT :n)
SELECT c.id, c.listed_at, c.mode, c.manual, c.outcome, c.blocked_reason,
       g.provider_ref, g.region, g.primary_id, g.resources::text, g.verdict, g.reason, g.action, g.error,
       g.evidence::text, d.state, d.attempts, d.result::text, d.updated_at
  FROM recent r
  JOIN cycles c ON c.id = r.id
  JOIN hit h ON h.cycle_id = c.id
  JOIN cycle_groups g ON g.cycle_id = h.cycle_id AND g.group_key = h.group_key
  LEFT JOIN delete_requests d ON d.cycle_id = g.cycle_id AND d.group_key = g.group_key
 ORDER BY r.started_at DESC, c.id DESC, g.group_key
"""
_BY_REF = "g.provider_ref = :q"
_BY_RESOURCE = "g.primary_id = :q OR g.resources @> CAST(:j AS jsonb)"


def explained_groups(db: Database, backend_id: str, query: str, *, cycles: int = 5) -> list[ExplainedGroup]:
    """The groups matching ``query`` in the latest ``cycles`` cycles of ``backend_id``
    that recorded one, newest cycle first. A ref-shaped query is looked up as a ref
    first (an index), then as a resource id (a 12-digit GCP id is ref-shaped too).
    ``ConfigError`` for a backend with neither a row nor a recorded cycle;
    ``SchemaNotMigrated`` for an old schema."""
    try:
        with db.connection() as conn:  # closed at the end: the read-only transaction goes with it
            conn.run("START TRANSACTION READ ONLY")
            return _read(conn, backend_id, query, cycles)
    except PgDatabaseError as e:
        if sqlstate(e) in _NOT_MIGRATED:
            raise SchemaNotMigrated() from e
        raise DatabaseError(describe(e)) from e


def _read(conn: pg8000.native.Connection, backend_id: str, query: str, cycles: int) -> list[ExplainedGroup]:
    # A removed backend's cycles stay for audit (migration 0009): they are explained too.
    if not conn.run("SELECT 1 WHERE EXISTS (SELECT 1 FROM coverages() WHERE id = :b)"
                    " OR EXISTS (SELECT 1 FROM cycles WHERE backend_id = :b)", b=backend_id):
        raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
    found: list[list[Any]] = []
    if is_valid_ref(query):
        found = conn.run(_SQL.format(match=_BY_REF), b=backend_id, q=query, n=cycles)
    if not found:
        found = conn.run(_SQL.format(match=_BY_RESOURCE), b=backend_id, q=query, n=cycles,
                         j=json.dumps([{"id": query}]))
    return [_row(r) for r in found]


def _row(r: list[Any]) -> ExplainedGroup:
    (cycle_id, listed_at, mode, manual, outcome, blocked, ref, region, primary_id, resources, verdict, reason,
     action, error, evidence, state, attempts, result, updated_at) = r
    group = ResourceGroup.model_validate({"provider_ref": ref, "region": region, "primary_id": primary_id,
                                          "resources": json.loads(resources), "malformed_ref": not is_valid_ref(ref)})
    delete = None if state is None else DeleteRow(state=state, attempts=attempts,
                                                  result=json.loads(result) if result else None,
                                                  updated_at=updated_at)
    return ExplainedGroup(cycle_id=cycle_id, listed_at=listed_at, mode=mode, manual=bool(manual), outcome=outcome,
                          blocked_reason=blocked, group=group, verdict=verdict, reason=reason, action=action,
                          error=error, evidence=json.loads(evidence) if evidence else None, delete=delete)


@dataclass(frozen=True)
class JournalEntry:
    """One ``provider_journal`` row (SAFETY.md rule 19): a mutating call's intent or result."""

    at: datetime
    cycle_id: str | None
    phase: str
    call: str
    target: str
    region: str | None
    blast: tuple[str, ...]
    outcome: str | None
    error: str | None


_JOURNAL_SQL = ("SELECT at, cycle_id, phase, call, target, region, blast::text, outcome, error FROM provider_journal"
                " WHERE backend_id = :b AND (provider_ref = ANY(CAST(:refs AS text[])) OR target = :q)"
                " ORDER BY at, id LIMIT 500")


def journal_entries(db: Database, backend_id: str, query: str, refs: Sequence[str]) -> list[JournalEntry]:
    """The backend's journaled provider calls on ``refs`` (the explained groups' refs) or
    on the resource ``query``, oldest first: every deletion on record, whether its cycle
    held its lease to the end or not. Read-only; an old schema is ``SchemaNotMigrated``."""
    try:
        with db.connection() as conn:
            conn.run("START TRANSACTION READ ONLY")
            rows = conn.run(_JOURNAL_SQL, b=backend_id, refs=list(refs), q=query)
    except PgDatabaseError as e:
        if sqlstate(e) in _NOT_MIGRATED:
            raise SchemaNotMigrated() from e
        raise DatabaseError(describe(e)) from e
    return [JournalEntry(at=at, cycle_id=c, phase=p, call=call, target=t, region=r, blast=tuple(json.loads(b)),
                         outcome=o, error=e) for at, c, p, call, t, r, b, o, e in rows]


def keep_of(db: Database, backend_id: str, refs: Sequence[str]) -> dict[str, Any] | None:
    """The operator's keep of the first of ``refs`` that the backend keeps (SAFETY.md rule 23):
    ``{"provider_ref", "reason", "kept_at", "until"}`` (ISO; ``until`` None: until released, or
    a time already past: the keep has ended and no longer holds), else None. Read-only."""
    if not refs:
        return None
    try:
        with db.connection() as conn:
            conn.run("START TRANSACTION READ ONLY")
            # its own keeps and those of the backends of its account (a keep holds account-wide)
            rows = conn.run("SELECT k.provider_ref, k.reason, k.kept_at, k.until,"
                            " k.until IS NOT NULL AND k.until <= oc_clock()"
                            " FROM orphan_keeps k LEFT JOIN coverages() kb ON kb.id = :b"
                            " WHERE k.provider_ref = ANY(CAST(:r AS text[]))"
                            f" AND (k.backend_id = :b OR k.scope = {SCOPE_SQL.format(t='kb')})"
                            " ORDER BY array_position(CAST(:r AS text[]), k.provider_ref),"
                            " k.until DESC NULLS FIRST LIMIT 1",
                            b=backend_id, r=list(refs))
    except PgDatabaseError as e:
        if sqlstate(e) in _NOT_MIGRATED:
            raise SchemaNotMigrated() from e
        raise DatabaseError(describe(e)) from e
    if not rows:
        return None
    ref, reason, kept_at, until, ended = rows[0]
    return {"provider_ref": ref, "reason": reason, "kept_at": kept_at.isoformat(),
            "until": until.isoformat() if until else None, "ended": bool(ended)}
