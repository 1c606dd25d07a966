"""The ledger port: every SQL statement of the cleanup goes through ``LedgerStore``
(the provisioner-side ``LedgerClient`` and the migrations excepted).

The store records; it never decides. It returns frozen snapshots
(``ledger/records.py``) and takes the pipeline's decisions (``decisions.py``);
it never imports ``classify``.

Contracts:

- **Fencing.** Every write of a running cycle goes through ``cycle()``, whose
  ``LockedCycle`` checks ``cleanup.fence = cycles.fence``,
  ``cleanup.lease_owner = cycles.id`` and ``cycles.outcome IS NULL`` under the
  locks first: a cycle that lost its lease (or finished) raises ``LeaseLost``
  and writes nothing. ``LedgerSession.apply`` does the same check in plpgsql
  (``oc_apply_batch``) and answers ``fenced``.
- **Idempotency.** A redelivered batch (same cycle and ``seq``) applies
  nothing and answers ``duplicate``; a delete request is keyed by (cycle, group),
  so queueing it twice adds nothing and recording its end twice writes nothing
  the second time (``record_delete`` returns False: "already applied").
- **One clock** (SAFETY.md rule 13). A method or unit taking ``now=None`` reads
  the database clock (``oc_clock()``) inside its own statement or transaction;
  only tests and the simulation pass a time.
- **Lock order**: the backend's ``cleanup`` row, then its ``cycles`` row.
- **No transaction on the hot paths**: ``session()`` is one connection
  without a transaction; the idle STEP 1 check is one read and one conditional
  write, a classified batch is three statements (cycle and backend, the join,
  the apply).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.digest import DigestFacts
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.owners import Record
from orphan_cleanup.ledger import digest_facts, keeps, leaks, queries, reports, watch
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.locked import Leases, LockedCycle
from orphan_cleanup.ledger.records import CycleReport, FinishedCycle
from orphan_cleanup.ledger.session import LedgerSession

_log = logging.getLogger(__name__)

#: Groups per FETCH of ``report_groups``.
REPORT_PAGE = 2_000


class LedgerStore:
    """The cleanup's ledger port (see the module docstring for its contracts)."""

    def __init__(self, db: Database, on_finish: Callable[[FinishedCycle], None] | None = None) -> None:
        self.db = db
        # Called once a cycle's STEP 7 has committed (``cycle()``): its metrics and digest.
        self.on_finish = on_finish

    @contextmanager
    def session(self) -> Iterator[LedgerSession]:
        with self.db.connection() as conn:
            yield LedgerSession(conn)

    @contextmanager
    def leases(self, backend_ids: Sequence[str], now: datetime | None = None) -> Iterator[Leases]:
        """STEP 1 and the lease of several backends, in one transaction holding their
        cleanup rows; the leases taken are written at its end (``Leases.flush``)."""
        with self.db.transaction() as conn:
            leases = Leases(conn, backend_ids, now)
            yield leases
            leases.flush()

    @contextmanager
    def cycle(self, cycle_id: str, now: datetime | None = None) -> Iterator[LockedCycle]:
        """A live cycle, fenced and locked for one transaction (``LeaseLost`` otherwise).
        A cycle the unit finished is handed to ``on_finish`` after the commit."""
        with self.db.transaction() as conn:
            unit = LockedCycle(conn, cycle_id, now)
            yield unit
        if unit.finished is not None and self.on_finish is not None:
            self.on_finish(unit.finished)

    @contextmanager
    def cycle_read(self, cycle_id: str, now: datetime | None = None) -> Iterator[LockedCycle]:
        """A live cycle read without a lock or a transaction (``LeaseLost`` if fenced), whose
        only write is ``finish``: one statement that writes only if the rows did not change
        since this read (else ``finished`` stays None: decide again under ``cycle()``).
        A cycle it finished is handed to ``on_finish``, as ``cycle()`` does."""
        with self.db.connection() as conn:
            unit = LockedCycle(conn, cycle_id, now, lock=False)
            yield unit
        if unit.finished is not None and self.on_finish is not None:
            self.on_finish(unit.finished)

    def enroll(self) -> int:
        """Create a cleanup row for each backend once the ledger has issued refs
        (a periodic call, so backends added by any writer are picked up)."""
        with self.db.transaction() as conn:
            return len(conn.run(
                "INSERT INTO cleanup (backend_id) SELECT b.id FROM coverages() b"
                " WHERE EXISTS (SELECT 1 FROM provider_refs) ON CONFLICT DO NOTHING RETURNING backend_id"))

    def load_records(self, backend_id: str, groups: Iterable[ResourceGroup]) -> dict[str, Record]:
        with self.session() as s:
            return s.load_records(backend_id, groups)

    # ---- per-ref delete gates (SAFETY.md rule 4) ----------------------------------

    def acquire_gate(self, scope: str, ref: str, holder: str, ttl_seconds: int) -> bool:
        """Take the per-ref delete gate (a lease row). Unrelated refs never wait. The gate is
        per account (``Backend.scope``, kept in the ``backend_id`` column): backends sharing an
        account list the same groups and must not delete one at the same time. The holder may renew."""
        with self.db.connection() as conn:  # one statement: its own transaction
            return bool(conn.run(
                "INSERT INTO delete_gates AS g (backend_id, provider_ref, holder, expires_at)"
                " VALUES (:b, :r, :h, now() + make_interval(secs => :t))"
                " ON CONFLICT (backend_id, provider_ref) DO UPDATE SET holder = excluded.holder,"
                " expires_at = excluded.expires_at WHERE g.expires_at < now() OR g.holder = excluded.holder"
                " RETURNING holder", b=scope, r=ref, h=holder, t=ttl_seconds))

    def release_gate(self, scope: str, ref: str, holder: str) -> None:
        """Release the gate if ``holder`` holds it (else nothing)."""
        with self.db.connection() as conn:  # one statement: its own transaction
            conn.run("DELETE FROM delete_gates WHERE backend_id = :b AND provider_ref = :r AND holder = :h",
                     b=scope, r=ref, h=holder)

    # ---- operators ------------------------------------------------------------------

    def backends(self) -> list[Backend]:
        with self.db.connection() as conn:
            return queries.list_backends(conn)

    def backend_rows(self) -> list[reports.BackendRow]:
        """Every backend as stored, a misconfigured one included (``BackendRow.error``)."""
        with self.db.connection() as conn:
            return reports.backend_rows(conn)

    def backend_row(self, backend_id: str) -> reports.BackendRow:
        """One backend as stored (``ConfigError`` when unknown)."""
        with self.db.connection() as conn:
            return reports.backend_row(conn, backend_id)

    def update_backend(self, backend_id: str,
                       edit: Callable[[reports.BackendRow, reports.RunningCycle | None], reports.BackendRow],
                       ) -> reports.BackendRow:
        """Replace a backend's account, regions, settings and mode with ``edit(current,
        running)``'s, in one transaction holding its cleanup row and its row: ``edit`` sees
        the row as stored and the cycle holding a live lease, and raises to change nothing.
        Returns the row as stored afterwards."""
        with self.db.transaction() as conn:
            running = reports.lock_running_cycle(conn, backend_id)
            reports.write_backend(conn, edit(reports.backend_row(conn, backend_id, lock=True), running))
            return reports.backend_row(conn, backend_id)

    def remove_backend(self, backend_id: str, *, force: bool = False) -> reports.Removal:
        """Delete a backend (no future cycle), keeping its history; ``BackendBusy`` while a
        cycle of it holds a live lease, unless ``force`` fences that cycle in the same
        transaction (see ``reports.remove_backend``)."""
        with self.db.transaction() as conn:
            return reports.remove_backend(conn, backend_id, force=force)

    def run_target(self, name: str) -> tuple[str, str | None, bool]:
        """What ``run --backend NAME`` runs, its own mode, whether it is a retired coverage
        (``reports.run_target``)."""
        with self.db.connection() as conn:
            return reports.run_target(conn, name)

    def retired_coverage(self, name: str) -> reports.Coverage:
        """The retired coverage ``name`` names (``reports.retired_coverage``)."""
        with self.db.connection() as conn:
            return reports.retired_coverage(conn, name)

    def forget_coverage(self, name: str) -> reports.Coverage:
        """Drop a retired coverage, with its event, in one transaction (``reports.forget_coverage``)."""
        with self.db.transaction() as conn:
            return reports.forget_coverage(conn, name)

    def add_backend(self, *, backend_id: str, provider: str, account: str, regions: Sequence[str],
                    settings: BackendSettings, mode: str | None = None) -> None:
        """Insert a backend (``ConfigError`` if its id exists); ``settings`` are stored as
        given (unset keys left out)."""
        with self.db.connection() as conn:
            reports.add_backend(conn, backend_id=backend_id, provider=provider, account=account,
                                regions=regions, settings=settings.model_dump(mode="json", exclude_unset=True),
                                mode=mode)

    def keep_ref(self, backend_id: str, ref: str, reason: str | None, seconds: int | None) -> keeps.KeepRow:
        """The operator keeps ``ref`` (SAFETY.md rule 23), with its ``orphan_kept`` event, in one
        transaction (``keeps.keep``)."""
        with self.db.transaction() as conn:
            return keeps.keep(conn, backend_id, ref, reason, seconds)

    def release_ref(self, backend_id: str, ref: str) -> keeps.KeepRow:
        """The operator ends a keep, with its ``orphan_released`` event (``keeps.release``)."""
        with self.db.transaction() as conn:
            return keeps.release(conn, backend_id, ref)

    def status(self, backend_id: str | None = None) -> list[reports.BackendStatus]:
        """Every backend's status (or one's), with the cycle holding its live lease."""
        with self.db.connection() as conn:
            return reports.status_rows(conn, backend_id)

    def stuck_pending(self, older_than_seconds: int, backend_id: str | None = None) -> list[reports.StuckPending]:
        """Pending owners older than that whose resources the latest finished cycle skipped."""
        with self.db.connection() as conn:
            return reports.stuck_pending(conn, older_than_seconds, backend_id)

    def open_orphans(self, backend_id: str | None = None) -> list[watch.OpenOrphan]:
        """The open orphans across cycles, with their listed resources and the backend's prices."""
        with self.db.connection() as conn:
            return watch.open_orphans(conn, backend_id)

    def events(self, since_seconds: int, backend_id: str | None = None) -> list[watch.Event]:
        """The ``events`` rows of the last ``since_seconds``, oldest first."""
        with self.db.connection() as conn:
            return watch.events(conn, since_seconds, backend_id)

    def leak_report(self, since_seconds: int, backend_id: str | None = None, *,
                    per_day: bool = False) -> tuple[leaks.LeakFigures, list[leaks.Hours]]:
        """The last ``since_seconds``' figures of the orphans (C3 ``report``) and, with
        ``per_day``, their hours per UTC day; the period ends at the database clock."""
        with self.db.connection() as conn:
            since, until = leaks.period(conn, since_seconds)
            figures = leaks.figures(conn, since, until, backend_id)
            return figures, leaks.days(conn, since, until, backend_id) if per_day else []

    def staleness(self, global_mode: str) -> list[watch.Staleness]:
        """Each enabled, enrolled backend's time since its last clean cycle, the stalest first."""
        with self.db.connection() as conn:
            return watch.staleness(conn, global_mode)

    def digest_facts(self, cycle_id: str) -> DigestFacts | None:
        """What a finished cycle found, deleted and failed to delete (its digest's facts)."""
        with self.db.connection() as conn:
            return digest_facts.digest_facts(conn, cycle_id)

    def record_notification(self, backend_id: str, cycle_id: str, *, failed: dict[str, str],
                            sent: list[str]) -> None:
        """The digest's events: ``notify_failed`` per failed channel, else ``digest_sent``."""
        with self.db.transaction() as conn:
            digest_facts.record_notification(conn, backend_id, cycle_id, failed=failed, sent=sent)

    def cycle_report(self, cycle_id: str, *, groups: bool = True) -> CycleReport:
        """The C3 report; ``groups=False``: its header only (stream the groups with ``report_groups``)."""
        with self.db.connection() as conn:
            return reports.cycle_report(conn, cycle_id, with_groups=groups)

    def marked_groups(self, cycle_id: str) -> list[tuple[ResourceGroup, str, datetime]]:
        """The groups the cycle marked (SAFETY.md rule 23): each with its reason and delete_after."""
        with self.db.connection() as conn:
            return reports.marked_groups(conn, cycle_id)

    def report_groups(self, cycle_id: str, page: int = REPORT_PAGE) -> Iterator[dict[str, Any]]:
        """The groups of the cycle's C3 report, as C3 dicts in report order, ``page`` at a
        time through a server-side cursor (one read-only transaction): memory stays flat
        whatever the cycle's size. Same order and values as ``cycle_report``'s groups."""
        with self.db.transaction() as conn:
            conn.run("SET TRANSACTION READ ONLY")
            conn.run(f"DECLARE oc_report NO SCROLL CURSOR FOR {reports.GROUP_ROWS_SQL}", c=cycle_id)
            while rows := conn.run(f"FETCH {int(page)} FROM oc_report"):
                for (doc,) in rows:
                    g = json.loads(doc)
                    yield {"provider_ref": g["provider_ref"], "region": g["region"], "primary_id": g["primary_id"],
                           "resources": g["resources"], "verdict": g["verdict"], "reason": g["reason"],
                           "action": g["action"], **({"detail": g["detail"]} if g.get("detail") else {})}
            conn.run("CLOSE oc_report")

    def backdate_owner(self, owner_id: str, seconds: int, *, provisioned_only: bool = False) -> None:
        with self.db.transaction() as conn:
            reports.backdate_owner(conn, owner_id, seconds, provisioned_only=provisioned_only)
