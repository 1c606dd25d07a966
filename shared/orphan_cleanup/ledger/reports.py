"""The store's operator reads and writes: backends (``backend add|list|show|update|remove``),
status rows, the C3 cycle report, and the demo's staging of history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pg8000.native

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import BackendBusy, ConfigError
from orphan_cleanup.core.listing import RegionFailure, ResourceGroup
from orphan_cleanup.ledger.db import sqlstate
from orphan_cleanup.ledger.locked import CYCLE_FAILED_EVENT, NO_REASON, group_from_row
from orphan_cleanup.ledger.queries import BACKEND_COLUMNS, backend_from_row, json_value
from orphan_cleanup.ledger.records import CycleReport, ReportGroup, ReportResource, StatusRow


@dataclass(frozen=True)
class BackendRow:
    """A ``backends`` row as stored (``settings`` raw, the platform's own keys included),
    with its parsed ``Backend``, or why the model refuses it (``error``)."""

    id: str
    provider: str
    account: str
    regions: tuple[str, ...]
    settings: dict[str, Any]
    mode: str | None
    backend: Backend | None = field(default=None, compare=False)
    error: str | None = None


@dataclass(frozen=True)
class RunningCycle:
    """The cycle holding a backend's live lease (not expired by the database clock)."""

    cycle_id: str
    started_at: datetime | None
    lease_expires_at: datetime | None


@dataclass(frozen=True)
class BackendStatus(StatusRow):
    """``StatusRow`` with the cycle holding the live lease, the latest failed cycle's one-line
    reason and end (C3 ``last_error``, ``last_failed_at``), and the latest finished cycle's
    region failures."""

    running: RunningCycle | None = None
    last_error: str | None = None
    last_failed_at: datetime | None = None
    failures: tuple[RegionFailure, ...] = ()
    # A retired coverage (SAFETY.md rule 24): the backend it came from, what it covers, and
    # since when its cycles fail (the first failure after its last clean cycle).
    retired_from: str | None = None
    account: str | None = None
    regions: tuple[str, ...] = ()
    failing_since: datetime | None = None


@dataclass(frozen=True)
class Removal:
    """What ``backend remove`` did: the cycle it fenced (``--force``), the history it
    kept, and how many live owners still name the removed backend."""

    backend_id: str
    fenced_cycle: str | None
    cycles_kept: int
    orphans_kept: int
    owners_naming_it: int
    coverage: Coverage | None = None  # what stays listed (SAFETY.md rule 24); None: the backend was off


def _backend_row(row: list[Any]) -> BackendRow:
    settings = {} if row[4] is None else json_value(row[4])
    fields = dict(id=row[0], provider=row[1], account=row[2], regions=tuple(row[3] or ()),
                  settings=settings if isinstance(settings, dict) else {"(not an object)": settings}, mode=row[5])
    try:
        return BackendRow(**fields, backend=backend_from_row(row))
    except ConfigError as e:
        return BackendRow(**fields, error=str(e))


def backend_rows(conn: pg8000.native.Connection) -> list[BackendRow]:
    """Every backend, a misconfigured one included (with its ``error``)."""
    return [_backend_row(r) for r in conn.run(f"SELECT {BACKEND_COLUMNS} FROM backends ORDER BY id")]


def backend_row(conn: pg8000.native.Connection, backend_id: str, *, lock: bool = False) -> BackendRow:
    """One backend as stored (``ConfigError`` when unknown); ``lock`` holds the row until
    the transaction ends (not its key: owners and cleanup rows may still reference it)."""
    rows = conn.run(f"SELECT {BACKEND_COLUMNS} FROM backends WHERE id = :i" + (" FOR NO KEY UPDATE" if lock else ""),
                    i=backend_id)
    if not rows:
        raise ConfigError(f"unknown backend {backend_id!r} (see `orphan-cleanup backend list`)")
    return _backend_row(rows[0])


@dataclass(frozen=True)
class Coverage:
    """A retired coverage (SAFETY.md rule 24): what a removed or moved backend covered."""

    id: str
    backend_id: str
    provider: str
    account: str
    regions: tuple[str, ...]
    mode: str | None  # its backend's last (None: the stack's)
    why: str


def run_target(conn: pg8000.native.Connection, name: str) -> tuple[str, str | None, bool]:
    """What ``run --backend NAME`` runs, and its own mode: the backend ``name``; else the
    retired coverage of that id; else the one retired coverage of the removed backend ``name``
    (SAFETY.md rule 24), and whether it is a retired coverage. ``ConfigError`` when there is
    none, or several to choose from."""
    rows = conn.run("SELECT id, mode, retired_from IS NOT NULL FROM coverages() WHERE id = :n UNION ALL"
                    " (SELECT id, mode, true FROM retired_coverages WHERE backend_id = :n"
                    "  AND NOT EXISTS (SELECT 1 FROM coverages() WHERE id = :n) ORDER BY id)", n=name)
    if not rows:
        raise ConfigError(f"unknown backend {name!r} (see `orphan-cleanup backend list`)")
    if len(rows) > 1:
        raise ConfigError(f"backend {name!r} left {len(rows)} retired coverages: name one of"
                          f" {', '.join(r[0] for r in rows)} (see `orphan-cleanup status`)")
    return rows[0][0], rows[0][1], bool(rows[0][2])


def retired_coverage(conn: pg8000.native.Connection, name: str) -> Coverage:
    """The retired coverage ``name`` names (its id, or a removed backend's id with one
    coverage: ``run_target``); ``ConfigError`` when it names none."""
    rows = conn.run("SELECT id, backend_id, provider, account, regions, mode, why FROM retired_coverages"
                    " WHERE id = :n OR (backend_id = :n AND NOT EXISTS (SELECT 1 FROM backends WHERE id = :n))"
                    " ORDER BY id", n=name)
    if not rows:
        raise ConfigError(f"no retired coverage {name!r} (see `orphan-cleanup status`)")
    if len(rows) > 1 and not any(r[0] == name for r in rows):
        raise ConfigError(f"backend {name!r} left {len(rows)} retired coverages: name one of"
                          f" {', '.join(r[0] for r in rows)}")
    r = next((r for r in rows if r[0] == name), rows[0])
    return Coverage(id=r[0], backend_id=r[1], provider=r[2], account=r[3], regions=tuple(r[4] or ()), mode=r[5],
                    why=r[6])


def forget_coverage(conn: pg8000.native.Connection, name: str) -> Coverage:
    """Drop a retired coverage (an operator's decision, SAFETY.md rule 24), with its
    ``coverage_forgotten`` event, in the caller's transaction; ``BackendBusy`` while a cycle of
    it holds a live lease. Its schedule and marks go with it (migration 0020's trigger); its
    cycles, orphans and events stay."""
    cov = retired_coverage(conn, name)
    running = lock_running_cycle(conn, cov.id)
    if running is not None:
        raise BackendBusy(f"retired coverage {cov.id}: cycle {running.cycle_id} is running (lease until"
                          f" {running.lease_expires_at}): wait for it to end")
    conn.run("DELETE FROM retired_coverages WHERE id = :c", c=cov.id)
    conn.run("INSERT INTO events (backend_id, kind, message, details) VALUES (:c, 'coverage_forgotten', :m,"
             " CAST(:d AS jsonb))", c=cov.id,
             m=f"an operator dropped retired coverage {cov.id} of backend {cov.backend_id} ({cov.provider}"
               f" {cov.account}, regions {','.join(cov.regions)}): no longer listed",
             d=json.dumps({"from": cov.backend_id, "account": cov.account, "regions": list(cov.regions)}))
    return cov


_LIVE_LEASE = "c.lease_owner IS NOT NULL AND (c.lease_expires_at IS NULL OR c.lease_expires_at > oc_clock())"


def lock_running_cycle(conn: pg8000.native.Connection, backend_id: str) -> RunningCycle | None:
    """Lock the backend's cleanup row (the lease's; first, as every writer of a cycle
    does) and return the cycle holding a live lease, if any."""
    rows = conn.run(f"SELECT c.lease_owner, cy.started_at, c.lease_expires_at, {_LIVE_LEASE} FROM cleanup c"
                    " LEFT JOIN cycles cy ON cy.id = c.lease_owner WHERE c.backend_id = :b FOR UPDATE OF c",
                    b=backend_id)
    if not rows or not rows[0][3]:
        return None
    return RunningCycle(cycle_id=rows[0][0], started_at=rows[0][1], lease_expires_at=rows[0][2])


def write_backend(conn: pg8000.native.Connection, row: BackendRow) -> None:
    """Store ``row``'s account, regions, settings and mode (the trigger logs the edit as
    activity: the backend's next scheduled run lists, SAFETY.md rule 9)."""
    conn.run("UPDATE backends SET account = :a, regions = CAST(:r AS text[]), settings = CAST(:s AS jsonb),"
             " mode = :m WHERE id = :i", a=row.account, r=list(row.regions), s=json.dumps(row.settings),
             m=row.mode, i=row.id)


def remove_backend(conn: pg8000.native.Connection, backend_id: str, *, force: bool) -> Removal:
    """Delete the backend row in one transaction: no future cycle of it; what it covered stays
    listed as a retired coverage (SAFETY.md rule 24, the trigger of migration 0020). A live cycle refuses
    (``BackendBusy``) unless ``force``: then its fence is bumped and its lease cleared
    first, so nothing of it applies afterwards (SAFETY.md rule 6), and every unfinished
    cycle of the backend is marked failed, with its ``cycle_failed`` event. The cleanup row
    goes with the backend; cycles, orphans and events stay (migration 0009), and an event
    records the removal."""
    running = lock_running_cycle(conn, backend_id)
    row = backend_row(conn, backend_id)
    if running is not None and not force:
        raise BackendBusy(f"backend {backend_id}: cycle {running.cycle_id} is running (lease until"
                          f" {running.lease_expires_at}): wait for it to end, or --force to stop it")
    conn.run("UPDATE cleanup SET fence = fence + 1, lease_owner = NULL, lease_expires_at = NULL"
             " WHERE backend_id = :b", b=backend_id)
    failed = [r[0] for r in conn.run(
        "UPDATE cycles SET outcome = 'failed', failed = true, finished_at = oc_clock(),"
        " error = coalesce(error, :e) WHERE backend_id = :b AND outcome IS NULL RETURNING id",
        e="the backend was removed (backend remove)", b=backend_id)]
    conn.run(CYCLE_FAILED_EVENT, ids=failed, no_reason=NO_REASON)
    cycles, orphans, owners = conn.run(
        "SELECT (SELECT count(*) FROM cycles WHERE backend_id = :b),"
        " (SELECT count(*) FROM orphans WHERE backend_id = :b),"
        " (SELECT count(*) FROM instances WHERE backend_id = :b AND deleted_at IS NULL"
        "   AND status IS DISTINCT FROM 'terminated')"
        " + (SELECT count(*) FROM volumes WHERE backend_id = :b AND deleted_at IS NULL"
        "   AND status IS DISTINCT FROM 'deleted')", b=backend_id)[0]
    fenced = running.cycle_id if running else None
    conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, details)"
             " VALUES (:b, :c, 'backend_removed', :m, CAST(:d AS jsonb))", b=backend_id, c=fenced,
             m=f"backend {backend_id} removed" + (f", its running cycle {fenced} fenced" if fenced else ""),
             d=json.dumps({"provider": row.provider, "account": row.account, "regions": list(row.regions),
                           "mode": row.mode, "settings_keys": sorted(row.settings), "forced": force}))
    before = {r[0] for r in conn.run("SELECT id FROM retired_coverages WHERE backend_id = :b", b=backend_id)}
    conn.run("DELETE FROM backends WHERE id = :b", b=backend_id)
    # what it covered stays listed (SAFETY.md rule 24): the coverage the trigger just wrote
    coverage = next((Coverage(id=r[0], backend_id=backend_id, provider=r[1], account=r[2], regions=tuple(r[3]),
                              mode=r[4], why="removed")
                     for r in conn.run("SELECT id, provider, account, regions, mode FROM retired_coverages"
                                       " WHERE backend_id = :b", b=backend_id) if r[0] not in before), None)
    return Removal(backend_id=backend_id, fenced_cycle=fenced, cycles_kept=int(cycles), orphans_kept=int(orphans),
                   owners_naming_it=int(owners), coverage=coverage)


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


