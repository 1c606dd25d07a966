"""A running manual cycle's heartbeat: the lease renewal that lets a short lease
outlive a long run, and lets a killed run free its backend within one lease."""

from __future__ import annotations

import logging
import threading

from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.ledger.locked import GateHold
from orphan_cleanup.ledger.store import LedgerStore

log = logging.getLogger("orphan_cleanup")


class Heartbeat:
    """Renews a running cycle's lease every third of it, from a daemon thread, and the
    delete gate of the deletion in progress (``gate``). Fenced: at the first refusal
    (another run expired the lease, or the cycle ended) it sets ``lost`` and stops."""

    def __init__(self, store: LedgerStore, cycle_id: str, lease_seconds: int, scope: str,
                 gate_ttl: int) -> None:
        self.store, self.cycle_id, self.lease_seconds = store, cycle_id, lease_seconds
        self.scope, self.gate_ttl = scope, gate_ttl
        self.gate: GateHold | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{cycle_id[:8]}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def hold(self, ref: str, holder: str) -> None:
        self.gate = GateHold(self.scope, ref, holder, self.gate_ttl)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1)

    def _beat(self) -> None:
        try:
            while not self._stop.wait(self.lease_seconds / 3):
                try:
                    renewed = cycle_state.renew_lease(self.store, self.cycle_id, self.lease_seconds, gate=self.gate)
                except DatabaseError as exc:  # the lease may lapse; fencing keeps the cycle safe
                    log.warning("cycle %s: lease renewal failed: %s", self.cycle_id, exc)
                    continue
                if not renewed:
                    self.lost.set()
                    return
        finally:
            self.store.db.close()
