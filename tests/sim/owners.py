"""The platform's owners as the simulation tracks them, and shared constants."""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from tests.sim.db import PooledConnection

LIVE = ("provisioning", "idle", "busy")
#: A volume owner's live statuses (README, C1; the volumes world, volume_owners.py).
VOLUME_LIVE = ("provisioning", "active")
TAG, PROTECT = DEFAULT_TAG_KEY, DEFAULT_PROTECT_KEY
#: The protect key ``sim-b`` sometimes has instead (rule 16: a key of one backend of an
#: account protects the resource from every backend of it).
PROTECT_B = "platform-keep"
# The stack's own protect key (ORPHAN_CLEANUP_PROTECT_TAG_KEY): no backend row names it, and it
# protects whatever the rows say (rule 16).
PROTECT_STACK = "stack-keep"
PROTECT_KEYS = frozenset({PROTECT, PROTECT_B, PROTECT_STACK})
REF_ALPHABET = string.ascii_lowercase + string.digits
MAX_ACTIVE_OWNERS = 10
LISTING_LAG_MAX = 45  # seconds; the margin (120 s) covers it with room
RECOVERY_AFTER_STEPS = 3


@dataclass
class Attempt:
    n: int
    region: str
    vm: str | None = None
    deps: list[str] = field(default_factory=list)


@dataclass
class OpenTx:
    conn: PooledConnection
    commit_step: int
    on_commit: Callable[[], None]
    label: str
    concerns: frozenset[str] | None = None  # the backends whose activity the write is (None: all)


@dataclass
class Owner:
    id: str
    ref: str
    committed: str | None = None  # the ledger status as committed; "gone" after a hard delete
    soft_deleted: bool = False
    phase: str = "issuing"
    attempts: list[Attempt] = field(default_factory=list)
    tracked: int | None = None  # attempt whose VM is the committed primary id
    provisioned_at: datetime | None = None
    since: int = 0
    recover_after: int = 3  # steps a crashed owner waits before the platform recovers it
    tx: OpenTx | None = None
    home: str = "sim"  # the backend the platform provisions it into
    backend: str | None = None  # the committed backend_id (None until provisioned)
    mangled: bool = False  # its recorded primary_id names no instance (rule 17's world)
    kind: str = "instance"  # or "volume": a volumes row, its attempts' ``vm`` a volume (volume_owners.py)

    def vm_of(self, attempt: int | None) -> str | None:
        return self.attempts[attempt].vm if attempt is not None else None
