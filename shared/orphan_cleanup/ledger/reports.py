"""The store's operator reads and writes: backends (``backend add``), status rows,
the C3 cycle report, and the demo's staging of history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pg8000.native

from orphan_cleanup.errors import ConfigError
from orphan_cleanup.ledger.db import sqlstate
from orphan_cleanup.ledger.records import CycleReport, ReportGroup, ReportResource, StatusRow
from orphan_cleanup.models import RegionFailure


def add_backend(conn: pg8000.native.Connection, *, backend_id: str, provider: str, account: str, regions: Sequence[str],
                settings: dict[str, Any], mode: str | None) -> None:
    """Insert a ``backends`` row; an existing id is a ``ConfigError``."""
    from pg8000.exceptions import DatabaseError as PgError

    try:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " VALUES (:i, :p, :a, CAST(:r AS text[]), CAST(:s AS jsonb), :m)",
                 i=backend_id, p=provider, a=account, r=list(regions), s=json.dumps(settings), m=mode)
    except PgError as e:
        if sqlstate(e) == "23505":
            raise ConfigError(f"backend {backend_id!r} already exists") from e
        raise


def status_rows(conn: pg8000.native.Connection) -> list[StatusRow]:
    rows = conn.run(
        "SELECT b.id, b.provider, b.mode, c.clean_at, c.last_outcome, c.last_processed_at, c.next_due_at,"
        " (SELECT count(*) FROM orphans o WHERE o.backend_id = b.id AND o.verdict = 'orphan'"
        "   AND o.state IN ('open', 'deleting', 'delete_failed'))"
        " FROM backends b LEFT JOIN cleanup c ON c.backend_id = b.id ORDER BY b.id")
    return [StatusRow(backend=r[0], provider=r[1], mode=r[2], clean_at=r[3], last_outcome=r[4],
                      last_processed_at=r[5], next_due_at=r[6], open_orphans=int(r[7])) for r in rows]


# The report's groups as one JSON text built by Postgres, keeping only each
# resource's kind and id: decoding full rows of a 100k-group run cost ~400 MB.
_GROUPS_SQL = (
    "SELECT coalesce(json_agg(json_build_object('provider_ref', g.provider_ref, 'region', g.region,"
    " 'primary_id', g.primary_id, 'resources', (SELECT coalesce(json_agg(json_build_object("
    "  'kind', x->>'kind', 'id', x->>'id')), '[]') FROM jsonb_array_elements(g.resources) AS x),"
    " 'verdict', g.verdict, 'reason', g.reason, 'action', g.action)"
    " ORDER BY g.provider_ref, g.region, g.primary_id), '[]')::text"
    " FROM cycle_groups g WHERE g.cycle_id = :c")


def cycle_report(conn: pg8000.native.Connection, cycle_id: str) -> CycleReport:
    rows = conn.run("SELECT backend_id, mode, listed_at, outcome, failures, blocked_reason, error"
                    " FROM cycles WHERE id = :c", c=cycle_id)
    if not rows:
        raise ConfigError(f"unknown cycle {cycle_id!r}")
    backend_id, mode, listed_at, outcome, failures, blocked_reason, error = rows[0]
    groups = json.loads(conn.run(_GROUPS_SQL, c=cycle_id)[0][0])
    failures = failures if isinstance(failures, list) else json.loads(failures or "[]")
    return CycleReport(
        backend=backend_id, cycle_id=cycle_id, mode=mode, listed_at=listed_at, outcome=outcome or "unsettled",
        failures=tuple(RegionFailure(region=f["region"], error=f["error"]) for f in failures),
        groups=tuple(ReportGroup(provider_ref=g["provider_ref"], region=g["region"], primary_id=g["primary_id"],
                                 resources=tuple(ReportResource(kind=r["kind"], id=r["id"]) for r in g["resources"]),
                                 verdict=g["verdict"], reason=g["reason"], action=g["action"]) for g in groups),
        blocked_reason=blocked_reason, error=error)


def backdate_owner(conn: pg8000.native.Connection, owner_id: str, seconds: int, *,
                   provisioned_only: bool = False) -> None:
    """Move an owner's recorded events ``seconds`` into the past: how the demo
    stages a history that happened more than the margin before its listing."""
    shift = "CAST(:d AS interval)"
    if provisioned_only:
        conn.run(f"UPDATE instances SET provisioned_at = provisioned_at - {shift} WHERE id = :i",
                 d=f"{seconds} seconds", i=owner_id)
        return
    conn.run(f"UPDATE instances SET created_at = created_at - {shift},"
             f" provisioned_at = provisioned_at - {shift}, terminated_at = terminated_at - {shift},"
             f" deleted_at = deleted_at - {shift} WHERE id = :i", d=f"{seconds} seconds", i=owner_id)
    conn.run(f"UPDATE provider_refs SET issued_at = issued_at - {shift} WHERE owner_id = :i",
             d=f"{seconds} seconds", i=owner_id)
