"""What the ledger store returns: frozen snapshots of rows, built from the rows
an SQL statement returned (never patched by hand to mirror an ``UPDATE``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from orphan_cleanup.core.backends import Backend, Mode
from orphan_cleanup.core.listing import RegionFailure, ResourceGroup
from orphan_cleanup.core.owners import Keep

ApplyStatus = Literal["applied", "duplicate", "fenced", "unknown_cycle"]

#: The ``cycles`` columns every locked write returns (``Cycle.from_row``).
CYCLE_COLUMNS = ("id, backend_id, fence, mode, listed_at, expected_batches, applied_batches, open_deletes,"
                 " groups_listed, failures, unsettled, failed, tripped_regions, outcome, dispatched, error")


def _json(value: Any, default: Any) -> Any:
    if value is None:
        return default
    return value if isinstance(value, (list, dict)) else json.loads(value)


@dataclass(frozen=True)
class Cycle:
    """A ``cycles`` row: a cycle's bookkeeping state (ARCHITECTURE.md, one cycle)."""

    id: str
    backend_id: str
    fence: int
    mode: Mode
    listed_at: datetime | None
    expected_batches: int | None
    applied_batches: int
    open_deletes: int
    groups_listed: int
    failures: tuple[RegionFailure, ...]
    unsettled: bool
    failed: bool
    tripped_regions: tuple[str, ...]
    outcome: str | None
    dispatched: bool
    error: str | None

    @classmethod
    def from_row(cls, row: list[Any]) -> Cycle:
        (cid, backend_id, fence, mode, listed_at, expected, applied, open_deletes, listed, failures,
         unsettled, failed, tripped, outcome, dispatched, error) = row
        return cls(id=cid, backend_id=backend_id, fence=fence, mode=mode, listed_at=listed_at,
                   expected_batches=expected, applied_batches=applied, open_deletes=open_deletes,
                   groups_listed=listed,
                   failures=tuple(RegionFailure.model_validate(f) for f in _json(failures, [])),
                   unsettled=bool(unsettled), failed=bool(failed), tripped_regions=tuple(tripped or ()),
                   outcome=outcome, dispatched=bool(dispatched), error=error)

    @property
    def listing_done(self) -> bool:
        return self.expected_batches is not None and self.applied_batches >= self.expected_batches

    @property
    def complete(self) -> bool:
        """Every batch is in and no deletion is open: STEP 7 may run."""
        return self.listing_done and self.open_deletes <= 0


@dataclass(frozen=True)
class FinishedCycle:
    """A cycle that has just finished (STEP 7 committed): what the store tells its
    ``on_finish`` hook once the transaction is in."""

    backend_id: str
    cycle_id: str
    mode: Mode
    outcome: str


@dataclass(frozen=True)
class CleanupState:
    """A backend's ``cleanup`` row: its lease, fence and schedule."""

    backend_id: str
    clean_at: datetime | None
    clean_mode: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    fence: int
    retry_delay_seconds: int
    next_due_at: datetime | None


@dataclass(frozen=True)
class IdleSnapshot:
    """STEP 1's facts for a backend, read without a lock (the idle fast path)."""

    clean_at: datetime | None
    clean_mode: str | None
    leased: bool
    retry_delay_seconds: int
    next_due_at: datetime | None
    activity_since_clean: bool
    now: datetime  # the database clock, read by the same statement


@dataclass(frozen=True)
class TickRow:
    """One backend as the tick sees it: its row and STEP 1's facts (``snapshot`` is
    None when it is not enrolled: the ledger has issued no ref yet, or when
    ``due_later``: holding no lease, it is due later than any due tolerance, so the
    statement read no facts for it: not due)."""

    backend: Backend
    snapshot: IdleSnapshot | None
    lease_expires_at: datetime | None
    due_later: bool = False
    # Seconds since its last clean cycle (since enrolment without one); None: not enrolled.
    stale_seconds: int | None = None


@dataclass(frozen=True)
class CycleRef:
    id: str
    backend_id: str
    fence: int
    mode: Mode


@dataclass(frozen=True)
class CycleContext:
    """What a cycle's own row says about it: the truth that queue messages only
    hint at (SAFETY.md rule 12)."""

    id: str
    backend_id: str
    mode: Mode
    listed_at: datetime | None
    record_all: bool
    backend: Backend  # the backend as the cycle took it (its snapshot), SAFETY.md rule 18
    row_mode: Mode | None = None  # the backend row's own mode now (None: the global one)
    row: Backend | None = None  # the backend row as it is now (None: it no longer reads as one)
    # With ``account=True``: the raw settings of every backend of its provider account now.
    account: list[Any] | None = None


@dataclass(frozen=True)
class ApplyResult:
    """What ``oc_apply_batch`` answered."""

    status: ApplyStatus
    listing_complete: bool = False
    mode: Mode | None = None
    groups_listed: int | None = None


@dataclass(frozen=True)
class DeleteRequestRow:
    """A cycle's delete request for one group: its state, and the group as the
    cycle recorded it (``None`` when the cycle holds no orphan row of that key)."""

    state: str | None  # None: never requested
    group: ResourceGroup | None
    # A retry leak's: the owner's recorded primary, listed beside it (SAFETY.md rule 17).
    listed_primary: str | None = None
    # The operator's keep of the group's ref, in force (SAFETY.md rule 23): not deleted.
    keep: Keep | None = None


@dataclass(frozen=True)
class ReportResource:
    kind: str
    id: str


@dataclass(frozen=True)
class ReportGroup:
    provider_ref: str
    region: str
    primary_id: str | None
    resources: tuple[ReportResource, ...]
    verdict: str
    reason: str
    action: str
    detail: str | None = None  # the evidence's one human line, when it has one


@dataclass(frozen=True)
class CycleReport:
    """One cycle as ``orphan-cleanup run`` reports it (C3)."""

    backend: str
    cycle_id: str
    mode: Mode
    listed_at: datetime | None
    outcome: str  # clean | unsettled | failed (unsettled while running)
    failures: tuple[RegionFailure, ...]
    groups: tuple[ReportGroup, ...]
    blocked_reason: str | None
    error: str | None

    def c3(self) -> dict[str, Any]:
        """The C3 JSON document (without ``blocked_reason`` and ``error``, which the CLI prints as notes)."""
        return {"backend": self.backend, "cycle_id": self.cycle_id, "mode": self.mode,
                "listed_at": self.listed_at.isoformat() if self.listed_at else None, "outcome": self.outcome,
                "failures": [{"region": f.region, "error": f.error} for f in self.failures],
                "groups": [{"provider_ref": g.provider_ref, "region": g.region, "primary_id": g.primary_id,
                            "resources": [{"kind": r.kind, "id": r.id} for r in g.resources],
                            "verdict": g.verdict, "reason": g.reason, "action": g.action,
                            **({"detail": g.detail} if g.detail else {})} for g in self.groups]}


@dataclass(frozen=True)
class StatusRow:
    """One backend in ``orphan-cleanup status``."""

    backend: str
    provider: str
    mode: str | None  # the backend's own mode; None: the global one
    clean_at: datetime | None
    last_outcome: str | None
    last_processed_at: datetime | None
    next_due_at: datetime | None
    open_orphans: int
