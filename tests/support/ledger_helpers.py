"""Test helpers: write the C1 ledger with plain SQL (the way a platform would,
with chosen timestamps), build listed groups quickly, read tables back.

Nothing here replaces our own code: the ledger is written with SQL a platform
could issue, and every read goes to the real database.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.ledger.db import Database

UTC = timezone.utc
T0 = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
_ALPHABET = string.ascii_lowercase + string.digits


def make_ref() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(12))


def limits(**overrides: Any) -> Limits:
    values: dict[str, Any] = dict(interval_seconds=900, margin_seconds=0, max_backoff_seconds=6 * 3600,
                                  cycle_deadline_seconds=1800, max_deletes=100, max_delete_share=0.5)
    values.update(overrides)
    return Limits(**values)


# ---- ledger writes (plain SQL, C1 columns only) -----------------------------

def add_backend(db: Database, backend_id: str = "aws-prod", *, provider: str = "aws",
                account: str = "123456789012", regions: Sequence[str] = ("us-east-1",),
                settings: dict[str, Any] | None = None, mode: str | None = None) -> str:
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " VALUES (:i, :p, :a, CAST(:r AS text[]), CAST(:s AS jsonb), :m)",
                 i=backend_id, p=provider, a=account, r=list(regions), s=json.dumps(settings or {}), m=mode)
    return backend_id


def add_ref(db: Database, ref: str | None = None, *, owner_id: str | None = None, owner_name: str | None = None,
            owner_type: str = "instance", issued_at: datetime | None = None) -> str:
    """A ``provider_refs`` row only (e.g. a ref whose owner row was hard-deleted)."""
    ref = ref or make_ref()
    with db.connection() as conn:
        conn.run("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
                 " VALUES (:r, :t, :o, :n, coalesce(CAST(:at AS timestamptz), now()))",
                 r=ref, t=owner_type, o=owner_id or f"inst-{ref}", n=owner_name, at=issued_at)
    return ref


def add_instance(db: Database, *, ref: str | None = None, instance_id: str | None = None,
                 name: str | None = None, status: str = "idle", backend_id: str | None = None,
                 primary_id: str | None = None, region: str | None = None,
                 issued_at: datetime | None = None, created_at: datetime | None = None,
                 provisioned_at: datetime | None = None, terminated_at: datetime | None = None,
                 deleted_at: datetime | None = None) -> tuple[str, str]:
    """A ref and its owner instance, committed together. Returns (ref, instance id)."""
    ref = ref or make_ref()
    instance_id = instance_id or f"inst-{ref}"
    with db.transaction() as conn:
        conn.run("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
                 " VALUES (:r, 'instance', :o, :n, coalesce(CAST(:at AS timestamptz), now()))",
                 r=ref, o=instance_id, n=name, at=issued_at)
        conn.run("INSERT INTO instances (id, name, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at, terminated_at, deleted_at)"
                 " VALUES (:i, :n, :r, :s, :b, :p, :g, coalesce(CAST(:c AS timestamptz), now()), :pa, :ta, :da)",
                 i=instance_id, n=name, r=ref, s=status, b=backend_id, p=primary_id, g=region,
                 c=created_at, pa=provisioned_at, ta=terminated_at, da=deleted_at)
    return ref, instance_id


def add_volume(db: Database, *, ref: str | None = None, volume_id: str | None = None,
               name: str | None = None, status: str = "active", backend_id: str | None = None,
               primary_id: str | None = None, region: str | None = None,
               issued_at: datetime | None = None, created_at: datetime | None = None,
               provisioned_at: datetime | None = None, deleted_at: datetime | None = None) -> tuple[str, str]:
    """A ref (owner_type ``volume``) and its owner volume, committed together, with the C1
    columns only. Returns (ref, volume row id)."""
    ref = ref or make_ref()
    volume_id = volume_id or f"volume-{ref}"
    with db.transaction() as conn:
        conn.run("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
                 " VALUES (:r, 'volume', :o, :n, coalesce(CAST(:at AS timestamptz), now()))",
                 r=ref, o=volume_id, n=name, at=issued_at)
        conn.run("INSERT INTO volumes (id, name, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at, deleted_at)"
                 " VALUES (:i, :n, :r, :s, :b, :p, :g, coalesce(CAST(:c AS timestamptz), now()), :pa, :da)",
                 i=volume_id, n=name, r=ref, s=status, b=backend_id, p=primary_id, g=region,
                 c=created_at, pa=provisioned_at, da=deleted_at)
    return ref, volume_id


def add_refs_bulk(db: Database, refs: Sequence[str], *, issued_at: datetime = T0) -> None:
    """Many refs without owners, in one statement."""
    with db.connection() as conn:
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id, issued_at)"
                 " SELECT x, 'inst-' || x, :t FROM unnest(CAST(:refs AS text[])) AS x",
                 refs=list(refs), t=issued_at)


def add_instances_bulk(db: Database, refs: Sequence[str], *, backend_id: str, status: str = "idle",
                       at: datetime = T0, deleted_at: datetime | None = None) -> None:
    """An owner instance for each of ``refs`` (already in provider_refs), primary id ``i-<ref>``."""
    with db.connection() as conn:
        conn.run("INSERT INTO instances (id, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at, deleted_at)"
                 " SELECT 'inst-' || x, x, :s, :b, 'i-' || x, 'us-east-1', :t, :t, :d"
                 " FROM unnest(CAST(:refs AS text[])) AS x",
                 refs=list(refs), s=status, b=backend_id, t=at, d=deleted_at)


# ---- reads -------------------------------------------------------------------

def db_now(db: Database) -> datetime:
    """The database clock (activity rows are stamped with it)."""
    with db.connection() as conn:
        return conn.run("SELECT clock_timestamp()")[0][0]


def count_rows(db: Database, table: str) -> int:
    with db.connection() as conn:
        return conn.run(f"SELECT count(*) FROM {table}")[0][0]


def table_counts(db: Database, tables: Iterable[str] = ("events", "orphans", "cycle_groups", "cycle_batches",
                                                         "delete_requests", "orphan_resources")) -> dict[str, int]:
    return {t: count_rows(db, t) for t in tables}


def cleanup_row(db: Database, backend_id: str) -> dict[str, Any]:
    with db.connection() as conn:
        rows = conn.run("SELECT * FROM cleanup WHERE backend_id = :b", b=backend_id)
        cols = [c["name"] for c in conn.columns]
    assert rows, f"no cleanup row for {backend_id}"
    return dict(zip(cols, rows[0]))


def cycle_row(db: Database, cycle_id: str) -> dict[str, Any]:
    with db.connection() as conn:
        rows = conn.run("SELECT * FROM cycles WHERE id = :c", c=cycle_id)
        cols = [c["name"] for c in conn.columns]
    assert rows, f"no cycle {cycle_id}"
    return dict(zip(cols, rows[0]))


# ---- listed groups -------------------------------------------------------------

def resource(rid: str, *, kind: ResourceKind | str = ResourceKind.INSTANCE, region: str = "us-east-1",
             created_at: datetime | None = None, tags: dict[str, str] | None = None,
             state: ResourceState = ResourceState.ACTIVE) -> Resource:
    return Resource(kind=ResourceKind(kind), id=rid, region=region, state=state, tags=tags or {},
                    created_at=created_at)


def group(ref: str, primary_id: str | None = None, *, region: str = "us-east-1",
          created_at: datetime | None = None, tags: dict[str, str] | None = None,
          extra: Sequence[Resource] = ()) -> ResourceGroup:
    """A listed group: the primary instance (when given) plus ``extra`` resources."""
    resources: list[Resource] = []
    if primary_id is not None:
        resources.append(resource(primary_id, region=region, created_at=created_at,
                                  tags={"provider_ref": ref, **(tags or {})}))
    resources.extend(extra)
    return ResourceGroup(provider_ref=ref, region=region, primary_id=primary_id, resources=tuple(resources))


def leftovers(ref: str, *ids: str, region: str = "us-east-1", created_at: datetime | None = None,
              tags: dict[str, str] | None = None) -> ResourceGroup:
    """A primary-less group of volumes."""
    return ResourceGroup(provider_ref=ref, region=region, primary_id=None, resources=tuple(
        resource(i, kind=ResourceKind.VOLUME, region=region, created_at=created_at,
                 tags={"provider_ref": ref, **(tags or {})}) for i in ids))


class CountingConnection:
    """Instrumentation, not a mock: forwards everything to a real pg8000
    connection and records each statement passed to ``run``."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.statements: list[str] = []

    def run(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(sql)
        return self._conn.run(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)



# Children before parents; any table a later migration adds is truncated instead.
_RESET_ORDER = ("delete_requests", "cycle_batches", "cycle_groups", "cycles", "orphan_resources", "orphans",
                "events", "delete_gates", "cleanup", "instances", "provider_refs", "backends",
                # deleting a backend retires its coverage (docs/SAFETY.md rule 24), with an event
                "retired_coverages", "events", "ledger_activity")


def reset(db: Database) -> None:
    """Empty every table but ``schema_migrations``: a fresh migrated database for
    the next test, far cheaper than creating one (DELETE of a few rows beats TRUNCATE)."""
    with db.connection() as conn:
        tables = {r[0] for r in conn.run("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        known = [t for t in _RESET_ORDER if t in tables]
        others = sorted(tables - set(known) - {"schema_migrations"})
        body = "".join(f"DELETE FROM {t};" for t in known)
        if others:
            body = f"TRUNCATE {', '.join(others)} CASCADE;" + body
        conn.run(f"DO $$ BEGIN {body} END $$")
