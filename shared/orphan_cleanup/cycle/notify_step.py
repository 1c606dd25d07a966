"""The notify step: after a cycle finished (its STEP 7 committed), send its C6 digest to
every configured channel when it deserves one (``core.digest``). A channel that fails is
logged and recorded (``notify_failed``), counted in the backend's next digest; nothing
here fails the cycle, which is already over (README, "Knowing it works")."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orphan_cleanup.core import policy
from orphan_cleanup.core.digest import digest
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import FinishedCycle
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.notify.base import Notifier, NotifyError

log = logging.getLogger("orphan_cleanup")


@dataclass
class NotifyStep:
    """``Reporter.after_finish``: one digest per eventful cycle, to each notifier."""

    settings: Settings
    db: Database
    notifiers: Sequence[Notifier]
    logger: Any = log

    def __call__(self, finished: FinishedCycle) -> dict[str, Any] | None:
        """Send the cycle's digest; returns it (None: the cycle deserved none, or no channel)."""
        if not self.notifiers:
            return None
        store = LedgerStore(self.db)
        facts = store.digest_facts(finished.cycle_id)
        if facts is None:
            return None
        doc = digest(facts, self._interval(store, finished.backend_id))
        if doc is None:
            return None
        failed: dict[str, str] = {}
        for notifier in self.notifiers:
            try:
                notifier.send(doc)
            except NotifyError as e:
                failed[notifier.channel] = str(e)
            except Exception as e:  # an adapter's surprise must not stop the other channels
                # Its type only: a surprise's text may quote a secret (SAFETY.md rule 22).
                failed[notifier.channel] = f"{notifier.channel}: unexpected {type(e).__name__}"
        for channel, error in failed.items():
            self.logger.error(f"digest of cycle {finished.cycle_id} not delivered to {channel}: {error}",
                              extra={"details": {"backend": finished.backend_id, "cycle_id": finished.cycle_id,
                                                 "channel": channel}})
        store.record_notification(finished.backend_id, finished.cycle_id, failed=failed,
                                  sent=[n.channel for n in self.notifiers if n.channel not in failed])
        return doc

    def _interval(self, store: LedgerStore, backend_id: str) -> int:
        try:
            row = store.backend_row(backend_id)
        except ConfigError:  # removed since: the process's interval
            return self.settings.interval_seconds
        if row.backend is None:
            return self.settings.interval_seconds
        return policy.limits_for(self.settings, row.backend).interval_seconds
