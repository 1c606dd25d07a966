"""What every step of a cycle works with: the settings, the ledger, the provider adapters,
the reporter and the clock. One ``StepContext`` is made for a ``Pipeline`` and handed to
each of its steps (lister, classifier, deleter), which add only the queues they use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from orphan_cleanup.core import policy
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.reporting import Reporter
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.providers.base import ResourceProvider

ProviderFactory = Callable[[Backend], ResourceProvider]


@dataclass
class StepContext:
    """Shared, not copied: a field replaced here (a test's clock, a provider factory, a
    database) is what every step reads at its next call."""

    settings: Settings
    db: Database
    provider_for: ProviderFactory
    reporter: Reporter
    # None: every compared timestamp is the database's clock (SAFETY.md rule 13).
    # Tests and the simulation may inject a time source.
    clock: Callable[[], datetime] | None = None

    @property
    def store(self) -> LedgerStore:
        return LedgerStore(self.db, on_finish=self.reporter.cycle_finished)

    def now(self) -> datetime | None:
        """The injected time, or None: the store reads the database clock."""
        return self.clock() if self.clock is not None else None

    def limits(self, backend: Backend) -> Limits:
        return policy.limits_for(self.settings, backend)
