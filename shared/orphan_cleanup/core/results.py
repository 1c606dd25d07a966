"""What the pipeline's steps return to their callers (entry points, the runner,
the simulation): small frozen models. ``model_dump()`` is the summary a function
returns as JSON (keys that do not apply are left out, as before)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from orphan_cleanup.core.backends import Mode


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def model_dump(self, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        kw.setdefault("exclude_none", True)
        kw.setdefault("mode", "json")
        return super().model_dump(**kw)


class ListerResult(_Result):
    """A lister run (STEP 1-2). ``reason``: why it listed (never_cleaned, mode_changed,
    activity, manual) or why not (off, not_due, no_activity, busy, backend_changed,
    identity_failed, listing_failed, lease_lost, ledger_key: a deployed function refuses a
    backend whose row holds a key, stack_protect_key: the row's tag key is the stack's protect
    key; ``error`` says so)."""

    backend: str
    started: bool
    reason: str
    cycle_id: str | None = None
    batches: int | None = None
    mode: Mode | None = None
    error: str | None = None


class TickResult(_Result):
    """A tick: the listing jobs it queued, the backends each names with why they are
    due, and why every other backend was left alone (off, not_enrolled, busy,
    not_due, no_activity)."""

    jobs: list[list[str]]
    due: dict[str, str]
    skipped: dict[str, str]
    # The enabled, enrolled backend longest without a clean cycle, and for how long
    # (``StalestBackendSeconds``); None when there is none.
    stalest_backend: str | None = None
    stalest_backend_seconds: int | None = None


class JobResult(_Result):
    """A listing job: one lister result per backend it named, and how many
    listings (provider passes) served them."""

    listings: int
    results: list[ListerResult]


class BatchResult(_Result):
    """A classified batch: how its apply went (applied, duplicate, fenced,
    unknown_cycle) and, when applied, its groups per verdict."""

    status: str
    verdicts: dict[str, int] = {}
