"""What the pure core decides and the pipeline hands to the ledger store to write:
a classified batch (``BatchApplication``) and a deletion's record (``DeleteRecord``).

Plain frozen data, no I/O: ``classify`` and ``pipeline`` build these, the store
(``ledger/store.py``) serializes them. Neither side imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from orphan_cleanup.core.listing import RegionFailure, ResourceGroup
from orphan_cleanup.core.verdicts import Action, DeleteResult, VerdictKind


class GroupRow(NamedTuple):
    """One ``cycle_groups`` row: a listed group, its verdict and the action decided.
    (Row types are named tuples: immutable, and built per group on the classifier's hot path.)"""

    group: ResourceGroup
    verdict: VerdictKind
    reason: str
    action: Action
    owner_type: str | None = None
    owner_id: str | None = None
    owner_name: str | None = None
    # What the verdict was reached on (``evidence.record_of``, its ``d`` the C3 detail
    # line): kept in cycle_groups.evidence; None for a row that is only logged.
    evidence: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as ``oc_apply_batch`` and the reporter read it (``evidence`` apart:
        ``ledger.store.apply_payload`` adds it to the cycle_groups rows only)."""
        g = self.group
        return {"group_key": g.key, "provider_ref": g.provider_ref, "region": g.region,
                "primary_id": g.primary_id, "resources": [r.model_dump(mode="json") for r in g.resources],
                "verdict": self.verdict.value, "reason": self.reason, "action": self.action.value,
                "owner_id": self.owner_id, "owner_name": self.owner_name}


class OrphanRow(NamedTuple):
    """An ``orphans`` upsert: an orphan (``open``) or protected group seen by this cycle."""

    row: GroupRow
    state: str  # "open" | "protected"
    reported: bool
    # Since when the group is an orphan (``costs.orphan_since``): kept at its earliest.
    orphan_since: datetime | None = None


class ReportEvent(NamedTuple):
    """An ``events`` row for a reported group (``<verdict>_reported``)."""

    row: GroupRow
    message: str


@dataclass(frozen=True, slots=True)
class BatchApplication:
    """A classified batch, as the fenced, idempotent ``oc_apply_batch`` writes it,
    plus what the pipeline emits once it is applied (``to_report``, ``errors``)."""

    cycle_id: str
    seq: int
    last: bool
    batch_count: int | None
    failures: tuple[RegionFailure, ...]
    groups: int  # groups listed in this batch
    skipped: bool  # a group was skipped: the cycle cannot be clean
    rows: tuple[GroupRow, ...] = ()
    orphans: tuple[OrphanRow, ...] = ()
    events: tuple[ReportEvent, ...] = ()
    to_report: tuple[GroupRow, ...] = ()
    errors: tuple[tuple[str, GroupRow], ...] = ()
    counts: dict[str, int] = field(default_factory=dict)  # verdict -> groups, in first-seen order


@dataclass(frozen=True, slots=True)
class DeleteRecord:
    """How one deletion's end is recorded (``delete_rules.delete_record`` decides it)."""

    action: Action  # cycle_groups.action
    request_state: str  # delete_requests.state: done | deleting | skipped | failed
    orphan_state: str  # orphans.state: deleted | deleting | open | delete_failed | protected
    unsettled: bool  # the cycle cannot be clean
    failed: bool  # the cycle fails
    trip_region: bool  # the group's region is skipped for the rest of the cycle (rule 5)
    error: str | None
    message: str  # the event's text
    # Whether the group's orphan row keeps a protection it remembers (SAFETY.md rule 14) and,
    # with it, its verdict and reason; False: a deletion happened, which ends the protection
    # (it was lifted) and the row becomes the orphan its cycle classified again.
    keeps_protection: bool
    result: DeleteResult | None = None
    skipped_reason: str | None = None
    # A protection the delete found (SAFETY.md rule 14): the group's verdict becomes
    # ``protected`` with this reason and ``detail`` (cycle_groups and orphans).
    protection: str | None = None
    protection_detail: str | None = None
