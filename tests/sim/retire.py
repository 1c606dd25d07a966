"""The ``retire`` world (SAFETY.md rule 24, "coverage never shrinks silently"): a backend with
owners of its own goes, and what it covered must still be listed (a mixin of ``Simulation``).

In a share of the seeds (``deletion_worlds.SHARES``), every draw from the world's own streams
(``"<seed>:retire"``, ``"<seed>:retire:faults"``), so the other streams draw as before:

- ``sim-r``, a backend in an account of its own (``RETIRE_ACCOUNT``, its own ``SimCloud``) and
  one or two regions, in delete mode or report mode, with owners of its own written by plain
  SQL hours before the run: live ones (some with a leaked earlier attempt beside their primary),
  terminations that gave up (VM up), failed placeholders hard-deleted after their VM came up;
- at a step drawn from the world's stream (at the latest when the settle phase starts) the
  platform leaks a little more there (a termination that gives up, a placeholder
  hard-deleted: written with plain SQL, as the platform writes them), then DELETEs ``sim-r``'s
  row with plain SQL, or moves it to the stranger's account. The trigger leaves a retired
  coverage of the old account and regions (E1 holds it to the prediction); the tick runs it
  under its own id with ``sim-r``'s last settings, report-only unless ``sim-r``'s last mode and
  the stack's ceiling both say delete (E2), and it stays while it finds anything of ``sim-r``
  (its live owners keep it there for good).

L2: by the end of the settle phase every leak of the removed or moved backend's old coverage is
deleted (a coverage that may delete) or reported by the last complete cycle of a report-only
coverage covering it; a coverage never retires while one is left. A live owner naming
``sim-r`` is never touched (S1, X1).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orphan_cleanup.core.listing import ResourceKind
from tests.sim.cloud import SimCloud
from tests.sim.db import set_sim_now
from tests.sim.owners import REF_ALPHABET, TAG, Attempt, Owner
from tests.sim.world import STRANGER_ACCOUNT

if TYPE_CHECKING:
    from tests.sim.engine import Simulation

BACKEND_R = "sim-r"
RETIRE_ACCOUNT = "444455556666"
#: what the history gives ``sim-r``'s owners, and what the platform leaks right before it goes
HISTORY = ("live", "live", "leaked_attempt", "gave_up", "placeholder")
LATE = ("gave_up", "gave_up", "placeholder")


class Retire:
    """The simulation's side of the retire world."""

    def retire_backends(self: Simulation) -> None:
        """Before the rows are written: ``sim-r`` and its cloud."""
        from tests.sim.backends import ALL_REGIONS, BackendSpec

        self.retire_leaks: list[str] = []  # resources the world leaked in sim-r's account (L2)
        self.retire_done = False
        if not self.on("retire"):
            return
        rng = self.worlds["retire"].rng
        regions = tuple(sorted(rng.sample(ALL_REGIONS, rng.randint(1, 2))))
        self.backends[BACKEND_R] = BackendSpec(BACKEND_R, RETIRE_ACCOUNT, regions, rng.choice(("delete", "delete",
                                                                                                "report")))
        self.clouds[RETIRE_ACCOUNT] = SimCloud(RETIRE_ACCOUNT, id_base=0xC0000000)
        self.retire_at = rng.randint(3, max(4, self.steps * 3 // 4))
        self.retire_move = rng.random() < 0.4

    def retire_history(self: Simulation) -> None:
        """``sim-r``'s owners, hours before the run."""
        if not self.on("retire"):
            return
        rng = self.worlds["retire"].rng
        for _ in range(rng.randint(2, 5)):
            self._retire_owner(rng.choice(HISTORY), self.clock() - timedelta(seconds=rng.randint(3600, 24 * 3600)))
        self.trace(f"history: {BACKEND_R} ({RETIRE_ACCOUNT} {list(self.backends[BACKEND_R].regions)},"
                   f" {self.backends[BACKEND_R].mode}) has {len(self.platform.world_owners)} owners,"
                   f" leaks {self.retire_leaks}")

    def _retire_owner(self: Simulation, story: str, t0: datetime) -> None:
        """One owner of ``sim-r`` and its VMs, written at once with plain SQL (C1 columns)."""
        platform, rng = self.platform, self.worlds["retire"].rng
        cloud = self.clouds[RETIRE_ACCOUNT]
        spec = self.spec_of(BACKEND_R)
        assert spec is not None
        while True:
            ref = "".join(rng.choice(REF_ALPHABET) for _ in range(12))
            if ref not in platform.by_ref and ref not in platform.foreign_refs:
                break
        o = Owner(id=f"ret-{len(platform.world_owners) + 1:03d}", ref=ref, committed="pending", phase="done",
                  home=BACKEND_R)
        platform.world_owners.append(o)
        platform.by_ref[ref] = o
        region = rng.choice(spec.regions)
        writes: list[tuple[str, dict[str, Any]]] = [
            ("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
             " VALUES (:r, 'instance', :o, :n, :t)", dict(r=ref, o=o.id, n=f"job-{o.id}", t=t0)),
            ("INSERT INTO instances (id, name, provider_ref, status, created_at)"
             " VALUES (:o, :n, :r, 'pending', :t)", dict(r=ref, o=o.id, n=f"job-{o.id}", t=t0))]

        def vm(at: datetime, leak: bool) -> str:
            meta = dict(origin="platform", owner_id=o.id, attempt=len(o.attempts), visible_at=at)
            rid = cloud.add(ResourceKind.INSTANCE, region, {TAG: ref}, now=at, meta=platform._meta(**meta))
            made = [rid]
            if rng.random() < 0.6:
                made.append(cloud.add(ResourceKind.VOLUME, region, {TAG: ref}, now=at, meta=platform._meta(**meta),
                                      attached_to=rid))
            o.attempts.append(Attempt(len(o.attempts), region, rid))
            if leak:
                self.retire_leaks.extend(made)
            return rid

        if story == "leaked_attempt":
            vm(t0 + timedelta(seconds=5), leak=True)  # an error after creating; the retry below succeeded
        if story == "placeholder":
            vm(t0 + timedelta(seconds=10), leak=True)
            writes.append(("DELETE FROM instances WHERE id = :i", dict(i=o.id)))
            o.committed = "gone"
        else:
            tp = t0 + timedelta(seconds=30)
            primary = vm(t0 + timedelta(seconds=10), leak=story == "gave_up")
            o.tracked, o.provisioned_at, o.committed, o.backend = len(o.attempts) - 1, tp, "idle", BACKEND_R
            writes.append(("UPDATE instances SET status = 'idle', backend_id = :b, primary_id = :p,"
                           " region = :g, provisioned_at = :t WHERE id = :i",
                           dict(b=BACKEND_R, p=primary, g=region, t=tp, i=o.id)))
            if story == "gave_up":  # the termination gave up: the VM is still up
                writes.append(("UPDATE instances SET status = 'terminated', terminated_at = :t WHERE id = :i",
                               dict(t=tp + timedelta(seconds=rng.randint(60, 300)), i=o.id)))
                o.committed = "terminated"
        conn = platform.pool.acquire()
        conn.run("BEGIN")
        set_sim_now(conn, min(self.clock(), t0 + timedelta(seconds=3600)))
        for sql, params in writes:
            conn.run(sql, **params)
        conn.run("COMMIT")
        conn.close()
        platform.commit_times.append((self.clock(), frozenset({BACKEND_R})))

    def retire_step(self: Simulation, *, settling: bool = False) -> None:
        """At its step (at the latest when the settle phase starts): a few more leaks, then
        ``sim-r``'s row deleted or moved to the stranger's account, by plain SQL."""
        if not self.on("retire") or self.retire_done or (self.trace.step < self.retire_at and not settling):
            return
        self.retire_done = True
        rng = self.worlds["retire"].rng
        for _ in range(rng.randint(1, 2)):
            self._retire_owner(rng.choice(LATE), self.clock() - timedelta(seconds=rng.randint(900, 3600)))
        self.trace(f"platform: {BACKEND_R} leaks {self.retire_leaks} before it goes")
        if self.retire_move:
            spec = self.backends[BACKEND_R]
            spec.account = STRANGER_ACCOUNT
            self.edit_backend_row(BACKEND_R, f"account -> {STRANGER_ACCOUNT} (the platform moves it)",
                                  "account = :a", a=STRANGER_ACCOUNT)
        else:
            self.remove_backend_row(BACKEND_R, "removed by the platform")

    # ---- L2 --------------------------------------------------------------------------

    def retire_liveness(self: Simulation) -> bool:
        """L2 (rule 24): every leak the world left in ``sim-r``'s old coverage is deleted, or,
        where only report-only coverages cover it, reported by the last complete cycle of one
        of them; where a coverage was left for it, it never retired while the leak remained.
        A leak the removal left no coverage for (``sim-r`` was off) is nobody's."""
        if not self.on("retire"):
            return True
        self.checker.checks["L2"] += 1
        known = frozenset(r[0] for r in self.admin.run(
            "SELECT o.resource_id FROM orphan_resources o JOIN coverages() b ON b.id = o.backend_id"
            " WHERE b.account = :a", a=RETIRE_ACCOUNT))
        for rid in self.retire_leaks:
            if not self.platform.is_orphan(rid, known=known):
                continue
            region = self.world.resources[rid].region
            if any(b.account == RETIRE_ACCOUNT and region in b.row_regions for b in self.backends.values()):
                continue  # a backend row covers it: L1's
            ever = [c for c in self.coverages.values() if c.account == RETIRE_ACCOUNT and region in c.regions]
            live = [c for c in ever if not c.gone and self.coverage_mode(c) != "off"]
            if not live and any(not c.gone for c in ever):
                continue  # only coverages its backend's mode turned off cover it: shown, not listed
            if deleting := [c.id for c in live if self.coverage_may_delete(c, self.checker.ceiling)]:
                self.checker.fail("L2", f"leak {rid} of {BACKEND_R} in {RETIRE_ACCOUNT} {region} still exists, though"
                                        f" retired coverage(s) {deleting} may delete (last mode delete, ceiling"
                                        " delete):\n" + self._explain(rid))
                return False
            if live:
                if not any(rid in (self.last_complete_orphans(c.id) or set()) for c in live):
                    self.checker.fail("L2", f"leak {rid} of {BACKEND_R} in {RETIRE_ACCOUNT} {region} was not reported"
                                            f" by the last complete cycle of report-only retired coverage(s)"
                                            f" {[c.id for c in live]}:\n" + self._explain(rid))
                    return False
            elif ever:
                self.checker.fail("L2", f"leak {rid} of {BACKEND_R} in {RETIRE_ACCOUNT} {region} still exists, but"
                                        f" the retired coverage(s) {[c.id for c in ever]} that should cover it"
                                        " retired (or never were):\n"
                                        + self._explain(rid))
                return False
        return True

    def retire_l1_exempt(self: Simulation, rid: str) -> bool:
        """An orphan in ``sim-r``'s old account that no backend row covers is L2's, not L1's."""
        if not self.on("retire") or self.world.of(rid).account != RETIRE_ACCOUNT:
            return False
        region = self.world.resources[rid].region
        return not any(b.account == RETIRE_ACCOUNT and region in b.row_regions for b in self.backends.values())
