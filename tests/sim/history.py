"""History: the platform ran for hours before the cleanup was deployed (a mixin of ``Platform``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orphan_cleanup.core.listing import ResourceKind, ResourceState
from tests.sim.db import set_sim_now
from tests.sim.owners import PROTECT, TAG, Attempt, Owner


class History:
    def history(self, n: int, stories: tuple[str, ...] = ("live", "live", "live", "leaked_attempt", "copied",
                                                              "gave_up", "placeholder", "left_volume",
                                                              "protected_leak")) -> None:
        """``n`` owners whose lives ended or settled hours before the run starts:
        live ones (some with a leaked earlier attempt, some copied by a user),
        terminations that gave up, failed placeholders hard-deleted after their
        VM was created, terminations that left a volume behind."""
        cloud, rng = self.sim.cloud, self.rng
        for _ in range(n):
            t0 = self.sim.clock() - timedelta(seconds=rng.randint(3600, 48 * 3600))
            story = rng.choice(stories)
            o = Owner(id=f"inst-{len(self.owners) + 1:03d}", ref=self.new_ref(), since=0, committed="pending",
                      phase="live")
            self.owners.append(o)
            self.by_ref[o.ref] = o
            region = rng.choice(self.regions)
            writes: list[tuple[str, dict[str, Any]]] = [
                ("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
                 " VALUES (:r, 'instance', :o, :n, :t)", dict(r=o.ref, o=o.id, n=f"job-{o.id}", t=t0)),
                ("INSERT INTO instances (id, name, provider_ref, status, created_at)"
                 " VALUES (:o, :n, :r, 'pending', :t)", dict(r=o.ref, o=o.id, n=f"job-{o.id}", t=t0))]

            def vm(at: datetime, attempt: int, tags: dict[str, str] | None = None, volume: bool = True, *,
                   o: Owner = o, region: str = region) -> str:
                meta = dict(origin="platform", owner_id=o.id, attempt=attempt, visible_at=at)
                rid = cloud.add(ResourceKind.INSTANCE, region, tags or {TAG: o.ref}, now=at, meta=self._meta(**meta))
                if volume:
                    cloud.add(ResourceKind.VOLUME, region, {TAG: o.ref}, now=at, meta=self._meta(**meta),
                              attached_to=rid)
                o.attempts.append(Attempt(attempt, region, rid))
                return rid

            if story == "leaked_attempt":
                vm(t0 + timedelta(seconds=5), 0)  # error after create; the retry below succeeded
            if story == "placeholder":
                vm(t0 + timedelta(seconds=10), 0)
                writes.append(("DELETE FROM instances WHERE id = :i", dict(i=o.id)))
                o.committed, o.phase = "gone", "done"
            else:
                tp = t0 + timedelta(seconds=30)
                primary = vm(t0 + timedelta(seconds=10), len(o.attempts),
                             {TAG: o.ref, PROTECT: "yes"} if story == "protected_leak" else None)
                o.tracked, o.provisioned_at, o.committed, o.backend = len(o.attempts) - 1, tp, "idle", self.backend_id
                writes.append(("UPDATE instances SET status = 'idle', backend_id = :b, primary_id = :p,"
                               " region = :g, provisioned_at = :t WHERE id = :i",
                               dict(b=self.backend_id, p=primary, g=region, t=tp, i=o.id)))
                if story == "copied":
                    cloud.add(ResourceKind.INSTANCE, region, {TAG: o.ref}, now=tp + timedelta(seconds=1800),
                              meta=self._meta(origin="copy", owner_id=o.id, attempt=None, visible_at=tp))
                if story in ("gave_up", "left_volume", "protected_leak"):
                    tt = tp + timedelta(seconds=rng.randint(600, 3000))
                    if story == "left_volume":
                        cloud.resources[primary].state = ResourceState.TERMINATED
                        cloud.meta[primary].terminated_at = tt
                        for r in cloud.resources.values():
                            if r.attached_to == primary:
                                r.attached_to, r.state = None, ResourceState.AVAILABLE
                    writes.append(("UPDATE instances SET status = 'terminated', terminated_at = :t WHERE id = :i",
                                   dict(t=tt, i=o.id)))
                    o.committed, o.phase = "terminated", "terminated"
            conn = self.pool.acquire()
            conn.run("BEGIN")
            set_sim_now(conn, t0)
            for sql, params in writes:
                conn.run(sql, **params)
            conn.run("COMMIT")
            conn.close()
        self.sim.trace(f"history: {n} owners, {len(cloud.resources)} resources")
