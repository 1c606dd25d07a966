"""The simulated platform: it follows the ledger protocol and crashes at every
point of it, and the people around it copy, protect and re-tag resources.

Protocol per owner (plain SQL, C1 columns only, timestamps from the simulated
clock; each write may commit a step or two later, i.e. with commit lag):

    issue ref + pending owner ── crash: owner pending, no resources
      └ create at the provider ── error, nothing created: retry or give up
           │                    ── error after creating (seed 002): the VM exists,
           │                       listed late; the platform retries or gives up
           │                    ── crash: owner pending, resources exist
           └ record provisioning data ── live (idle/busy)
                └ terminating ── crash: owner terminating, VM up
                     └ terminate at the provider ── gave up: VM still up
                          └ terminated ── maybe soft-deleted
    crashed/failed owners are recovered later: a failed placeholder is
    hard-deleted (its ref stays), a crashed one may be marked terminated.

The platform also answers the invariants' questions: which resources must
never be touched (S1-S3), and which are orphans (L1).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orphan_cleanup.core.listing import ResourceKind, ResourceState
from tests.sim.cloud import ResMeta
from tests.sim.db import ConnectionPool, PooledConnection, set_sim_now
from tests.sim.deletion_worlds import WorldPeople
from tests.sim.history import History
from tests.sim.oracle import Oracle
from tests.sim.owners import (
    LISTING_LAG_MAX,
    LIVE,
    MAX_ACTIVE_OWNERS,
    RECOVERY_AFTER_STEPS,
    REF_ALPHABET,
    TAG,
    Attempt,
    OpenTx,
    Owner,
)
from tests.sim.people import People
from tests.sim.protections import Protections
from tests.sim.volume_owners import VolumePeople
from tests.sim.world import BACKEND_FO, UNKNOWN_BACKEND

if TYPE_CHECKING:
    from tests.sim.engine import Simulation

class Platform(History, People, Protections, WorldPeople, VolumePeople, Oracle):
    def __init__(self, sim: Simulation, pool: ConnectionPool, backend_id: str, regions: tuple[str, ...]) -> None:
        self.sim = sim
        self.pool = pool
        self.backend_id = backend_id
        self.regions = regions
        self.rng = sim.rng_platform
        self.owners: list[Owner] = []
        self.vol_owners: list[Owner] = []  # the volumes world's volume owners (volume_owners.py)
        self.world_owners: list[Owner] = []  # the retire world's owners (deletion_worlds.py): no actions
        self.by_ref: dict[str, Owner] = {}
        self.foreign_refs: set[str] = set()
        self.commit_times: list[tuple[datetime, frozenset[str] | None]] = []
        self.quiescing = False
        self.idle = False  # an idle spell: only recoveries happen
        self.mass_terminated = False

    # ---- ledger writes -----------------------------------------------------

    @staticmethod
    def _concerns(o: Owner, new: str | None = None) -> frozenset[str] | None:
        """The backends a write of ``o``'s row is activity for (the product's triggers log
        the old backend_id and a new one; a null backend_id is activity for every backend)."""
        return None if o.backend is None else frozenset({o.backend} | ({new} if new else set()))

    def _write(self, owner: Owner | None, label: str, statements: list[tuple[str, dict[str, Any]]],
               on_commit: Callable[[], None], concerns: frozenset[str] | None | str = "owner") -> None:
        if concerns == "owner":
            concerns = self._concerns(owner) if owner is not None else None
        conn = self.pool.acquire()
        conn.run("BEGIN")
        set_sim_now(conn, self.sim.clock())
        for sql, params in statements:
            conn.run(sql, **params)
        if owner is not None and self.sim.behaviour.roll("commit_lag"):
            steps = self.rng.randint(1, 2)
            owner.tx = OpenTx(conn, self.sim.trace.step + steps, on_commit, label, concerns)  # type: ignore[arg-type]
            self.sim.trace(f"platform: {label} (commits in {steps} steps)")
            return
        self._commit(conn, on_commit, concerns)  # type: ignore[arg-type]
        self.sim.trace(f"platform: {label}")

    def _commit(self, conn: PooledConnection, on_commit: Callable[[], None],
                concerns: frozenset[str] | None) -> None:
        conn.run("COMMIT")
        conn.close()
        self.commit_times.append((self.sim.clock(), concerns))
        on_commit()

    def flush(self, *, everything: bool = False) -> None:
        """Commit the open transactions that are due (or all of them)."""
        for o in self.owners:
            if o.tx is not None and (everything or o.tx.commit_step <= self.sim.trace.step):
                tx, o.tx = o.tx, None
                self._commit(tx.conn, tx.on_commit, tx.concerns)
                self.sim.trace(f"platform: commit of `{tx.label}`")

    def _status(self, o: Owner, status: str, label: str, extra: str = "", **params: Any) -> Callable[..., None]:
        def write(on_commit: Callable[[], None]) -> None:
            self._write(o, f"{o.id} {label}",
                        [(f"UPDATE instances SET status = :s{extra} WHERE id = :i",
                          dict(s=status, i=o.id, **params))], on_commit)
        return write

    # ---- choosing what happens next ------------------------------------------

    def actions(self) -> list[tuple[float, str, Callable[[], None]]]:
        acts: list[tuple[float, str, Callable[[], None]]] = []
        busy = not self.quiescing and not self.idle
        active = [o for o in self.owners if o.phase not in ("terminated", "done")]
        if busy and len(active) < MAX_ACTIVE_OWNERS:
            acts.append((2.0, "new owner", self.new_owner))
        step = self.sim.trace.step
        for o in self.owners:
            if o.tx is not None:
                continue
            waited = self.quiescing or step >= o.since + o.recover_after
            if o.phase == "issued" and (busy or self.quiescing):
                acts.append((1.0, "create", lambda o=o: self.create(o)) if busy
                            else (1.0, "give up", lambda o=o: self.hard_delete(o)))
            elif o.phase == "created" and (busy or self.quiescing):
                acts.append((1.5, "provision", lambda o=o: self.provision(o)))
            elif o.phase == "live" and busy:
                acts.append((0.3, "busy/idle", lambda o=o: self.busy_idle(o)))
                acts.append((0.5, "terminate", lambda o=o: self.start_termination(o)))
            elif o.phase == "terminating" or (o.phase == "crashed_terminating" and waited):
                acts.append((1.0, "finish termination", lambda o=o: self.finish_termination(o)))
            elif o.phase == "crashed_pending" and waited:
                acts.append((1.0, "recover", lambda o=o: self.recover_pending(o)))
            elif o.phase == "failed":
                acts.append((1.0, "hard delete", lambda o=o: self.hard_delete(o)))
            elif o.phase == "terminated" and not o.soft_deleted and busy:
                acts.append((0.2, "soft delete", lambda o=o: self.soft_delete(o)))
        if self.sim.rates.get("backend_edit") and not self.quiescing:  # operators work in idle spells too
            acts.append((self.sim.rates["backend_edit"] * 10, "backend edit", self.sim.operator_edit))
        if busy:
            acts.append((1.0, "people", self.people))
            live = sum(1 for o in self.owners if o.committed in LIVE and o.tx is None)
            if self.sim.rates.get("mass_terminate") and not self.mass_terminated and live > self.sim.max_deletes:
                acts.append((2.0, "mass terminate", self.mass_terminate))
            if self.sim.rates.get("mode_flip"):
                acts.append((0.1, "mode flip", self.mode_flip))
            if self.sim.rates.get("failover") and BACKEND_FO in self.sim.backends:
                acts.append((self.sim.rates["failover"] * 5, "failover", self.failover))

        return acts

    def in_flight(self) -> bool:
        return self.volume_in_flight() or any(
            o.tx is not None or o.phase in ("issuing", "issued", "created", "terminating", "crashed_pending",
                                            "crashed_terminating", "failed")
            for o in self.owners)

    def step(self) -> bool:
        if self.quiescing and self.volume_in_flight() and self.volume_step(settling=True):
            return True  # the settle phase: a volume owner in flight moves on (volumes world only)
        acts = self.actions()
        if not acts:
            return False
        total = sum(w for w, _, _ in acts)
        pick = self.rng.uniform(0, total)
        for weight, _name, act in acts:
            pick -= weight
            if pick <= 0:
                act()
                return True
        acts[-1][2]()
        return True

    # ---- the owner's life ----------------------------------------------------

    def new_ref(self) -> str:
        while True:
            ref = "".join(self.rng.choice(REF_ALPHABET) for _ in range(12))
            if ref not in self.by_ref and ref not in self.foreign_refs:
                return ref

    def new_owner(self) -> None:
        o = Owner(id=f"inst-{len(self.owners) + 1:03d}", ref=self.new_ref(), since=self.sim.trace.step,
                  recover_after=self.rng.randint(RECOVERY_AFTER_STEPS, 20))
        homes = self.sim.home_backends
        o.home = homes[0] if len(homes) == 1 else self.rng.choice(homes)
        self.owners.append(o)
        self.by_ref[o.ref] = o
        crash = self.sim.dice.roll("crash_after_ref")
        t = self.sim.clock()

        def committed() -> None:
            o.committed, o.since = "pending", self.sim.trace.step
            o.phase = "crashed_pending" if crash else "issued"

        self._write(o, f"{o.id} issue ref {o.ref}" + (" (then crashes)" if crash else ""), [
            ("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
             " VALUES (:r, 'instance', :o, :n, :t)", dict(r=o.ref, o=o.id, n=f"job-{o.id}", t=t)),
            ("INSERT INTO instances (id, name, provider_ref, status, created_at)"
             " VALUES (:o, :n, :r, 'pending', :t)", dict(r=o.ref, o=o.id, n=f"job-{o.id}", t=t)),
        ], committed)

    def _create_vm(self, o: Owner, att: Attempt, *, late: bool) -> None:
        now = self.sim.clock()
        lag = self.rng.randint(20, LISTING_LAG_MAX) if late else self.rng.randint(0, LISTING_LAG_MAX)
        meta = dict(origin="platform", owner_id=o.id, attempt=att.n, visible_at=now + timedelta(seconds=lag))
        att.vm = self.sim.cloud.add(ResourceKind.INSTANCE, att.region, {TAG: o.ref}, now=now,
                                    meta=self._meta(**meta))
        if self.rng.random() < 0.7:
            att.deps.append(self.sim.cloud.add(ResourceKind.VOLUME, att.region, {TAG: o.ref}, now=now,
                                               meta=self._meta(**meta), attached_to=att.vm))

    def _meta(self, **kw: Any) -> ResMeta:
        return ResMeta(ghost_for=self.rng.choice((0, 0, 30, 60)), shutdown_for=self.rng.choice((0, 20, 60)), **kw)

    def create(self, o: Owner) -> None:
        att = Attempt(len(o.attempts), self.rng.choice(self.sim.backends[o.home].regions))
        o.attempts.append(att)
        dice = self.sim.dice
        if dice.roll("create_error"):
            o.phase = "issued" if len(o.attempts) < 3 else "failed"
            self.sim.trace(f"platform: {o.id} create #{att.n} failed, nothing created -> {o.phase}")
            return
        if dice.roll("error_after_create"):
            self._create_vm(o, att, late=True)
            o.phase = "issued" if len(o.attempts) < 3 and self.rng.random() < 0.6 else "failed"
            self.sim.trace(f"platform: {o.id} create #{att.n} returned an error after creating {att.vm}"
                           f" (listed late) -> {o.phase}")
            return
        self._create_vm(o, att, late=False)
        if dice.roll("crash_after_create"):
            o.phase, o.since = "crashed_pending", self.sim.trace.step
            self.sim.trace(f"platform: {o.id} created {att.vm} in {att.region}, crashed before recording it")
            return
        o.phase = "created"
        self.sim.trace(f"platform: {o.id} created {att.vm} {att.deps} in {att.region}")

    def provision(self, o: Owner) -> None:
        att = o.attempts[-1]
        t = self.sim.clock()
        # A misconfigured platform names a backend that has no row ('aws').
        bid = UNKNOWN_BACKEND if self.sim.dice.roll("unknown_backend") else o.home
        # Rule 17's world: the platform records an id that names no instance now and then.
        mangled = self.sim.mangle and not self.quiescing and self.sim.rng_mangle.random() < 0.3
        primary = (att.vm[:-3] + "000" if self.sim.rng_mangle.random() < 0.5 else f"vm-{o.id}") if mangled else att.vm

        def committed() -> None:
            o.committed, o.tracked, o.provisioned_at, o.phase, o.backend = "provisioning", att.n, t, "live", bid
            o.mangled = mangled

        self._write(o, f"{o.id} provisioning backend={bid} primary={primary}", [(
            "UPDATE instances SET status = 'provisioning', backend_id = :b, primary_id = :p, region = :g,"
            " provisioned_at = :t WHERE id = :i", dict(b=bid, p=primary, g=att.region, t=t, i=o.id))],
            committed, self._concerns(o, bid))

    def failover(self) -> None:
        """A live owner moves to the failover backend (another account): a new VM there,
        backend_id and primary_id rewritten; the old VM stays up in the first account."""
        self.sim.dice.counts["failover"] += 1
        cands = [o for o in self.owners if o.committed in LIVE and o.phase == "live" and o.tx is None
                 and not o.soft_deleted and o.backend in self.sim.home_backends]
        if not cands:
            return
        o = self.rng.choice(cands)
        fo = self.sim.backends[BACKEND_FO]
        cloud = self.sim.clouds[fo.account]
        att = Attempt(len(o.attempts), self.rng.choice(fo.regions))
        o.attempts.append(att)
        now = self.sim.clock()
        meta = dict(origin="platform", owner_id=o.id, attempt=att.n,
                    visible_at=now + timedelta(seconds=self.rng.randint(0, LISTING_LAG_MAX)))
        att.vm = cloud.add(ResourceKind.INSTANCE, att.region, {TAG: o.ref}, now=now, meta=self._meta(**meta))
        if self.rng.random() < 0.5:
            att.deps.append(cloud.add(ResourceKind.VOLUME, att.region, {TAG: o.ref}, now=now,
                                      meta=self._meta(**meta), attached_to=att.vm))

        def committed() -> None:
            o.committed, o.tracked, o.provisioned_at, o.backend = "idle", att.n, now, BACKEND_FO

        self._write(o, f"{o.id} fails over to {BACKEND_FO}: primary={att.vm} (old {o.vm_of(o.tracked)} stays up)", [(
            "UPDATE instances SET status = 'idle', backend_id = :b, primary_id = :p, region = :g,"
            " provisioned_at = :t WHERE id = :i", dict(b=BACKEND_FO, p=att.vm, g=att.region, t=now, i=o.id))],
            committed, self._concerns(o, BACKEND_FO))

    def fix_unknown_backends(self) -> None:
        """The settle phase: the misconfigured platform is fixed; its owners name their real
        backend and their real primary."""
        self.flush(everything=True)
        for o in self.owners:
            if o.backend == UNKNOWN_BACKEND:
                def committed(o: Owner = o) -> None:
                    o.backend = o.home

                self._write(o, f"{o.id} backend_id {UNKNOWN_BACKEND} -> {o.home} (platform fixed)",
                            [("UPDATE instances SET backend_id = :b WHERE id = :i", dict(b=o.home, i=o.id))],
                            committed, self._concerns(o, o.home))
        self.flush(everything=True)  # (a fix above may have left its row locked)
        for o in self.owners:
            if o.mangled:  # rule 17's world: the platform records its primaries' real ids again
                def fixed(o: Owner = o) -> None:
                    o.mangled = False

                self._write(None, f"{o.id} primary_id -> {o.vm_of(o.tracked)} (platform fixed)",
                            [("UPDATE instances SET primary_id = :p WHERE id = :i",
                              dict(p=o.vm_of(o.tracked), i=o.id))],
                            fixed, self._concerns(o, o.backend))

    def busy_idle(self, o: Owner) -> None:
        status = "busy" if o.committed != "busy" else "idle"
        self._status(o, status, f"-> {status}")(lambda: setattr(o, "committed", status))

    def start_termination(self, o: Owner) -> None:
        crash = self.sim.dice.roll("crash_terminating")

        def committed() -> None:
            o.committed, o.since = "terminating", self.sim.trace.step
            o.phase = "crashed_terminating" if crash else "terminating"

        self._status(o, "terminating", "-> terminating" + (" (then crashes)" if crash else ""))(committed)

    def finish_termination(self, o: Owner) -> None:
        """Terminate the owner's VM at the provider (or give up), then mark it terminated."""
        gave_up = self.sim.dice.roll("termination_gave_up")
        att = o.attempts[o.tracked] if o.tracked is not None else None
        if att is not None and not gave_up:
            cloud = self.sim.world
            vm = cloud.resources.get(att.vm or "")
            if vm is not None and vm.state is ResourceState.ACTIVE:
                self.cancel_spot(vm)
                vm.state = ResourceState.TERMINATING
                for root in [r for r in cloud.resources.values() if r.attached_to == vm.id
                             and (m := cloud.meta.get(r.id)) is not None and m.origin == "root"]:
                    root.attached_to, root.state = None, ResourceState.TERMINATED  # its own root goes with it
            for dep in att.deps:
                res = cloud.resources.get(dep)
                if res is not None and res.state not in (ResourceState.TERMINATING, ResourceState.TERMINATED):
                    if self.sim.dice.roll("volume_left_behind"):
                        self.sim.trace(f"platform: {o.id} left volume {dep} behind")
                    else:
                        res.state = ResourceState.TERMINATED
        t = self.sim.clock()

        def committed() -> None:
            o.committed, o.phase = "terminated", "terminated"

        what = "gave up terminating, VM still up" if gave_up or att is None else f"terminated {att.vm}"
        self._status(o, "terminated", f"{what} -> terminated", ", terminated_at = :t", t=t)(committed)

    def recover_pending(self, o: Owner) -> None:
        if self.rng.random() < 0.6:
            self.hard_delete(o)
        else:
            t = self.sim.clock()

            def committed() -> None:
                o.committed, o.phase = "terminated", "terminated"

            self._status(o, "terminated", "recovered after crash -> terminated", ", terminated_at = :t", t=t)(committed)

    def hard_delete(self, o: Owner) -> None:
        def committed() -> None:
            o.committed, o.phase = "gone", "done"

        self._write(o, f"{o.id} hard-delete placeholder (ref {o.ref} stays)",
                    [("DELETE FROM instances WHERE id = :i", dict(i=o.id))], committed)

    def soft_delete(self, o: Owner) -> None:
        t = self.sim.clock()

        def committed() -> None:
            o.soft_deleted, o.phase = True, "done"

        self._write(o, f"{o.id} soft delete", [("UPDATE instances SET deleted_at = :t WHERE id = :i",
                                                 dict(t=t, i=o.id))], committed)

    def mass_terminate(self) -> None:
        """A platform bug marks every live owner terminated while the VMs run (blast radius)."""
        self.sim.dice.counts["mass_terminate"] += 1
        self.mass_terminated = True
        victims = [o for o in self.owners if o.committed in LIVE and o.tx is None]
        t = self.sim.clock()
        backends = {o.backend for o in victims}

        def committed() -> None:
            for o in victims:
                o.committed, o.phase = "terminated", "terminated"

        self._write(None, f"BUG: marks {len(victims)} live owners terminated",
                    [("UPDATE instances SET status = 'terminated', terminated_at = :t"
                      " WHERE id = ANY(CAST(:ids AS text[]))",
                      dict(t=t, ids=[o.id for o in victims]))], committed,
                    None if None in backends else frozenset(b for b in backends if b is not None))

    def mode_flip(self) -> None:
        self.sim.dice.counts["mode_flip"] += 1
        self.sim.set_mode("report" if self.sim.mode == "delete" else "delete")

    # ---- settle phase ----------------------------------------------------------

    def quiesce(self) -> None:
        """Stop new work and people; in-flight owners are driven to final states."""
        self.quiescing = True
        self.fix_unknown_backends()