def status_rows(conn: pg8000.native.Connection, backend_id: str | None = None) -> list[BackendStatus]:
    """Every backend's status (or one's), with the cycle holding its live lease; every retired
    coverage's too, under its own id (SAFETY.md rule 24)."""
    rows = conn.run(
        "SELECT b.id, b.provider, b.mode, c.clean_at, c.last_outcome, c.last_processed_at, c.next_due_at,"
        " (SELECT count(*) FROM orphans o WHERE o.backend_id = b.id AND o.verdict = 'orphan'"
        "   AND o.state IN ('open', 'deleting', 'delete_failed')),"
        f" CASE WHEN {_LIVE_LEASE} THEN c.lease_owner END, cy.started_at, c.lease_expires_at,"
        " lf.reason, lf.finished_at, lc.failures, b.retired_from, b.account, b.regions,"
        " CASE WHEN c.last_outcome = 'failed' THEN (SELECT min(f.finished_at) FROM cycles f"
        "   WHERE f.backend_id = b.id AND f.outcome = 'failed'"
        "   AND f.started_at > coalesce(c.clean_at, '-infinity'::timestamptz)) END"
        " FROM coverages() b LEFT JOIN cleanup c ON c.backend_id = b.id LEFT JOIN cycles cy ON cy.id = c.lease_owner"
        " LEFT JOIN LATERAL (SELECT coalesce(f.error, :no_reason) AS reason, f.finished_at FROM cycles f"
        "   WHERE f.backend_id = b.id AND f.outcome = 'failed' ORDER BY f.started_at DESC LIMIT 1) lf ON true"
        " LEFT JOIN LATERAL (SELECT l.failures FROM cycles l WHERE l.backend_id = b.id AND l.outcome IS NOT NULL"
        "   ORDER BY l.started_at DESC LIMIT 1) lc ON true"
        + (" WHERE b.id = :b" if backend_id is not None else "") + " ORDER BY b.id",
        no_reason=NO_REASON, **({"b": backend_id} if backend_id is not None else {}))
    return [BackendStatus(backend=r[0], provider=r[1], mode=r[2], clean_at=r[3], last_outcome=r[4],
                          last_processed_at=r[5], next_due_at=r[6], open_orphans=int(r[7]),
                          running=RunningCycle(cycle_id=r[8], started_at=r[9], lease_expires_at=r[10])
                          if r[8] else None, last_error=r[11], last_failed_at=r[12],
                          failures=tuple(RegionFailure(region=f["region"], error=f["error"])
                                         for f in json_value(r[13]) or ()),
                          retired_from=r[14], account=r[15], regions=tuple(r[16] or ()), failing_since=r[17])
            for r in rows]


