"""The ``volumes`` world (README, C1: volume owners): the platform also provisions standalone
volumes through the ledger, a ``volumes`` row per volume owner (a mixin of ``Platform``).

Every draw comes from the world's own streams (``"<seed>:volumes"`` for its choices,
``"<seed>:volumes:faults"`` for its dice, deletion_worlds.py), and the world acts from
``Worlds.world_operators`` (once a step, before the step's own action) and, in the settle
phase, before the platform's own step: a seed without the world runs as it did.

Protocol per volume owner (plain SQL on the C1 columns, timestamps from the simulated clock):

    issue ref (owner_type volume) + pending volumes row
      └ create the volume tagged with the ref ── timed out after it came up: a lost
           │                                     attempt; retried with a second volume
           │                                  ── crash before recording: pending, the
           │                                     volume exists (recovered later: the
           │                                     placeholder hard-deleted, or deleted)
           └ record provisioning (primary_id = the volume) └ active
                └ deleting └ delete the volume (or leave it behind) └ deleted
    a create that never succeeds gives up: the placeholder row is hard-deleted (its ref stays).

People attach a volume owner's volume to an instance of theirs (``user_attach_owner_volume``):
it is in use and must never be deleted (U1; the classifier skips it ``in_use``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from orphan_cleanup.core.listing import ResourceKind, ResourceState
from tests.sim.cloud import ResMeta, SimCloud
from tests.sim.db import set_sim_now
from tests.sim.owners import LISTING_LAG_MAX, REF_ALPHABET, TAG, VOLUME_LIVE, Attempt, Owner

if TYPE_CHECKING:
    from tests.sim.platform import Platform

MAX_VOLUME_OWNERS = 6
#: phases in which a volume owner is in flight (the settle phase drives them to an end)
VOLUME_IN_FLIGHT = ("issued", "created", "provisioned", "deleting", "crashed_pending", "failed")


class VolumePeople:
    """The platform's volume owners and the people who borrow their volumes."""

    def _vcloud(self: Platform, o: Owner) -> SimCloud:
        return self.sim.clouds[self.sim.backends[o.home].account]

    def volume_in_flight(self: Platform) -> bool:
        return any(o.phase in VOLUME_IN_FLIGHT for o in self.vol_owners)

    def _vwrite(self: Platform, o: Owner, label: str, sql: str, on_commit: Callable[[], None], /,
                **params: object) -> None:
        """One ledger write of a volume owner, committed at once (no commit lag: the platform's
        lag draws from the platform's stream)."""
        conn = self.pool.acquire()
        conn.run("BEGIN")
        set_sim_now(conn, self.sim.clock())
        for statement in sql.split(";\n"):
            conn.run(statement, **{k: v for k, v in params.items() if f":{k}" in statement})
        self._commit(conn, on_commit, self._concerns(o))
        self.sim.trace(f"platform: volume owner {o.id} {label}")

    # ---- one action a step ----------------------------------------------------------

    def volume_step(self: Platform, *, settling: bool = False) -> bool:
        """One action of the volume owners (the world's dice decide whether one happens during
        the run; in the settle phase an in-flight owner is always moved on)."""
        rng, dice = self.sim.worlds["volumes"].rng, self.sim.worlds["volumes"].dice
        if not settling:
            if dice.roll("user_attach_owner_volume"):
                self.attach_owner_volume()
            if not dice.roll("volume_owner_action"):
                return False
        acts: list[tuple[float, Callable[[], None]]] = []
        if not settling and sum(1 for o in self.vol_owners if o.phase not in ("done", "deleted")) < MAX_VOLUME_OWNERS:
            acts.append((2.0, self.new_volume_owner))
        for o in self.vol_owners:
            if o.phase == "issued":
                acts.append((1.0, (lambda o=o: self.create_volume(o)) if not settling
                             else (lambda o=o: self.hard_delete_volume(o))))
            elif o.phase == "created":
                acts.append((1.5, lambda o=o: self.provision_volume(o)))
            elif o.phase == "provisioned":
                acts.append((1.5, lambda o=o: self.activate_volume(o)))
            elif o.phase == "live" and not settling:
                acts.append((0.4, lambda o=o: self.start_volume_deletion(o)))
            elif o.phase == "deleting":
                acts.append((1.0, lambda o=o: self.finish_volume_deletion(o)))
            elif o.phase == "crashed_pending" and (settling or self.sim.trace.step >= o.since + o.recover_after):
                acts.append((1.0, lambda o=o: self.recover_volume(o)))
            elif o.phase == "failed":
                acts.append((1.0, lambda o=o: self.hard_delete_volume(o)))
        if not acts:
            return False
        pick = rng.uniform(0, sum(weight for weight, _ in acts))
        for weight, act in acts:
            pick -= weight
            if pick <= 0:
                act()
                return True
        acts[-1][1]()
        return True

    # ---- the volume owner's life -----------------------------------------------------

    def new_volume_owner(self: Platform) -> None:
        rng = self.sim.worlds["volumes"].rng
        while True:
            ref = "".join(rng.choice(REF_ALPHABET) for _ in range(12))
            if ref not in self.by_ref and ref not in self.foreign_refs:
                break
        o = Owner(id=f"vol-owner-{len(self.vol_owners) + 1:03d}", ref=ref, since=self.sim.trace.step,
                  recover_after=rng.randint(3, 15), kind="volume")
        homes = self.sim.home_backends
        o.home = homes[0] if len(homes) == 1 else rng.choice(homes)
        self.vol_owners.append(o)
        self.by_ref[o.ref] = o
        t = self.sim.clock()

        def committed() -> None:
            o.committed, o.since, o.phase = "pending", self.sim.trace.step, "issued"

        self._vwrite(o, f"issue volume ref {o.ref}",
                     "INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
                     " VALUES (:r, 'volume', :o, :n, :t);\n"
                     "INSERT INTO volumes (id, name, provider_ref, status, created_at)"
                     " VALUES (:o, :n, :r, 'pending', :t)", committed, r=o.ref, o=o.id, n=f"data-{o.id}", t=t)

    def create_volume(self: Platform, o: Owner) -> None:
        w = self.sim.worlds["volumes"]
        rng, dice = w.rng, w.dice
        att = Attempt(len(o.attempts), rng.choice(self.sim.backends[o.home].regions))
        o.attempts.append(att)
        now = self.sim.clock()
        timed_out = dice.roll("volume_create_timeout")
        lag = rng.randint(20, LISTING_LAG_MAX) if timed_out else rng.randint(0, LISTING_LAG_MAX)
        meta = ResMeta(origin="platform", owner_id=o.id, attempt=att.n, visible_at=now + timedelta(seconds=lag),
                       ghost_for=rng.choice((0, 0, 30)))
        att.vm = self._vcloud(o).add(ResourceKind.VOLUME, att.region, {TAG: o.ref}, now=now, meta=meta)
        if timed_out:  # the create timed out after the volume came up: a lost attempt
            o.phase = "issued" if len(o.attempts) < 3 else "failed"
            self.sim.trace(f"platform: volume owner {o.id} create #{att.n} timed out after {att.vm} came up"
                           f" (a lost attempt) -> {o.phase}")
            return
        if dice.roll("volume_crash_after_create"):
            o.phase, o.since = "crashed_pending", self.sim.trace.step
            self.sim.trace(f"platform: volume owner {o.id} created {att.vm} in {att.region}, crashed before"
                           " recording it")
            return
        o.phase = "created"
        self.sim.trace(f"platform: volume owner {o.id} created {att.vm} in {att.region}")

    def provision_volume(self: Platform, o: Owner) -> None:
        att, t = o.attempts[-1], self.sim.clock()

        def committed() -> None:
            o.committed, o.tracked, o.provisioned_at, o.phase, o.backend = "provisioning", att.n, t, "provisioned", \
                o.home

        self._vwrite(o, f"provisioning backend={o.home} primary={att.vm}",
                     "UPDATE volumes SET status = 'provisioning', backend_id = :b, primary_id = :p, region = :g,"
                     " provisioned_at = :t WHERE id = :i", committed, b=o.home, p=att.vm, g=att.region, t=t, i=o.id)

    def activate_volume(self: Platform, o: Owner) -> None:
        def committed() -> None:
            o.committed, o.phase = "active", "live"

        self._vwrite(o, "-> active", "UPDATE volumes SET status = 'active' WHERE id = :i", committed, i=o.id)

    def start_volume_deletion(self: Platform, o: Owner) -> None:
        def committed() -> None:
            o.committed, o.phase, o.since = "deleting", "deleting", self.sim.trace.step

        self._vwrite(o, "-> deleting", "UPDATE volumes SET status = 'deleting' WHERE id = :i", committed, i=o.id)

    def finish_volume_deletion(self: Platform, o: Owner) -> None:
        """Delete the volume at the provider (refused while someone's instance holds it; or left
        behind), then mark the owner deleted."""
        w = self.sim.worlds["volumes"]
        cloud = self._vcloud(o)
        vol = cloud.resources.get(o.vm_of(o.tracked) or "")
        what = "nothing to delete"
        if vol is not None and vol.state is not ResourceState.TERMINATED:
            if vol.attached_to is not None and cloud.exists(vol.attached_to):
                what = f"delete of {vol.id} refused (in use by {vol.attached_to}): gave up"
            elif w.dice.roll("volume_left_behind"):
                what = f"left {vol.id} behind"
            else:
                cloud.detach(vol.id)
                vol.state = ResourceState.TERMINATED
                what = f"deleted {vol.id}"
        t = self.sim.clock()

        def committed() -> None:
            o.committed, o.phase = "deleted", "deleted"

        self._vwrite(o, f"{what} -> deleted", "UPDATE volumes SET status = 'deleted', deleted_at = :t WHERE id = :i",
                     committed, t=t, i=o.id)

    def recover_volume(self: Platform, o: Owner) -> None:
        """A crashed owner recovered: its placeholder hard-deleted, or marked deleted."""
        if self.sim.worlds["volumes"].rng.random() < 0.6:
            self.hard_delete_volume(o)
            return
        t = self.sim.clock()

        def committed() -> None:
            o.committed, o.phase = "deleted", "deleted"

        self._vwrite(o, "recovered after crash -> deleted",
                     "UPDATE volumes SET status = 'deleted', deleted_at = :t WHERE id = :i", committed, t=t, i=o.id)

    def hard_delete_volume(self: Platform, o: Owner) -> None:
        def committed() -> None:
            o.committed, o.phase = "gone", "done"

        self._vwrite(o, f"hard-delete placeholder (ref {o.ref} stays)", "DELETE FROM volumes WHERE id = :i",
                     committed, i=o.id)

    # ---- people ------------------------------------------------------------------------

    def attach_owner_volume(self: Platform) -> None:
        """A user attaches a volume owner's volume (its recorded one, a lost attempt, a
        leftover) to an instance of theirs: in use, never deleted."""
        rng = self.sim.worlds["volumes"].rng
        refs = {o.ref for o in self.vol_owners}
        world = self.sim.world
        cands = sorted(rid for rid, r in world.resources.items() if r.kind is ResourceKind.VOLUME
                       and r.state is ResourceState.AVAILABLE and r.attached_to is None and r.tags.get(TAG) in refs)
        vid = self._in_flight_first(cands, rng)
        if vid is None:
            return
        cloud = world.of(vid)
        r, now = cloud.resources[vid], self.sim.clock()
        hosts = sorted(h.id for h in cloud.resources.values() if h.kind is ResourceKind.INSTANCE
                       and h.state is ResourceState.ACTIVE and h.region == r.region and h.tags == {"Name": "borrower"})
        host = hosts[0] if hosts else cloud.add(
            ResourceKind.INSTANCE, r.region, {"Name": "borrower"}, now=now,
            meta=ResMeta(origin="foreign", owner_id=None, attempt=None, visible_at=now))
        cloud.attach(vid, host, device="/dev/sdg", at=now)
        self.sim.trace(f"user: attached volume owner's {vid} to {host}, an instance of theirs")


def volume_live(o: Owner) -> bool:
    return o.kind == "volume" and o.committed in VOLUME_LIVE and not o.soft_deleted
