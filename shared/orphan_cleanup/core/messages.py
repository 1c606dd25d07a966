"""The messages that cross a queue between the functions (each carries a ``v``
field). Messages are hints; the database is the truth (SAFETY.md rule 12)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orphan_cleanup.core.backends import Mode
from orphan_cleanup.core.listing import BackendId, Frozen, RegionFailure, ResourceGroup

MESSAGE_VERSION: Literal[1] = 1
# Most backends one listing job feeds (a message stays far below the queue's size limit).
MAX_JOB_BACKENDS = 500


class ListingBatch(Frozen):
    """One batch of a cycle's listing, in listing order. The last batch
    (``last=True``) carries ``batch_count`` and the cycle's region failures."""

    v: Literal[1] = MESSAGE_VERSION
    cycle_id: str = Field(min_length=1, max_length=64)
    backend: BackendId
    seq: int = Field(ge=0)
    listed_at: datetime
    mode: Mode = "report"
    record_all: bool = False
    groups: tuple[ResourceGroup, ...] = ()
    last: bool = False
    batch_count: int | None = Field(default=None, ge=1)
    failures: tuple[RegionFailure, ...] = ()

    @model_validator(mode="after")
    def _unique_groups(self) -> ListingBatch:
        # A listing never yields one group twice: a batch that does is malformed
        # (altered or corrupted) and is refused whole, never half applied.
        keys = [g.key for g in self.groups]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"duplicate group key {dup} in batch {self.seq}")
        return self


class DeleteRequest(Frozen):
    v: Literal[1] = MESSAGE_VERSION
    cycle_id: str = Field(min_length=1, max_length=64)
    backend: BackendId
    group: ResourceGroup


class ListingJob(Frozen):
    """One listing the tick asks for: backends it found due together that share one
    listing (``Backend.listing_key``). A hint like every message: the lister re-reads
    each backend, re-applies STEP 1 under its lease and regroups by the rows' keys."""

    v: Literal[1] = MESSAGE_VERSION
    backends: tuple[BackendId, ...] = Field(min_length=1, max_length=MAX_JOB_BACKENDS)

    @model_validator(mode="after")
    def _unique_backends(self) -> ListingJob:
        if len(set(self.backends)) != len(self.backends):
            raise ValueError("a backend is named twice")
        return self


class ListerEvent(BaseModel):
    """The lister's input: ``{"backend": "ID"}`` from a schedule or a manual invoke."""

    model_config = ConfigDict(extra="ignore")

    backend: BackendId
    mode: Mode | None = None
