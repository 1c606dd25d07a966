"""An in-memory cloud behind the real provider port, for pipeline tests, the
simulation and benchmarks. It keeps the port's contract (re-read by id before
acting, confirm termination, dependents after the owner) so a change to the
port breaks it like it breaks the real adapters.

SAFETY.md rule 14 as the real adapters meet it: an instance a controller
manages (``controller``, listed like the AWS adapter's controller tags) or that
carries a deletion protection the listing shows (``protection``, GCP
``deletionProtection``) or one it does not (``termination_protected``, AWS
``disableApiTermination``) is never terminated: the delete re-reads the owner and
answers ``PROTECTED`` with the reason, as ``aws_delete`` does after
``DescribeInstanceAttribute`` or a refused ``TerminateInstances``."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY, Backend
from orphan_cleanup.core.errors import ProviderError, ProviderUnavailable
from orphan_cleanup.core.journal import NO_JOURNAL, Journal, journaled
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus, SkippedResource
from orphan_cleanup.providers.base import ResourceProvider, group_resources

DEPENDENT_ORDER = (ResourceKind.NETWORK_INTERFACE, ResourceKind.VOLUME, ResourceKind.DISK,
                   ResourceKind.ADDRESS, ResourceKind.SECURITY_GROUP, ResourceKind.SNAPSHOT)


@dataclass
class CloudResource:
    kind: ResourceKind
    id: str
    region: str
    tags: dict[str, str]
    created_at: datetime
    state: ResourceState = ResourceState.ACTIVE
    attached_to: str | None = None
    terminating_reads: int = 0  # reads left while "shutting-down"
    controller: str | None = None  # "asg:NAME": a controller re-creates the instance if it goes
    protection: Literal["deletion_protection"] | None = None  # a protection the listing shows (GCP)
    termination_protected: bool = False  # AWS termination protection: no listing shows it
    # Deleted by the provider with the instance it is attached to (GCP autoDelete, AWS
    # DeleteOnTermination): SAFETY.md rule 15's blast of a terminate call.
    auto_delete: bool = False


@dataclass
class MemoryCloud:
    """One provider account. Tests mutate it directly, as a platform would."""

    resources: dict[str, CloudResource] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    failing_regions: set[str] = field(default_factory=set)
    unavailable_regions: set[str] = field(default_factory=set)
    terminate_lag: int = 0
    deleted: list[str] = field(default_factory=list)
    # The account the credentials reach (None: whatever the backend says).
    account: str | None = None
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, kind: ResourceKind, region: str, tags: dict[str, str] | None = None, *,
               attached_to: str | None = None, created_at: datetime | None = None) -> str:
        prefix = {"instance": "i", "volume": "vol", "network-interface": "eni", "security-group": "sg",
                  "address": "eipalloc", "disk": "disk", "snapshot": "snap"}[kind.value]
        rid = f"{prefix}-{next(self._ids):08x}"
        state = ResourceState.ACTIVE if kind is ResourceKind.INSTANCE or attached_to else ResourceState.AVAILABLE
        self.resources[rid] = CloudResource(kind, rid, region, dict(tags or {}),
                                            created_at or datetime.now(UTC), state, attached_to)
        return rid

    def exists(self, rid: str) -> bool:
        r = self.resources.get(rid)
        return r is not None and r.state is not ResourceState.TERMINATED


class MemoryProvider(ResourceProvider):
    def __init__(self, backend: Backend, cloud: MemoryCloud) -> None:
        super().__init__(backend)
        self.cloud = cloud

    def reached_account(self) -> str:
        self.cloud.calls["identity"] += 1
        return self.cloud.account if self.cloud.account is not None else self.backend.scope_account

    def _check_region(self, region: str) -> None:
        if region in self.cloud.unavailable_regions:
            raise ProviderUnavailable(f"{region} is unavailable", region=region)
        if region in self.cloud.failing_regions:
            raise ProviderError(f"{region} failed", region=region)

    def iter_listing(self) -> Iterator[RegionListing]:
        for region in self.backend.regions:
            self.cloud.calls["list"] += 1
            try:
                self._check_region(region)
            except ProviderError as e:
                yield RegionListing(region=region, failure=str(e))
                continue
            with self.cloud._lock:
                listed = [_snapshot(r) for r in self.cloud.resources.values()
                          if r.region == region and r.state is not ResourceState.TERMINATED
                          and self.tag_key in r.tags and self._listable(r)]
            yield RegionListing(region=region, groups=tuple(group_resources(listed, self.tag_key)))

    def _listable(self, r: CloudResource) -> bool:
        """Rule 15: a snapshot is listed only for retention, and only one the deleter took."""
        return r.kind is not ResourceKind.SNAPSHOT or (
            self.backend.settings.retain_snapshots_days is not None and self._ours(r))

    @staticmethod
    def _ours(r: CloudResource) -> bool:
        return SNAPSHOT_SOURCE_KEY in r.tags

    def _reread(self, res: Resource, ref: str) -> tuple[CloudResource | None, str | None]:
        self.cloud.calls["describe"] += 1
        live = self.cloud.resources.get(res.id)
        if live is None or live.state is ResourceState.TERMINATED:
            return None, None
        if not self.protect_keys.isdisjoint(live.tags):
            return live, "protected"
        if live.tags.get(self.tag_key) != ref:
            return live, "ref_changed" if self.tag_key in live.tags else "ref_missing"
        if live.kind is ResourceKind.SNAPSHOT and not self._ours(live):
            return live, "not_our_snapshot"
        return live, None

    def _protection(self, live: CloudResource) -> tuple[str, str] | None:
        """Why the owner must not be terminated (rule 14): (reason, detail), or None. Its
        controller and listed protection as re-read now, then the attribute no listing shows."""
        if live.controller is not None:
            return "managed_by_controller", f"{live.id} is managed by {live.controller}"
        if live.protection is not None:
            return live.protection, f"{live.id} has {live.protection}"
        if live.termination_protected:
            self.cloud.calls["describe_attribute"] += 1
            return "termination_protection", f"{live.id} has disableApiTermination True"
        return None

    def _blast(self, live: CloudResource, group: ResourceGroup,
               rereads: list[tuple[Resource, CloudResource | None, str | None]],
               ) -> tuple[list[CloudResource], list[SkippedResource]]:
        """What terminating ``live`` deletes along with it, and what of that blocks the call."""
        blast = [r for r in self.cloud.resources.values()
                 if r.attached_to == live.id and r.auto_delete and r.state is not ResourceState.TERMINATED]
        return blast, _blast_blocked(self, blast, rereads)

    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        self.cloud.calls["describe"] += 1
        live = self.cloud.resources.get(instance_id)
        return (live is not None and live.kind is ResourceKind.INSTANCE and live.region == region
                and live.state is not ResourceState.TERMINATED and live.tags.get(self.tag_key) == ref)

    def instance_created_at(self, instance: Resource) -> datetime | None:
        self._check_region(instance.region)
        self.cloud.calls["describe"] += 1
        live = self.cloud.resources.get(instance.id)
        if live is None or live.kind is not ResourceKind.INSTANCE or live.region != instance.region \
                or live.state is ResourceState.TERMINATED:
            return None
        return live.created_at

    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        self._check_region(group.region)
        skipped: list[SkippedResource] = []
        deleted: list[str] = []
        pending: list[str] = []
        attached = set(known_attached) & set(group.resource_ids())
        unverified = "not_attached"
        with self.cloud._lock:
            primary = group.primary
            if primary is not None:
                live, why = self._reread(primary, group.provider_ref)
                if why:
                    return DeleteResult(status=DeleteStatus.SKIPPED,
                                        skipped=(SkippedResource(kind=primary.kind, id=primary.id, reason=why),))
                protection = self._protection(live) if live is not None \
                    and live.state is ResourceState.ACTIVE else None
                if protection is not None:
                    return _protected(group, *protection)
                if live is None:
                    unverified = "primary_gone"
                else:  # the dependents the instance uses now (rule 15), and none of them protected (rule 12)
                    rereads = [(r, *self._reread(r, group.provider_ref)) for r in group.resources if r.id != primary.id]
                    attached |= {r.id for r, dep, _ in rereads if dep is not None and dep.attached_to == live.id}
                    if any(w == "protected" for _, _, w in rereads):
                        return DeleteResult(status=DeleteStatus.SKIPPED, skipped=tuple(
                            SkippedResource(kind=r.kind, id=r.id, reason=w or "group_protected")
                            for r, _, w in [(primary, live, None), *rereads]))
                    if live.state is ResourceState.ACTIVE:
                        blast, blocked = self._blast(live, group, rereads)
                        if blocked:
                            return DeleteResult(status=DeleteStatus.SKIPPED, skipped=tuple(blocked))
                        with journaled(journal, "memory:terminate", live.id, region=group.region,
                                       blast=[b.id for b in blast]):
                            self.cloud.calls["terminate"] += 1
                            live.state = ResourceState.TERMINATING
                            live.terminating_reads = self.cloud.terminate_lag
                            for b in blast:  # the provider deletes them with the call
                                b.attached_to, b.state = None, ResourceState.TERMINATED
                                self.cloud.deleted.append(b.id)
                    if live.terminating_reads > 0:
                        live.terminating_reads -= 1
                        return DeleteResult(status=DeleteStatus.DELETING, pending=(primary.id,),
                                            attached=tuple(sorted(attached)))
                    live.state = ResourceState.TERMINATED
                    self.cloud.deleted.append(live.id)
                    for dep in self.cloud.resources.values():
                        if dep.attached_to == live.id:
                            dep.attached_to, dep.state = None, ResourceState.AVAILABLE
                deleted.append(primary.id)
            for kind in DEPENDENT_ORDER:
                for res in (r for r in group.resources if r.kind is kind):
                    live, why = self._reread(res, group.provider_ref)
                    if why:
                        skipped.append(SkippedResource(kind=res.kind, id=res.id, reason=why))
                    elif live is None:
                        deleted.append(res.id)
                    elif primary is not None and res.id not in attached:  # not verified: the next listing regroups it
                        skipped.append(SkippedResource(kind=res.kind, id=res.id, reason=unverified))
                    elif live.attached_to and self.cloud.exists(live.attached_to):
                        pending.append(res.id)
                    else:
                        with journaled(journal, "memory:delete", live.id, region=group.region):
                            self.cloud.calls["delete"] += 1
                            live.state = ResourceState.TERMINATED
                            self.cloud.deleted.append(live.id)
                        deleted.append(res.id)
        if pending:
            status = DeleteStatus.DELETING
        elif any(s.reason == unverified for s in skipped):
            status = DeleteStatus.SKIPPED if unverified == "primary_gone" else DeleteStatus.DELETING
        else:
            status = DeleteStatus.DELETED
        return DeleteResult(status=status, deleted=tuple(deleted), skipped=tuple(skipped), pending=tuple(pending),
                            attached=tuple(sorted(attached)))


def _blast_blocked(self: MemoryProvider, blast: list[CloudResource],
                   rereads: list[tuple[Resource, CloudResource | None, str | None]]) -> list[SkippedResource]:
    """Rule 15: what the terminate call would delete along with the instance must be
    members of the group, re-read unchanged (this cloud has no root volume of its own)."""
    why_of = {r.id: why for r, _dep, why in rereads}
    blocked = []
    for b in blast:
        if b.id in why_of:
            why = why_of[b.id]
            if why is not None:
                blocked.append(SkippedResource(kind=b.kind, id=b.id, reason="blast_protected"
                                               if why == "protected" else "blast_foreign"))
        else:
            reason = "blast_foreign" if self.protect_keys.isdisjoint(b.tags) else "blast_protected"
            blocked.append(SkippedResource(kind=b.kind, id=b.id, reason=reason))
    return blocked


def _protected(group: ResourceGroup, reason: str, detail: str) -> DeleteResult:
    """Nothing deleted: the owner is protected, and so is the rest of its group."""
    primary = group.primary
    assert primary is not None
    skipped = [SkippedResource(kind=primary.kind, id=primary.id, reason=reason)]
    skipped += [SkippedResource(kind=r.kind, id=r.id, reason="owner_skipped")
                for r in group.resources if r.id != primary.id]
    return DeleteResult(status=DeleteStatus.PROTECTED, skipped=tuple(skipped), protection=reason,
                        protection_detail=detail)


def _snapshot(r: CloudResource) -> Resource:
    return Resource(kind=r.kind, id=r.id, region=r.region, state=r.state, tags=dict(r.tags),
                    created_at=r.created_at, attached_to=r.attached_to, controller=r.controller,
                    protection=r.protection)
