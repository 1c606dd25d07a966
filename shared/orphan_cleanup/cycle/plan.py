"""The plan a manual delete run shows before it deletes anything: each group
the cycle registered for deletion, why, its owner as the ledger has it now,
and how old the evidence is. Read-only: building a plan writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.messages import DeleteRequest
from orphan_cleanup.core.owners import Record
from orphan_cleanup.ledger.store import LedgerStore


@dataclass(frozen=True)
class PlannedDelete:
    """One group a delete cycle would delete, as the operator sees it before confirming."""

    group: ResourceGroup
    reason: str  # why it is an orphan (README's reason table)
    owner_id: str | None
    owner_name: str | None
    owner_state: str  # what its latest timestamp says: terminated, deleted, row gone, ref issued ...
    owner_since: datetime | None  # that timestamp (terminated_at, deleted_at, the ref's issued_at ...)
    created_at: datetime | None  # the primary's (else the oldest resource's) creation, as the provider says


@dataclass(frozen=True)
class PlannedMark:
    """An orphan group the cycle marked (SAFETY.md rule 23): not deleted by this run."""

    group: ResourceGroup
    reason: str
    delete_after: datetime  # a cycle listing after this time may delete it


@dataclass(frozen=True)
class Plan:
    backend_id: str
    cycle_id: str
    deletes: tuple[PlannedDelete, ...]
    marked: tuple[PlannedMark, ...] = ()


def build_plan(store: LedgerStore, cycle_id: str, requests: list[DeleteRequest]) -> Plan:
    """What the operator confirms: each requested group with its reason (the cycle's
    verdict), its owner as the ledger has it now, and how old the evidence is; and what
    the cycle marked, which this run does not delete (SAFETY.md rule 23)."""
    report = store.cycle_report(cycle_id)
    reasons = {(g.provider_ref, g.region, g.primary_id): g.reason for g in report.groups}
    records = store.load_records(report.backend, [r.group for r in requests])
    deletes = []
    for request in requests:
        g = request.group
        record = records.get(g.provider_ref)
        state, since = _owner(record)
        primary = [r.created_at for r in g.resources if r.id == g.primary_id and r.created_at]
        created = primary or sorted(r.created_at for r in g.resources if r.created_at)
        deletes.append(PlannedDelete(
            group=g, reason=reasons.get((g.provider_ref, g.region, g.primary_id), "?"),
            owner_id=record.owner_id if record else None, owner_name=record.owner_name if record else None,
            owner_state=state, owner_since=since, created_at=created[0] if created else None))
    marked = tuple(PlannedMark(group, reason, after) for group, reason, after in store.marked_groups(cycle_id))
    return Plan(backend_id=report.backend, cycle_id=cycle_id, deletes=tuple(deletes), marked=marked)


def _owner(record: Record | None) -> tuple[str, datetime | None]:
    """What the owner's latest timestamp says (rendered as ``owner <state> <age>``)."""
    if record is None:
        return "unknown (no ledger record)", None
    if not record.instance_found:
        return "row gone, ref issued", record.issued_at
    if record.deleted_at is not None:
        return "deleted", record.deleted_at
    if record.terminated_at is not None:
        return "terminated", record.terminated_at
    status = getattr(record.status, "value", record.status) or "unknown"
    if record.provisioned_at is not None:
        return f"{status}, provisioned", record.provisioned_at
    return f"{status}, created", record.created_at


def marked_line(count: int, first: datetime) -> str:
    """Why a delete run deletes nothing of these (SAFETY.md rule 23), in one line."""
    return (f"{count} orphan group(s) marked, not deleted by this run: the first goes after"
            f" {first.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} (a cycle listing after that may delete it;"
            " the window is ORPHAN_CLEANUP_CONFIRM_SECONDS)")


def group_label(g: ResourceGroup) -> str:
    """``ref abc123def456 us-east-1 i-0abc``: the ref, the region and the primary (else the first resource)."""
    main = g.primary_id or (g.resources[0].id if g.resources else "-")
    more = f" (+{len(g.resources) - 1} more)" if not g.primary_id and len(g.resources) > 1 else ""
    return f"ref {g.provider_ref} {g.region} {main}{more}"