@dataclass(frozen=True)
class StuckPending:
    """An owner still ``pending`` long after its ref was issued whose resources the backend's
    latest finished cycle listed (and skipped: ``owner_pending``): the platform likely
    crashed between the create call and recording the provisioning data. Every cycle skips
    it, so ``clean_at`` never advances until the platform reaps the row (README)."""

    backend_id: str
    provider_ref: str
    owner_id: str
    owner_name: str | None
    created_at: datetime
    pending_seconds: int
    region: str
    primary_id: str | None
    cycle_id: str


def stuck_pending(conn: pg8000.native.Connection, older_than_seconds: int,
                  backend_id: str | None = None) -> list[StuckPending]:
    """Every backend's (or one's) stuck pending owners, by the database clock, oldest first."""
    rows = conn.run(
        "SELECT b.id, g.provider_ref, i.id, coalesce(i.name, r.owner_name), i.created_at,"
        " CAST(extract(epoch FROM oc_clock() - i.created_at) AS bigint), g.region, g.primary_id, cy.id"
        " FROM coverages() b"
        " JOIN LATERAL (SELECT c.id FROM cycles c WHERE c.backend_id = b.id AND c.outcome IS NOT NULL"
        "   ORDER BY c.started_at DESC LIMIT 1) cy ON true"
        " JOIN cycle_groups g ON g.cycle_id = cy.id AND g.reason = 'owner_pending'"
        # the owner row, of either table an owner_type names (README, C1): instances or volumes
        " JOIN (SELECT id, name, provider_ref, status, created_at, deleted_at FROM instances UNION ALL"
        "   SELECT id, name, provider_ref, status, created_at, deleted_at FROM volumes) i"
        "   ON i.provider_ref = g.provider_ref AND i.status = 'pending' AND i.deleted_at IS NULL"
        " LEFT JOIN provider_refs r ON r.provider_ref = g.provider_ref"
        " WHERE i.created_at < oc_clock() - make_interval(secs => :t)"
        + (" AND b.id = :b" if backend_id is not None else "") + " ORDER BY b.id, i.created_at, g.group_key",
        t=older_than_seconds, **({"b": backend_id} if backend_id is not None else {}))
    return [StuckPending(backend_id=r[0], provider_ref=r[1], owner_id=r[2], owner_name=r[3], created_at=r[4],
                         pending_seconds=int(r[5]), region=r[6], primary_id=r[7], cycle_id=r[8]) for r in rows]


