"""The settle phase (a mixin of ``Simulation``): the faults stop, the platform
drives its in-flight owners to final states at its own pace, and the cleanup
must converge (L1)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from tests.sim.owners import LISTING_LAG_MAX
from tests.sim.world import DEADLINE, EPOCH, INTERVAL, MARGIN, SETTLE_INTERVAL, SETTLE_RUNS


class Settle:
    def settle(self) -> str:
        self.dice.enabled = self.rule14_dice.enabled = False
        self.settle_worlds()
        self.platform.quiesce()
        self.trace("settle: faults stop, the platform finishes its in-flight work")
        self.restore_backends()  # rows back to their configuration, every backend in the final mode
        quiet_at: datetime | None = None
        settled_at: datetime | None = None
        # every backend, and every retired coverage while it is there (rule 24: one that retires
        # itself is no longer waited for)
        runs_after = {b: 0 for b in self.run_ids()}
        needed = {b: self.settle_runs(b) for b in runs_after}
        for _ in range(400):
            self.trace.step += 1
            self.platform.flush()
            self.clock.advance(SETTLE_INTERVAL)
            for cloud in self.clouds.values():
                cloud.tick(self.clock())
            if quiet_at is None:
                if self.platform.in_flight():
                    if self.rng_sched.random() < 0.35:  # the platform finishes at its own pace
                        self.platform.step()
                else:
                    quiet_at = self.clock()
                    settled_at = quiet_at + timedelta(seconds=max(DEADLINE, MARGIN + LISTING_LAG_MAX + 120))
                    self.trace("settle: the platform is quiet")
            reasons = self._scheduled_round()
            if self.checker.violations:
                return "violation"
            for bid, reason in reasons.items():
                if bid not in runs_after:  # a retired coverage left by the settle phase's own edits
                    runs_after[bid], needed[bid] = 0, self.settle_runs(bid)
                if settled_at is not None and self.clock() >= settled_at and reason not in ("not_due", "busy"):
                    runs_after[bid] += 1  # a run that listed, or that STEP 1 decided not to list
            if all(n >= needed[b] for b, n in runs_after.items() if not self.gone(b)):
                outcome = self._liveness()
                self.look_at_protections()
                return "violation" if self.checker.violations else outcome
            if all(r == "not_due" for r in reasons.values()):
                self._wait_until_due()
        self.checker.fail("L1", "the platform never became quiet")
        return "violation"

    def look_at_protections(self) -> None:
        """After the run (L1 judged): an operator runs one manual report cycle of each backend a
        delete of which met a termination protection, to look at it. Rule 14: it still says
        protected (P2 judges every report cycle listed after such a find)."""
        for bid in sorted({b for b, _pid in self.checker.protection_found if b in self.backends}):
            def work(bid: str = bid) -> None:
                self.listing_record = None
                try:
                    summary = self.pipeline.run_lister(bid, manual=True, mode="report")
                    self.trace(f"operator: a manual report run of {bid} to look at its protections:"
                               f" {summary.reason} cycle={str(summary.cycle_id)[:8]}")
                except Exception as exc:  # noqa: BLE001 - as a scheduled run's crash
                    self._crash("lister", exc, (bid,))

            self._checked(work)
            self.drain()

    def settle_runs(self, backend_id: str) -> int:
        """The scheduled runs of a backend L1 waits for once the platform is quiet: SETTLE_RUNS,
        and twice the runs its confirmation window spans (rule 23): a group is deleted a window
        after the listing that last found it so with the same members, and deleting an instance
        regroups what it leaves behind (its volumes, a leftover group of new members) once."""
        return SETTLE_RUNS + 2 * math.ceil(self.checker.confirm_window(backend_id) / INTERVAL)

    def _scheduled_round(self) -> dict[str, str | None]:
        """One firing of the scheduler, everything it queued drained: the tick (this
        seed's share of rounds) or each backend's lister invoked directly. Returns why
        each backend's run listed or not."""
        if self.rng_tick.random() < self.tick_share:
            self.job_reasons = {}
            tick = self.tick()
            self.drain()
            skipped = tick.skipped if tick is not None else {}
            return {bid: skipped.get(bid, self.job_reasons.get(bid)) for bid in self.run_ids()}
        reasons = {}
        for bid in sorted(self.backends):  # a retired coverage has no schedule of its own: the tick runs it
            summary = self.lister(bid)
            reasons[bid] = summary.reason if summary is not None else None
            self.drain()
        return reasons

    def _wait_until_due(self) -> None:
        """The scheduler fires every interval; skip the ticks before the backend is due."""
        due = self.admin.run("SELECT min(next_due_at) FROM cleanup")[0][0]
        if due is None:
            return
        wait = int((due - self.clock()).total_seconds()) - SETTLE_INTERVAL
        if wait > 0:
            self.platform.flush(everything=True)
            self.clock.advance(wait)

    def drain(self, limit: int = 500) -> None:
        for _ in range(limit):
            if self.jobs_q.ready():
                self.deliver_job()
            elif self.listing_q.ready():
                self.deliver_batch()
            elif self.delete_q.ready():
                self.deliver_delete()
            else:
                return

    def _explain(self, rid: str) -> str:
        """One orphan as the simulation and the product see it."""
        r, m = self.world.resources[rid], self.world.meta.get(rid)
        owner = self.platform.by_ref.get(r.tags.get("provider_ref", ""))
        provisioned = (int((owner.provisioned_at - EPOCH).total_seconds())
                       if owner is not None and owner.provisioned_at else None)
        who = (f"owner {owner.id} committed={owner.committed} tracked_attempt={owner.tracked}"
               f" provisioned_at=+{provisioned}s" if owner else "no owner")
        verdicts = self.admin.run(
            "SELECT g.verdict, g.reason, g.action, c.outcome FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id"
            " WHERE g.resources::text LIKE :p ORDER BY c.started_at DESC LIMIT 1", p=f'%"{rid}"%')
        recorded = sorted(row[0] for row in self.admin.run(
            "SELECT backend_id FROM orphan_resources WHERE resource_id = :r", r=rid))
        return (f"  {rid} {r.kind.value} account={self.world.of(rid).account} {r.state.value}"
                f" region={r.region} tags={r.tags}"
                f" created=+{int((r.created_at - EPOCH).total_seconds())}s attached_to={r.attached_to}"
                f" origin={m.origin if m else None} attempt={m.attempt if m else None}; {who}"
                f" backend={owner.backend if owner else None};"
                f" last product verdict: {verdicts[0] if verdicts else 'never recorded'};"
                f" an orphan's leftover to {recorded or 'no backend'}")

    def last_complete_orphans(self, bid: str) -> set[str] | None:
        """The resources of the orphan groups of ``bid``'s last cycle that listed everything
        (clean, or unsettled by a group it skipped: a leaked attempt in another region than its
        recorded primary stays skipped; or by a group too large for any message, which fails its
        region for good: rule 20, O1), or None if it has none."""
        rows = self.admin.run("SELECT listed_at, id FROM cycles WHERE outcome IN ('clean', 'unsettled')"
                              " AND backend_id = :b AND tripped_regions = '{}' AND NOT EXISTS (SELECT 1 FROM"
                              " jsonb_array_elements(failures) f WHERE f->>'error' NOT LIKE 'group % is too"
                              " large for one message%') ORDER BY listed_at DESC LIMIT 1", b=bid)
        if not rows:
            return None
        return {r["id"] for (res,) in self.admin.run(
            "SELECT resources FROM cycle_groups WHERE cycle_id = :c AND verdict = 'orphan'", c=rows[0][1])
            for r in (res if isinstance(res, list) else [])}

    def _liveness(self) -> str:
        self.checker.checks["L1"] += 1
        known = frozenset(r[0] for r in self.admin.run("SELECT resource_id FROM orphan_resources"))
        if not self.retire_liveness():  # L2: what a removed or moved backend left (retire.py)
            return "violation"
        orphans = [rid for rid in self.world.resources if self.platform.is_orphan(rid, known=known)
                   and not self.retire_l1_exempt(rid)]
        if self.final_mode == "delete":
            if not orphans:
                return "converged"
            last = self.admin.run("SELECT DISTINCT ON (backend_id) blocked_reason FROM cycles"
                                  " WHERE outcome IS NOT NULL ORDER BY backend_id, fence DESC")
            if any(row[0] for row in last):
                return "blocked"
            runs = max(self.settle_runs(b) for b in self.backends)
            self.checker.fail("L1", f"{len(orphans)} orphan(s) still exist {runs} runs after settling:\n"
                                    + "\n".join(self._explain(rid) for rid in orphans[:5]))
            return "violation"
        # Report mode: each backend's last complete cycle reports the orphans in its account and regions.
        for bid, spec in sorted(self.backends.items()):
            # A detached leftover of a live owner is an orphan to a backend once the deletion of
            # a backend of its account recorded it (``orphan_resources``, read by account: rule 10).
            known_here = frozenset(r[0] for r in self.admin.run(
                "SELECT o.resource_id FROM orphan_resources o JOIN coverages() b ON b.id = o.backend_id"
                " WHERE b.account = :a", a=spec.account))
            mine = [rid for rid in orphans if self.world.of(rid).account == spec.account
                    and self.world.resources[rid].region in spec.regions
                    and self.platform.is_orphan(rid, known=known_here)]
            # The last cycle that listed everything (``last_complete_orphans``).
            seen = self.last_complete_orphans(bid)
            if seen is None:
                if mine:
                    self.checker.fail("L1", f"report mode: no cycle of {bid} listed everything after the platform"
                                            " went quiet")
                    return "violation"
                continue
            missing = [rid for rid in mine if rid not in seen]
            if missing:
                self.checker.fail("L1", f"report mode: orphans not reported by the last complete cycle of {bid}:"
                                        f" {missing[:8]}")
                return "violation"
        return "reported"
