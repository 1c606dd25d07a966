"""The operator's keeps (``orphans keep``, ``orphans release``; SAFETY.md rule 23): the
``orphan_keeps`` row of a backend and ref (it keeps the ref in every backend of that backend's
account), and in the same transaction its ``events`` row.
Only the operator's CLI writes them; every function reads them (STEP 3's join, the deleter's
re-check: ``queries.LEDGER_SQL``, ``LockedCycle.delete_request``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import pg8000.native

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.ledger.queries import SCOPE_SQL

# Each event names the owner as provider_refs keeps it (a ref no ledger row has: none).
_OWNER = " FROM (SELECT 1) AS one LEFT JOIN provider_refs p ON p.provider_ref = :r"


@dataclass(frozen=True)
class KeepRow:
    """A keep as written or released: its reason, when it was written, its end (None:
    until released) and, when written, the end of a delete of the ref in flight right now
    (a live delete gate of the backend's account), else None."""

    backend_id: str
    provider_ref: str
    reason: str | None
    kept_at: datetime
    until: datetime | None
    delete_in_flight_until: datetime | None = None


def keep(conn: pg8000.native.Connection, backend_id: str, ref: str, reason: str | None,
         seconds: int | None) -> KeepRow:
    """Keep ``ref`` of ``backend_id`` for ``seconds`` from now (the database's clock; None:
    until released), replacing an earlier keep of it. ``ConfigError`` for an unknown backend
    or a ref that no cycle of the backend recorded (nothing written)."""
    _known(conn, backend_id)
    [[recorded, in_flight]] = conn.run(
        "SELECT EXISTS (SELECT 1 FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id"
        "   WHERE g.provider_ref = :r AND c.backend_id = :b)"
        " OR EXISTS (SELECT 1 FROM orphans o WHERE o.backend_id = :b AND o.provider_ref = :r),"
        " (SELECT max(d.expires_at) FROM delete_gates d, coverages() b WHERE b.id = :b AND d.provider_ref = :r"
        f"   AND d.backend_id = {SCOPE_SQL.format(t='b')} AND d.expires_at > now())", b=backend_id, r=ref)
    if not recorded:
        raise ConfigError(f"no cycle of {backend_id} recorded ref {ref}: keep a ref that `orphan-cleanup orphans`"
                          f" or `explain --backend {backend_id} REF` shows")
    [[kept_at, until]] = conn.run(
        "INSERT INTO orphan_keeps AS k (scope, backend_id, provider_ref, reason, kept_at, until)"
        f" SELECT {SCOPE_SQL.format(t='b')}, :b, :r, :why, oc_clock(),"
        " oc_clock() + make_interval(secs => CAST(:s AS integer)) FROM coverages() b WHERE b.id = :b"
        " ON CONFLICT (backend_id, provider_ref) DO UPDATE SET scope = excluded.scope, reason = excluded.reason,"
        " kept_at = excluded.kept_at, until = excluded.until RETURNING kept_at, until",
        b=backend_id, r=ref, why=reason, s=seconds)
    conn.run("INSERT INTO events (backend_id, kind, message, provider_ref, owner_type, owner_id, owner_name, details)"
             " SELECT :b, 'orphan_kept', :m, :r, p.owner_type, p.owner_id, p.owner_name, CAST(:d AS jsonb)" + _OWNER,
             b=backend_id, r=ref, m=f"ref {ref} kept by the operator",
             d=json.dumps({"reason": reason, "until": until.isoformat() if until else None}))
    return KeepRow(backend_id, ref, reason, kept_at, until, in_flight)


def _known(conn: pg8000.native.Connection, backend_id: str) -> None:
    """``ConfigError`` unless ``backend_id`` is a backend or a retired coverage (SAFETY.md
    rule 24: an operator keeps what a coverage would delete as what a backend would)."""
    if not conn.run("SELECT 1 FROM coverages() WHERE id = :b", b=backend_id):
        raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")


def release(conn: pg8000.native.Connection, backend_id: str, ref: str) -> KeepRow:
    """End the keep of ``ref``: its groups are judged as any other from the next listing on.
    ``ConfigError`` for an unknown backend or a ref that is not kept (nothing written)."""
    _known(conn, backend_id)
    rows = conn.run("DELETE FROM orphan_keeps WHERE backend_id = :b AND provider_ref = :r"
                    " RETURNING reason, kept_at, until", b=backend_id, r=ref)
    if not rows:
        raise ConfigError(f"ref {ref} of {backend_id} is not kept: nothing to release")
    [[reason, kept_at, until]] = rows
    conn.run("INSERT INTO events (backend_id, kind, message, provider_ref, owner_type, owner_id, owner_name, details)"
             " SELECT :b, 'orphan_released', :m, :r, p.owner_type, p.owner_id, p.owner_name, CAST(:d AS jsonb)"
             + _OWNER,
             b=backend_id, r=ref, m=f"ref {ref} released by the operator",
             d=json.dumps({"reason": reason, "until": until.isoformat() if until else None}))
    return KeepRow(backend_id, ref, reason, kept_at, until)