# One C3 group as JSON built by Postgres, keeping only each resource's kind and id:
# decoding full rows of a 100k-group run cost ~400 MB.
_GROUP_JSON = (
    "json_build_object('provider_ref', g.provider_ref, 'region', g.region,"
    " 'primary_id', g.primary_id, 'resources', (SELECT coalesce(json_agg(json_build_object("
    "  'kind', x->>'kind', 'id', x->>'id')), '[]') FROM jsonb_array_elements(g.resources) AS x),"
    " 'verdict', g.verdict, 'reason', g.reason, 'action', g.action, 'detail',"
    # a marked group (SAFETY.md rule 23): when it goes, before the verdict's evidence line
    " CASE WHEN g.action = 'marked' THEN concat_ws('; ', 'deleted after '"
    # (to the second, rounded up: never earlier than it goes)
    " || to_char(date_trunc('second', g.delete_after + interval '0.999999 s') AT TIME ZONE 'UTC',"
    " 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), g.evidence->>'d')"
    " ELSE g.evidence->>'d' END)")
_GROUP_ORDER = "g.provider_ref, g.region, g.primary_id"
# The report's groups as one JSON text (``cycle_report``) ...
_GROUPS_SQL = (f"SELECT coalesce(json_agg({_GROUP_JSON} ORDER BY {_GROUP_ORDER}), '[]')::text"
               " FROM cycle_groups g WHERE g.cycle_id = :c")
