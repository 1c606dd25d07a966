"""What ``orphan-cleanup explain`` reads when no cycle of a backend recorded the id it was
asked about: the facts that tell why (README, "Running it by hand"). A manual run records
every group it lists, so an id missing from its groups was never listed by it; a
scheduled cycle records only its orphan, protected and skipped groups; and the ledger
says whether an owner records the id (a tracked VM) or holds the ref.

Read-only: one ``READ ONLY`` transaction, never any DDL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pg8000.exceptions import DatabaseError as PgDatabaseError

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.errors import DatabaseError, SchemaNotMigrated
from orphan_cleanup.core.listing import is_valid_ref
from orphan_cleanup.ledger.db import Database, describe, sqlstate

_NOT_MIGRATED = frozenset({"42P01", "42703", "42883"})


@dataclass(frozen=True)
class ListedCycle:
    """A cycle of the backend whose listing finished (every batch applied)."""

    cycle_id: str
    listed_at: datetime
    failed_regions: tuple[str, ...]  # regions its listing could not list (``failures``)


@dataclass(frozen=True)
class LedgerOwner:
    """An owner the ledger has for the id: the ref's owner, or an owner recording the id
    as its ``primary_id``; ``status`` None when the ref's owner row (instances, or volumes
    for ``owner_type`` volume) is gone."""

    provider_ref: str
    owner_id: str | None
    owner_name: str | None
    status: str | None
    primary_id: str | None
    backend_id: str | None
    owner_type: str | None = "instance"


@dataclass(frozen=True)
class UnrecordedFacts:
    """Why nothing was recorded: the latest manual listing, the scheduled listings since
    (or ever, without a manual one), and what the ledger holds for the id."""

    tag_key: str  # the backend's ref tag key (its default when the row is gone)
    manual: ListedCycle | None
    scheduled: int
    latest_scheduled: datetime | None
    is_ref: bool
    ref_known: bool  # a ref-shaped id: provider_refs has it
    owners: tuple[LedgerOwner, ...]


# A listing that finished: every batch it announced was applied.
_LISTED = ("c.backend_id = :b AND c.listed_at IS NOT NULL AND c.expected_batches IS NOT NULL"
           " AND c.applied_batches >= c.expected_batches")
_MANUAL = (f"SELECT c.id, c.listed_at, c.failures::text FROM cycles c WHERE {_LISTED} AND c.record_all"
           " ORDER BY c.started_at DESC LIMIT 1")
_SCHEDULED = (f"SELECT count(*), max(c.listed_at) FROM cycles c WHERE {_LISTED} AND NOT c.record_all"
              " AND c.listed_at > coalesce(CAST(:since AS timestamptz), '-infinity')")
# The owner rows, of both tables an owner_type names (README, C1): instances and volumes.
_OWNERS = ("(SELECT id, name, provider_ref, status, primary_id, backend_id FROM instances"
           " UNION ALL SELECT id, name, provider_ref, status, primary_id, backend_id FROM volumes)")
_OWNER = "i.id, coalesce(i.name, r.owner_name), i.status, i.primary_id, i.backend_id, r.owner_type"
_BY_REF = (f"SELECT r.provider_ref, coalesce(i.id, r.owner_id), {_OWNER} FROM provider_refs r"
           f" LEFT JOIN {_OWNERS} i ON i.provider_ref = r.provider_ref WHERE r.provider_ref = :q")
_BY_PRIMARY = (f"SELECT i.provider_ref, i.id, {_OWNER} FROM {_OWNERS} i"
               " LEFT JOIN provider_refs r ON r.provider_ref = i.provider_ref WHERE i.primary_id = :q"
               " ORDER BY i.id LIMIT 5")


def unrecorded_facts(db: Database, backend_id: str, query: str) -> UnrecordedFacts:
    """The facts behind "nothing recorded for ``query``" (see the module docstring)."""
    try:
        with db.connection() as conn:
            conn.run("START TRANSACTION READ ONLY")
            keys = conn.run("SELECT settings->>'tag_key' FROM coverages() WHERE id = :b", b=backend_id)
            manual_rows = conn.run(_MANUAL, b=backend_id)
            manual = _listed(manual_rows[0]) if manual_rows else None
            count, latest = conn.run(_SCHEDULED, b=backend_id, since=manual.listed_at if manual else None)[0]
            is_ref = is_valid_ref(query)
            by_ref = conn.run(_BY_REF, q=query) if is_ref else []
            by_primary = conn.run(_BY_PRIMARY, q=query)
    except PgDatabaseError as e:
        if sqlstate(e) in _NOT_MIGRATED:
            raise SchemaNotMigrated() from e
        raise DatabaseError(describe(e)) from e
    owners = tuple(_owner(r) for r in [*by_ref, *by_primary])
    tag_key = keys[0][0] if keys and isinstance(keys[0][0], str) and keys[0][0] else DEFAULT_TAG_KEY
    return UnrecordedFacts(tag_key=tag_key, manual=manual, scheduled=int(count), latest_scheduled=latest, is_ref=is_ref,
                   ref_known=bool(by_ref), owners=owners)


def _listed(row: list[Any]) -> ListedCycle:
    cycle_id, listed_at, failures = row
    failed = json.loads(failures or "[]")
    return ListedCycle(cycle_id=cycle_id, listed_at=listed_at,
                       failed_regions=tuple(str(f.get("region")) for f in failed if isinstance(f, dict)))


def _owner(row: list[Any]) -> LedgerOwner:
    ref, owner_id, instance_id, name, status, primary_id, backend_id, owner_type = row
    return LedgerOwner(provider_ref=ref, owner_id=owner_id, owner_name=name,
                       status=status if instance_id is not None else None, primary_id=primary_id,
                       backend_id=backend_id, owner_type=owner_type)
