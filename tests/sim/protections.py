"""Other controllers and provider protections (SAFETY.md rule 14; a mixin of ``Platform``).

In a share of the seeds (``Simulation.rule14``) the world has, from the start:

- an Auto Scaling group launched from a template that copied a finished owner's
  tags: its instances carry that owner's ref (they look like orphans) and name
  their controller, which re-creates any instance it loses (``SimCloud.tick``);
- orphan-looking instances with AWS termination protection, which no listing
  shows: only a delete finds it (the simulated cloud refuses it as AWS does);
- now and then one with a deletion protection the listing shows (GCP).

During the run people enable termination protection on instances, preferably
ones named by waiting delete requests (``user_termination_protect``).

Every draw comes from the seed's own ``rule14`` streams, so the other streams
(faults, platform, scheduler) draw as they did before, and seeds without these
features run exactly as before.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TYPE_CHECKING

from orphan_cleanup.core.listing import ResourceKind, ResourceState
from tests.sim.cloud import ResMeta
from tests.sim.owners import LIVE, PROTECT, TAG
from tests.sim.world import BACKEND

if TYPE_CHECKING:
    from tests.sim.platform import Platform

#: The AWS tag an Auto Scaling group puts on its instances (a default controller tag key).
ASG_TAG = "aws:autoscaling:groupName"


class Protections:
    def rule14_history(self: Platform) -> None:
        sim = self.sim
        rng, cloud, now = sim.rng_rule14, sim.cloud, sim.clock()
        done = [o for o in self.owners if o.committed in ("terminated", "gone")]
        if done and rng.random() < 0.7:
            o = rng.choice(done)
            name = f"asg-{o.id}"
            region = rng.choice(self.regions)
            for _ in range(rng.randint(1, 2)):
                at = now - timedelta(seconds=rng.randint(1800, 6 * 3600))
                meta = ResMeta(origin="controller", owner_id=o.id, attempt=None, visible_at=at,
                               ghost_for=rng.choice((0, 30)), shutdown_for=rng.choice((0, 20)))
                rid = cloud.add(ResourceKind.INSTANCE, region, {TAG: o.ref, ASG_TAG: name}, now=at, meta=meta)
                cloud.resources[rid].controller = f"asg:{name}"
            sim.trace(f"history: Auto Scaling group {name} launches instances with ref {o.ref}")
        candidates = self._orphan_instances()
        for rid in rng.sample(candidates, min(len(candidates), rng.randint(1, 2))):
            cloud.resources[rid].termination_protected = True
            sim.trace(f"history: {rid} has termination protection (no listing shows it)")
        candidates = self._orphan_instances()
        if candidates and rng.random() < 0.3:
            rid = rng.choice(candidates)
            cloud.resources[rid].protection = "deletion_protection"
            sim.trace(f"history: {rid} has deletion protection (listed)")

    def rule14_people(self: Platform) -> None:
        """Someone enables termination protection: on an instance about to be deleted,
        else on one that looks orphaned, else on any instance of ours."""
        sim = self.sim
        if not sim.rule14_dice.roll("user_termination_protect"):
            return
        rng, cloud = sim.rng_rule14, sim.world
        deleting, _listed = sim.resources_in_messages()
        instances = sorted(rid for rid, r in cloud.resources.items()
                           if r.kind is ResourceKind.INSTANCE and r.state is ResourceState.ACTIVE
                           and TAG in r.tags and not r.termination_protected)
        roll = rng.random()
        pool = [rid for rid in instances if rid in deleting] if roll < 0.6 else []
        pool = pool or (self._orphan_instances() if roll < 0.9 else []) or instances
        if pool:
            rid = rng.choice(pool)
            cloud.resources[rid].termination_protected = True
            sim.trace(f"user: enabled termination protection on {rid}")

    def backup_history(self: Platform, rng: random.Random) -> None:
        """Rule 15: AWS Backup (or DLM) copied the tags of some owners' volumes into their
        snapshots: ref-tagged snapshots the deleter never took. Never listed, never deleted."""
        sim, cloud, now = self.sim, self.sim.cloud, self.sim.clock()
        for o in rng.sample(self.owners, min(len(self.owners), rng.randint(1, 3))):
            at = now - timedelta(seconds=rng.randint(3600, 30 * 86400))
            meta = ResMeta(origin="foreign", owner_id=o.id, attempt=None, visible_at=at)
            rid = cloud.add(ResourceKind.SNAPSHOT, rng.choice(self.regions),
                            {TAG: o.ref, "aws:backup:source-resource": f"vol-of-{o.id}"}, now=at, meta=meta)
            sim.trace(f"history: a backup of {o.id}'s volume, snapshot {rid}, carries ref {o.ref}")

    def mangle_history(self: Platform) -> None:
        """Rule 17: the platform recorded some live owners' primary_id as an id that names
        no instance (a rounded number, the VM's name). The settle phase fixes them."""
        sim, rng = self.sim, self.sim.rng_mangle
        live = [o for o in self.owners if o.committed in LIVE and not o.soft_deleted and o.tracked is not None]
        for o in rng.sample(live, min(len(live), rng.randint(1, 2))):
            vm = o.vm_of(o.tracked) or ""
            mangled = vm[:-3] + "000" if rng.random() < 0.5 else f"vm-{o.id}"
            sim.admin.run("UPDATE instances SET primary_id = :p WHERE id = :i", p=mangled, i=o.id)
            o.mangled = True
            sim.trace(f"history: {o.id} recorded primary_id {mangled} for {vm}")

    def cascade_people(self: Platform) -> None:
        """Rule 15: someone attaches a volume of their own, with DeleteOnTermination, to an
        instance about to be deleted (else one that looks orphaned): a live owner's
        volume (another ref) or a protected one of the same ref. Terminating the instance
        would delete it too; the deleter must see that and keep the group."""
        sim = self.sim
        if not sim.cascade_dice.roll("user_attach_auto_delete"):
            return
        rng, cloud, now = sim.rng_cascade, sim.world, sim.clock()
        deleting, _listed = sim.resources_in_messages()
        instances = sorted(rid for rid, r in cloud.resources.items()
                           if r.kind is ResourceKind.INSTANCE and r.state is ResourceState.ACTIVE and TAG in r.tags)
        pool = [rid for rid in instances if rid in deleting] if rng.random() < 0.7 else []
        pool = pool or self._orphan_instances()
        live = [o for o in self.owners if o.committed in LIVE and not o.soft_deleted]
        if not pool:
            return
        vm = cloud.resources[rng.choice(pool)]
        if live and rng.random() < 0.5:
            tags = {TAG: rng.choice(live).ref}
        else:
            tags = {TAG: vm.tags[TAG], PROTECT: "yes"}
        meta = ResMeta(origin="foreign", owner_id=None, attempt=None, visible_at=now)
        rid = cloud.of(vm.id).add(ResourceKind.VOLUME, vm.region, tags, now=now, meta=meta, attached_to=vm.id)
        cloud.resources[rid].auto_delete = True
        sim.trace(f"user: attached {rid} {tags} to {vm.id} with DeleteOnTermination")

    def _orphan_instances(self: Platform) -> list[str]:
        cloud = self.sim.world
        return sorted(rid for rid, r in cloud.resources.items()
                      if r.kind is ResourceKind.INSTANCE and r.controller is None and r.protection is None
                      and not r.termination_protected and self.is_orphan(rid, known=frozenset()))


    def rule14_operator(self: Platform) -> None:
        """An operator looks at a termination protection a delete of ``sim`` met and switches
        ``sim`` to report (rule 14: its report cycles must still say protected, P2)."""
        sim = self.sim
        if sim.mode == "delete" and not self.quiescing and any(
                b == BACKEND for b, _pid in sim.checker.protection_found) and sim.rng_rule14.random() < 0.3:
            sim.trace("operator: a delete met a termination protection: sim to report")
            sim.set_mode("report")