# ... or one group per row, in the same order (``LedgerStore.report_groups`` streams them).
GROUP_ROWS_SQL = (f"SELECT {_GROUP_JSON}::text FROM cycle_groups g WHERE g.cycle_id = :c"
                  f" ORDER BY {_GROUP_ORDER}")


def marked_groups(conn: pg8000.native.Connection, cycle_id: str) -> list[tuple[ResourceGroup, str, datetime]]:
    """The groups the cycle marked (SAFETY.md rule 23), with their reason and delete_after, by key."""
    rows = conn.run("SELECT provider_ref, region, primary_id, resources, reason, delete_after FROM cycle_groups"
                    " WHERE cycle_id = :c AND action = 'marked' ORDER BY group_key", c=cycle_id)
    return [(group_from_row(r[:4]), r[4], r[5]) for r in rows]


def cycle_report(conn: pg8000.native.Connection, cycle_id: str, *, with_groups: bool = True) -> CycleReport:
    """The cycle's C3 report; without ``with_groups``, its header only (``groups`` empty: see
    ``LedgerStore.report_groups``, which streams them)."""
    rows = conn.run("SELECT backend_id, mode, listed_at, outcome, failures, blocked_reason, error"
                    " FROM cycles WHERE id = :c", c=cycle_id)
    if not rows:
        raise ConfigError(f"unknown cycle {cycle_id!r}")
    backend_id, mode, listed_at, outcome, failures, blocked_reason, error = rows[0]
    groups = json.loads(conn.run(_GROUPS_SQL, c=cycle_id)[0][0]) if with_groups else []
    failures = failures if isinstance(failures, list) else json.loads(failures or "[]")
    return CycleReport(
        backend=backend_id, cycle_id=cycle_id, mode=mode, listed_at=listed_at, outcome=outcome or "unsettled",
        failures=tuple(RegionFailure(region=f["region"], error=f["error"]) for f in failures),
        groups=tuple(ReportGroup(provider_ref=g["provider_ref"], region=g["region"], primary_id=g["primary_id"],
                                 resources=tuple(ReportResource(kind=r["kind"], id=r["id"]) for r in g["resources"]),
                                 verdict=g["verdict"], reason=g["reason"], action=g["action"],
                                 detail=g.get("detail")) for g in groups),
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
