"""What operators watch: the open orphans across cycles (``orphans``), the ``events``
table (``events``), and how long each backend has gone without a clean cycle
(``status``; the tick's ``StalestBackendSeconds`` is ``queries.TICK_SQL``'s). Reads only; every age is by the
database clock (``oc_clock()``, SAFETY.md rule 13)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pg8000.native

from orphan_cleanup.ledger.queries import json_value

#: The orphans states of an orphan not deleted yet: what ``status`` counts as open.
OPEN_STATES = ("open", "deleting", "delete_failed")


@dataclass(frozen=True)
class OpenOrphan:
    """An ``orphans`` row still open, with what the listing recorded of its resources
    (``kind``, ``id``, ``details``: the size facts among them) and its last action (the
    ``cycle_groups.action`` of the last cycle that saw it; its state when that row is gone)."""

    backend: str
    provider_ref: str
    primary_id: str | None
    region: str
    resources: tuple[dict[str, Any], ...]
    reason: str
    state: str
    first_seen: datetime
    last_seen: datetime
    last_action: str
    open_seconds: float  # since first seen, by the database clock
    prices: Any  # the backend's ``settings.prices`` as stored (None: not set)


_OPEN_SQL = (
    "SELECT coalesce(json_agg(json_build_object('backend', o.backend_id, 'provider_ref', o.provider_ref,"
    " 'primary_id', o.primary_id, 'region', o.region, 'resources', o.resources, 'reason', o.reason,"
    " 'state', o.state, 'first_seen', o.first_seen, 'last_seen', o.last_seen,"
    " 'last_action', coalesce(g.action, o.state),"
    " 'open_seconds', extract(epoch FROM clk.now - o.first_seen), 'prices', b.settings->'prices')"
    " ORDER BY o.backend_id, o.first_seen, o.group_key), '[]')::text"
    " FROM orphans o JOIN coverages() b ON b.id = o.backend_id"
    " LEFT JOIN cycle_groups g ON g.cycle_id = o.last_cycle_id AND g.group_key = o.group_key"
    " CROSS JOIN (SELECT oc_clock() AS now) clk"
    " WHERE o.verdict = 'orphan' AND o.state IN ('open', 'deleting', 'delete_failed')")


def open_orphans(conn: pg8000.native.Connection, backend_id: str | None = None) -> list[OpenOrphan]:
    """Every backend's open orphans (or one's), by backend and first seen."""
    sql = _OPEN_SQL + (" AND o.backend_id = :b" if backend_id is not None else "")
    rows = json.loads(conn.run(sql, **({"b": backend_id} if backend_id is not None else {}))[0][0])
    return [OpenOrphan(backend=r["backend"], provider_ref=r["provider_ref"], primary_id=r["primary_id"],
                       region=r["region"], resources=tuple(json_value(r["resources"]) or ()), reason=r["reason"],
                       state=r["state"], first_seen=datetime.fromisoformat(r["first_seen"]),
                       last_seen=datetime.fromisoformat(r["last_seen"]), last_action=r["last_action"],
                       open_seconds=float(r["open_seconds"]), prices=r["prices"]) for r in rows]


@dataclass(frozen=True)
class Event:
    """An ``events`` row (README, "The events table")."""

    id: int
    backend: str
    cycle_id: str | None
    at: datetime
    kind: str
    message: str
    provider_ref: str | None
    owner_type: str | None
    owner_id: str | None
    owner_name: str | None
    details: dict[str, Any]


def events(conn: pg8000.native.Connection, since_seconds: int, backend_id: str | None = None) -> list[Event]:
    """The events of the last ``since_seconds`` (by the database clock), oldest first."""
    rows = conn.run(
        "SELECT id, backend_id, cycle_id, at, kind, message, provider_ref, owner_type, owner_id, owner_name,"
        " details FROM events WHERE at > oc_clock() - make_interval(secs => :s)"
        + (" AND backend_id = :b" if backend_id is not None else "") + " ORDER BY at, id",
        s=since_seconds, **({"b": backend_id} if backend_id is not None else {}))
    return [Event(id=int(r[0]), backend=r[1], cycle_id=r[2], at=r[3], kind=r[4], message=r[5], provider_ref=r[6],
                  owner_type=r[7], owner_id=r[8], owner_name=r[9], details=json_value(r[10]) or {}) for r in rows]


@dataclass(frozen=True)
class Staleness:
    """How long an enabled, enrolled backend has gone without a clean cycle: since its
    ``clean_at``, or since it was enrolled when it never had one."""

    backend: str
    clean_at: datetime | None
    stale_seconds: int


def staleness(conn: pg8000.native.Connection, global_mode: str) -> list[Staleness]:
    """Every enrolled backend whose effective mode (its own, else ``global_mode``) is not
    ``off``, the stalest first: those never clean (their cycles failed, were unsettled or
    never ran) before any that was clean once, each group by its seconds without a clean
    cycle (README, "When one fires")."""
    rows = conn.run(
        "SELECT b.id, c.clean_at, CAST(greatest(0, extract(epoch FROM oc_clock() - coalesce(c.clean_at,"
        " c.created_at))) AS bigint) FROM coverages() b JOIN cleanup c ON c.backend_id = b.id"
        " WHERE coalesce(b.mode, :g) <> 'off' AND isfinite(coalesce(c.clean_at, c.created_at))"
        " ORDER BY c.clean_at IS NOT NULL, 3 DESC, b.id", g=global_mode)
    return [Staleness(backend=r[0], clean_at=r[1], stale_seconds=int(r[2])) for r in rows]
