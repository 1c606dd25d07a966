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

from datetime import timedelta
from typing import TYPE_CHECKING

from orphan_cleanup.core.listing import ResourceKind, ResourceState
from tests.sim.cloud import ResMeta
from tests.sim.owners import LIVE, PROTECT, TAG

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
