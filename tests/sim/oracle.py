"""The ground truth the invariants ask the platform for (a mixin of ``Platform``):
which resources must never be touched (S1-S3), and which are orphans (L1)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from orphan_cleanup.core.listing import ResourceKind, ResourceState, is_valid_ref
from tests.sim.owners import LIVE, PROTECT_KEYS, TAG, VOLUME_LIVE
from tests.sim.world import UNKNOWN_BACKEND


class Oracle:
    def untouchable(self, rid: str, tags: dict[str, str]) -> tuple[str, str] | None:
        """Why the cleanup must never touch ``rid`` (tags as they were before the step)."""
        meta = self.sim.world.meta.get(rid)
        if meta is not None and meta.origin == "root" and TAG not in tags and PROTECT_KEYS.isdisjoint(tags):
            return None  # an instance's own root volume goes with it: V1 judges the call that took it
        ref = tags.get(TAG)
        if not is_valid_ref(ref):
            return "S2", f"{rid} carries no valid ref tag ({ref!r})"
        owner = self.by_ref.get(ref or "")
        if owner is None or owner.committed is None:
            return "S2", f"{rid} has ref {ref} with no ledger record"
        if not PROTECT_KEYS.isdisjoint(tags):
            return "S3", f"{rid} carries a protect tag of its account ({sorted(PROTECT_KEYS & set(tags))})"
        meta = self.sim.world.meta.get(rid)
        st = owner.committed
        if owner.kind == "volume":  # a volume owner (volumes world): its recorded volume is its primary
            if st in ("pending", "deleting"):
                return "S1", f"{rid} belongs to volume owner {owner.id}, which is {st}"
            if (st in VOLUME_LIVE and not owner.soft_deleted and meta is not None and meta.origin == "platform"
                    and meta.attempt == owner.tracked):
                return "S1", (f"{rid} is the recorded volume of live volume owner {owner.id} (status {st},"
                              f" primary {owner.vm_of(owner.tracked)})")
            return None
        if st in LIVE and not owner.soft_deleted and owner.backend == UNKNOWN_BACKEND:
            return "S1", f"{rid} belongs to live owner {owner.id}, whose backend_id names no backend"
        if meta is not None and meta.origin == "copy" and st in LIVE and not owner.soft_deleted \
                and not self._copy_predates(rid, owner):
            return "S3", f"{rid} is a copy of live owner {owner.id}'s VM (suspected copy)"
        if st in ("pending", "terminating"):
            return "S1", f"{rid} belongs to owner {owner.id}, which is {st}"
        if (st in LIVE and not owner.soft_deleted and meta is not None and meta.origin == "platform"
                and meta.attempt == owner.tracked):
            return "S1", (f"{rid} is tracked by live owner {owner.id} (status {st},"
                          f" primary {owner.vm_of(owner.tracked)})")
        return None

    def _own_root(self, d: Any, instance_id: str) -> bool:
        """``d`` is the instance's own root volume, launched with it (no ref tag, no protect tag)."""
        m = self.sim.world.meta.get(d.id)
        return (m is not None and m.origin == "root" and m.of_instance == instance_id and TAG not in d.tags
                and PROTECT_KEYS.isdisjoint(d.tags))

    def _copy_predates(self, rid: str, owner: Any) -> bool:
        """A copy made before the owner's (latest) provisioning plus the margin: after a
        failover re-provisioned the owner in another account, a copy of its old VM is a
        leftover in the old account like the old VM itself (``backend_mismatch``)."""
        r = self.sim.world.resources.get(rid)
        return (r is not None and owner.provisioned_at is not None
                and r.created_at <= owner.provisioned_at + timedelta(seconds=self.sim.margin))

    def _group_members(self, rid: str) -> list[Any]:
        """The live members of ``rid``'s listed group, grouped as ``group_resources``
        does it: an instance with the dependents attached to it, else the
        primary-less group of the ref and region."""
        res = self.sim.world.resources
        alive = {k: r for k, r in res.items() if r.state is not ResourceState.TERMINATED}
        ref = res[rid].tags.get(TAG)

        def owner_of(r: Any) -> str | None:
            if r.kind is ResourceKind.INSTANCE:
                return r.id
            vm = alive.get(r.attached_to or "")
            return vm.id if vm is not None and vm.kind is ResourceKind.INSTANCE and vm.tags.get(TAG) == ref else None

        key = (owner_of(res[rid]), res[rid].region)
        return [r for r in alive.values() if r.tags.get(TAG) == ref and (owner_of(r), r.region) == key]

    def is_orphan(self, rid: str, *, known: frozenset[str]) -> bool:
        """Ground truth for L1: a resource the cleanup must eventually delete.
        ``known``: resource ids the product recorded in orphan groups."""
        cloud = self.sim.world
        r = cloud.resources.get(rid)
        if r is None or r.state is ResourceState.TERMINATED or r.kind is ResourceKind.SNAPSHOT:
            return False  # a snapshot the deleter did not take is never deleted (rule 15)
        ref = r.tags.get(TAG)
        owner = self.by_ref.get(ref or "")
        meta = cloud.meta.get(rid)
        if owner is None or owner.committed is None or not PROTECT_KEYS.isdisjoint(r.tags) or meta is None:
            return False
        if any(not PROTECT_KEYS.isdisjoint(m.tags) or m.controller is not None or m.protection is not None
               or m.termination_protected
               for m in self._group_members(rid)):
            # The product protects a whole group when one member is protected: the protect
            # tag, or rule 14 (another controller's, or protected by the provider).
            return False
        if r.kind is ResourceKind.INSTANCE and any(
                d.attached_to == rid and d.auto_delete and d.state is not ResourceState.TERMINATED
                and (d.tags.get(TAG) != ref or not PROTECT_KEYS.isdisjoint(d.tags)) and not self._own_root(d, rid)
                for d in cloud.resources.values()):
            return False  # terminating it would delete a non-member with it: kept (rule 15)
        if any((m := cloud.meta.get(g.id)) is not None and m.origin == "bulk-huge" for g in self._group_members(rid)):
            return False  # its group is too large for any message: never classified (rule 20)
        request = cloud.resources.get(r.spot_request or "") if r.kind is ResourceKind.INSTANCE else None
        if request is not None and request.persistent and request.state is not ResourceState.TERMINATED \
                and (request.tags.get(TAG) != ref or not PROTECT_KEYS.isdisjoint(request.tags)):
            return False  # its persistent spot request, not the group's to cancel, would relaunch it: kept
        vm = cloud.resources.get(r.attached_to or "")
        if r.kind is not ResourceKind.INSTANCE and vm is not None and cloud.exists(vm.id):
            # In use by an instance: deletable only with it (a re-tagged instance keeps it forever).
            return vm.tags.get(TAG) == ref and self.is_orphan(vm.id, known=known)
        st = owner.committed
        if st in ("gone", "terminated", "deleted") or owner.soft_deleted:
            return True
        if owner.kind == "volume":
            # A live volume owner's other volume is a lost attempt (created before its
            # provisioning), deleted only beside its recorded volume, listed live with the ref
            # in the same region (rule 17); pending and deleting owners' volumes are skipped.
            if st not in VOLUME_LIVE or meta.attempt == owner.tracked or meta.origin != "platform":
                return False
            primary = cloud.resources.get(owner.vm_of(owner.tracked) or "")
            return (primary is not None and primary.state is not ResourceState.TERMINATED
                    and primary.region == r.region and primary.tags.get(TAG) == ref)
        if st not in LIVE or meta.attempt == owner.tracked:
            return False
        if meta.origin == "copy" and not self._copy_predates(rid, owner):
            return False
        if owner.backend == UNKNOWN_BACKEND:
            return False  # skipped (unknown_owner_backend), never an orphan
        if r.kind is ResourceKind.INSTANCE:
            # A leaked attempt: created before the owner's provisioning; deleted only beside
            # its recorded primary, live with the ref in the same region (rule 17).
            primary = cloud.resources.get(owner.vm_of(owner.tracked) or "")
            return (not owner.mangled and primary is not None and primary.state is not ResourceState.TERMINATED
                    and primary.region == r.region and primary.tags.get(TAG) == ref)
        if r.attached_to and cloud.exists(r.attached_to):
            return True
        # A detached leftover of a live owner is protected unless it was seen in an orphan
        # group, and so is its whole listed group unless every member was (the product
        # decides per group: one volume still in use by an untagged VM protects the rest).
        return all(m.id in known for m in self._group_members(rid))
