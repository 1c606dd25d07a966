"""People and other platforms around the platform (a mixin of ``Platform``):
copies of live VMs, the protect tag, removed or replaced ref tags, foreign resources."""

from __future__ import annotations

from datetime import timedelta

from orphan_cleanup.core.listing import ResourceKind, ResourceState, is_valid_ref
from tests.sim.owners import (
    LISTING_LAG_MAX,
    LIVE,
    PROTECT,
    PROTECT_B,
    PROTECT_KEYS,
    PROTECT_STACK,
    REF_ALPHABET,
    TAG,
)


class People:
    def people(self) -> None:
        dice, rng, cloud, now = self.sim.dice, self.rng, self.sim.world, self.sim.clock()
        if dice.roll("user_copy"):
            live = [o for o in self.owners if o.committed in LIVE and o.provisioned_at is not None
                    and now >= o.provisioned_at + timedelta(seconds=self.sim.margin + 1)
                    and cloud.exists(o.vm_of(o.tracked) or "")]
            if live:
                o = rng.choice(live)
                src = cloud.resources[o.vm_of(o.tracked) or ""]
                lag = rng.randint(0, LISTING_LAG_MAX)
                rid = cloud.of(src.id).add(ResourceKind.INSTANCE, src.region, dict(src.tags), now=now,
                                meta=self._meta(origin="copy", owner_id=o.id, attempt=None,
                                                visible_at=now + timedelta(seconds=lag)))
                self.sim.trace(f"user: launched {rid} like {src.id} (copies ref {o.ref})")
        if dice.roll("user_protect") and (target := self._pick_target()) is not None:
            key = self._protect_key()
            cloud.resources[target].tags[key] = "yes"
            self.sim.trace(f"user: protected {target} ({key})")
        if dice.roll("user_untag") and (target := self._pick_target()) is not None:
            res = cloud.resources[target]
            if rng.random() < 0.5:
                res.tags.pop(TAG, None)
                self.sim.trace(f"user: removed the ref tag of {target}")
            else:
                res.tags[TAG] = self._foreign_ref()
                self.sim.trace(f"user: re-tagged {target} with foreign ref {res.tags[TAG]}")
        if dice.roll("foreign_resource"):
            kind = rng.choice(("foreign", "invalid", "untagged"))
            tags = {"foreign": {TAG: self._foreign_ref()}, "untagged": {"Name": "hand-made"},
                    "invalid": {TAG: rng.choice(("", "NOT-A-REF", "ABCDEFGHIJKL", "short", "x" * 13))}}[kind]
            rid = self.sim.cloud.add(ResourceKind.INSTANCE, rng.choice(self.regions), tags, now=now,
                            meta=self._meta(origin="foreign", owner_id=None, attempt=None, visible_at=now))
            self.sim.trace(f"other: {kind} resource {rid} tags={tags}")
        if self.sim.rule14:
            self.rule14_people()
        if self.sim.cascade:
            self.cascade_people()
        self.world_people()

    def _protect_key(self) -> str:
        """The default key, or, half the time when a backend of the account has it, that
        backend's own key (rule 16: it protects from every backend of the account)."""
        if not any(b.settings.get("protect_tag_key") == PROTECT_B for b in self.sim.backends.values()):
            key = PROTECT
        else:
            key = PROTECT_B if self.sim.rng_keys.random() < 0.5 else PROTECT
        # the stack's own key (no row names it) instead of the default, from a stream of its own
        if key == PROTECT and self.sim.stack_key_users and self.sim.rng_stack_key.random() < 0.4:
            return PROTECT_STACK
        return key

    def _pick_target(self) -> str | None:
        cloud = self.sim.world
        ours = [rid for rid, r in cloud.resources.items()
                if r.state not in (ResourceState.TERMINATING, ResourceState.TERMINATED)
                and is_valid_ref(r.tags.get(TAG)) and PROTECT_KEYS.isdisjoint(r.tags)]
        # People act on what they were just told about: the groups being deleted, the
        # groups being classified (between the listing and the delete only the re-read
        # protects them), else the orphans they see, else anything of ours.
        deleting, listed = self.sim.resources_in_messages()
        orphans = [rid for rid in ours if self.is_orphan(rid, known=frozenset())]
        roll = self.rng.random()
        pool = next(p for p in (sorted(deleting & set(ours)) if roll < 0.6 else [],
                                sorted(listed & set(ours)) if roll < 0.8 else [],
                                orphans if roll < 0.95 else [], ours) if p or p is ours)
        return self.rng.choice(pool) if pool else None

    def _foreign_ref(self) -> str:
        ref = "zz" + "".join(self.rng.choice(REF_ALPHABET) for _ in range(10))
        self.foreign_refs.add(ref)
        return ref
