"""Ledger reads: backends, the STEP 3 join, the STEP 1 activity query."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

import pg8000.native

from orphan_cleanup.errors import ConfigError
from orphan_cleanup.models import Backend, BackendSettings, LedgerRecord, ResourceGroup

BACKEND_COLUMNS = "id, provider, account, regions, settings, mode"


def backend_from_row(row: list) -> Backend:
    settings = row[4] if isinstance(row[4], dict) else json.loads(row[4] or "{}")
    return Backend(id=row[0], provider=row[1], account=row[2], regions=row[3] or (),
                   settings=BackendSettings.model_validate(settings), mode=row[5])


def get_backend(conn: pg8000.native.Connection, backend_id: str) -> Backend:
    rows = conn.run(f"SELECT {BACKEND_COLUMNS} FROM backends WHERE id = :i", i=backend_id)
    if not rows:
        raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
    return backend_from_row(rows[0])


def list_backends(conn: pg8000.native.Connection) -> list[Backend]:
    return [backend_from_row(r) for r in conn.run(f"SELECT {BACKEND_COLUMNS} FROM backends ORDER BY id")]


# STEP 3 in one statement: every ref of the batch with its owner, including
# soft-deleted owners and refs whose owner row is gone (LEFT JOIN). For refs
# with leftover groups, the resource ids earlier cycles saw in orphan groups.
JOIN_SQL = """
SELECT r.provider_ref, r.owner_type, r.owner_id, r.owner_name, r.issued_at,
       i.id IS NOT NULL, i.status, i.backend_id, i.primary_id, i.region,
       i.created_at, i.provisioned_at, i.terminated_at, i.deleted_at,
       CASE WHEN r.provider_ref = ANY(CAST(:leftover AS text[])) THEN
           (SELECT array_agg(o.resource_id) FROM orphan_resources o
             WHERE o.backend_id = :backend AND o.provider_ref = r.provider_ref)
       END
  FROM provider_refs r
  LEFT JOIN instances i ON i.provider_ref = r.provider_ref
 WHERE r.provider_ref = ANY(CAST(:refs AS text[]))
"""


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
    rows = conn.run(JOIN_SQL, refs=sorted(refs), leftover=sorted(leftover), backend=backend_id)
    return {row[0]: record_from_row(row) for row in rows}


def record_from_row(row: list) -> LedgerRecord:
    return LedgerRecord(
        provider_ref=row[0], owner_type=row[1], owner_id=row[2], owner_name=row[3], issued_at=row[4],
        instance_found=bool(row[5]), status=row[6], backend_id=row[7], primary_id=row[8], region=row[9],
        created_at=row[10], provisioned_at=row[11], terminated_at=row[12], deleted_at=row[13],
        known_orphan_resource_ids=frozenset(row[14] or ()),
    )


def activity_since(conn: pg8000.native.Connection, backend_id: str, since: datetime) -> bool:
    """STEP 1: any ledger change that may concern ``backend_id`` after ``since``
    (rows with a NULL backend concern every backend). One indexed query."""
    rows = conn.run(
        "SELECT EXISTS (SELECT 1 FROM ledger_activity WHERE backend_id = :b AND at > :t)"
        " OR EXISTS (SELECT 1 FROM ledger_activity WHERE backend_id IS NULL AND at > :t)",
        b=backend_id, t=since,
    )
    return bool(rows[0][0])
