"""The simulated provider: ``MemoryCloud`` behind the real provider port, with
the behaviours and faults of a real cloud.

Behaviours (they stay on in the settle phase): a new resource shows up in
listings only after a listing lag; a terminated one keeps showing for a while
(a stale listing, a "ghost"); a terminated instance stays shutting-down for a
while. Faults (they stop in the settle phase): a region's listing fails
(error, unavailable, timeout, throttled), the whole listing raises, a delete
call fails before acting (unavailable, throttled, error) or times out after it
acted, and other pieces of the cleanup run while a provider delete is in
flight (a concurrent deleter, an overlapping lister).

``SimProvider`` subclasses ``MemoryProvider``: deletion is the product's own algorithm
(``deletion.delete_group``) over the memory cloud's operations (SAFETY.md rule 21), with
the faults and checks around it (``SimProvider.deleting``) and on every call the cloud acts
on (``SimOperations``); only the listing is re-implemented, to apply lag and ghosts, on top
of the real ``group_resources``.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from orphan_cleanup.core.backends import DEFAULT_CONTROLLER_TAG_KEYS, SNAPSHOT_SOURCE_KEY, Backend
from orphan_cleanup.core.errors import (
    ProviderError,
    ProviderThrottled,
    ProviderTimeout,
    ProviderUnavailable,
)
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.providers.base import describe_error, group_resources
from orphan_cleanup.providers.operations import Live
from tests.sim.owners import PROTECT_KEYS
from tests.sim.world import EPOCH
from tests.support.memory_cloud import (
    ROOT_DEVICE,
    CloudResource,
    Deletion,
    MemoryCloud,
    MemoryOperations,
    MemoryProvider,
)

if TYPE_CHECKING:
    from tests.sim.engine import Simulation

GONE = (ResourceState.TERMINATING, ResourceState.TERMINATED)
#: The listing keeps this much of each message for its envelope (``cycle/lister.py``): what
#: is left is the room for groups (rule 20).
ENVELOPE = 4096


@dataclass
class ResMeta:
    """What the simulation knows about a resource that the cloud does not."""

    origin: str  # platform | copy | foreign
    owner_id: str | None
    attempt: int | None
    visible_at: datetime
    terminating_since: datetime | None = None
    terminated_at: datetime | None = None
    ghost_for: int = 0  # seconds a terminated resource keeps showing in listings
    shutdown_for: int = 0  # seconds a terminating instance takes to terminate
    replaced: bool = False  # a controller re-created this instance after it went (rule 14)
    of_instance: str | None = None  # a root volume: the instance it was launched with


@dataclass
class ListingRecord:
    """One listing as the provider saw it, attached to every cycle it fed (the cycles
    whose batches were published while it ran: one, or several for a shared listing)."""

    backend: str  # the backend whose provider listed (the first of a shared listing)
    scope: tuple[object, ...]  # what it covered: the account it reached, its backend's regions, keys, role
    regions: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    crashed: bool = False
    groups: int = 0
    at: datetime | None = None  # simulated time of the first listing call (C1, A1)
    order: int = 0  # when it started, in the checker's order of events (P2)
    # O1 (rule 20): groups listed per region, those too large for one message even reduced,
    # and the regions with a group too close to that limit for the simulation to judge.
    region_groups: dict[str, int] = field(default_factory=dict)
    huge: dict[str, int] = field(default_factory=dict)
    borderline: set[str] = field(default_factory=set)


def listing_scope(account: str, regions: tuple[str, ...] | list[str], tag_key: str, protect_key: str,
                  role_arn: str | None) -> tuple[object, ...]:
    """What one listing covers: the account, the regions, the tag keys and the credentials.
    A cycle may be fed only by a listing of its own backend's scope (I2)."""
    return (account, tuple(sorted(set(regions))), tag_key, protect_key, role_arn)


class SimCloud(MemoryCloud):
    """One account (``account``: what its credentials reach), plus the
    simulation's metadata about each resource. Resource ids of different
    clouds never collide (``id_base``)."""

    def __init__(self, account: str, id_base: int = 0) -> None:
        super().__init__()
        self.account = account
        self._ids = itertools.count(id_base + 1)
        self.meta: dict[str, ResMeta] = {}
        self.now = EPOCH  # the simulated time of the last tick
        self.roots = False  # instances launch with their own root volume (the swap world)
        self.spot_rng: random.Random | None = None  # the platform's VMs are sometimes spot (the spot world)

    def add(self, kind: ResourceKind, region: str, tags: dict[str, str], *, now: datetime, meta: ResMeta,
            attached_to: str | None = None) -> str:
        rid = self.create(kind, region, tags, attached_to=attached_to, created_at=now)
        self.meta[rid] = meta
        if kind is ResourceKind.INSTANCE:
            if self.roots:  # the swap world: every instance launches with its own root volume
                root_volume(self, rid, meta, now)
            if self.spot_rng is not None and meta.origin == "platform" and self.spot_rng.random() < 0.4:
                spot_request(self, rid, self.spot_rng, meta, now)  # the spot world
        return rid

    def replaced(self, old: CloudResource, new: CloudResource) -> None:
        """A persistent spot request relaunched ``old`` as ``new``: as fresh as can be."""
        new.created_at = self.now
        m = self.meta.get(old.id)
        if m is not None:
            self.meta[new.id] = dataclasses.replace(m, origin="spot", visible_at=self.now, terminating_since=None,
                                                    terminated_at=None, replaced=False)
            if self.roots:
                root_volume(self, new.id, self.meta[new.id], self.now)

    def tick(self, now: datetime) -> None:
        """Provider-side progress: shutting-down instances terminate after a while."""
        self.now = now
        for res in list(self.resources.values()):
            m = self.meta.get(res.id)
            if m is None:
                continue
            if res.state is ResourceState.TERMINATING:
                if m.terminating_since is None:
                    m.terminating_since = now
                elif now - m.terminating_since >= timedelta(seconds=m.shutdown_for):
                    self.finish_termination(res)
            if res.state is ResourceState.TERMINATED and m.terminated_at is None:
                m.terminated_at = now
        for res in list(self.resources.values()):
            m = self.meta.get(res.id)
            if res.controller is not None and res.state in GONE and m is not None and not m.replaced:
                # The controller replaces what it lost (an ASG's health check): the same
                # launch template, so the same tags, under a new id, as fresh as can be.
                m.replaced = True
                new = self.add(res.kind, res.region, dict(res.tags), now=now, meta=dataclasses.replace(
                    m, origin="controller", visible_at=now, terminating_since=None, terminated_at=None,
                    replaced=False))
                self.resources[new].controller = res.controller

    def snapshot(self) -> dict[str, tuple[ResourceState, tuple[tuple[str, str], ...], str | None]]:
        """Each resource's state, tags and what it is attached to, now."""
        return {rid: (r.state, tuple(sorted(r.tags.items())), r.attached_to) for rid, r in self.resources.items()}


class SimProvider(MemoryProvider):
    def __init__(self, backend: Backend, cloud: SimCloud, sim: Simulation) -> None:
        super().__init__(backend, cloud)
        self.sim_cloud = cloud
        self.sim = sim

    # ---- listing -------------------------------------------------------------

    def iter_listing(self) -> Iterator[RegionListing]:
        sim = self.sim
        b = self.backend
        scope = listing_scope(self.sim_cloud.account, b.regions, b.settings.tag_key, b.settings.protect_tag_key,
                              b.settings.role_arn)
        sim.listing_record = record = ListingRecord(backend=b.id, scope=scope, order=next(sim.checker.order))
        for region in b.regions:
            self.cloud.calls["list"] += 1
            if record.at is None:
                record.at = sim.clock()
            sim.checker.provider_call(self.backend, self.sim_cloud, f"list {region}")
            record.regions.append(region)
            failure = self._region_failure(region)
            if failure is not None:
                record.failures.append(region)
                sim.trace(f"provider: listing {region} failed ({failure})")
                yield RegionListing(region=region, failure=failure)
                continue
            if sim.dice.roll("listing_crash"):
                record.crashed = True
                sim.trace(f"provider: listing raised in {region}")
                raise ProviderError(f"listing of {region} raised (injected)", region=region)
            groups = group_resources(self._visible(region, sim.clock()), self.tag_key)
            record.groups += len(groups)
            self._measure(record, region, groups)
            yield RegionListing(region=region, groups=tuple(groups))

    def _measure(self, record: ListingRecord, region: str, groups: list[ResourceGroup]) -> None:
        """O1's facts: which groups no message can carry, even reduced to what matters."""
        limit = self.sim.listing_q.max_message_bytes - ENVELOPE
        keep = frozenset({self.tag_key, SNAPSHOT_SOURCE_KEY, *PROTECT_KEYS, *DEFAULT_CONTROLLER_TAG_KEYS})
        record.region_groups[region] = len(groups)
        for g in groups:
            full, small = group_size(g, keep)
            if full <= limit:
                continue
            if abs(small - limit) < 128:
                record.borderline.add(region)
            elif small > limit:
                record.huge[region] = record.huge.get(region, 0) + 1

    def _region_failure(self, region: str) -> str | None:
        if not self.sim.dice.roll("region_failure"):
            return None
        exc = self.sim.rng_cloud.choice([
            ProviderError(f"{region}: InternalError", region=region),
            ProviderUnavailable(f"{region}: service unavailable", region=region),
            ProviderTimeout(f"{region}: read timeout", region=region),
            ProviderThrottled(f"{region}: RequestLimitExceeded", region=region),
        ])
        return describe_error(exc)

    def _visible(self, region: str, now: datetime) -> list[Resource]:
        listed = []
        for r in self.sim_cloud.resources.values():
            if r.region != region or self.tag_key not in r.tags or not self._listable(r):
                continue  # (a snapshot only for retention, and only the deleter's own: rule 15)
            m = self.sim_cloud.meta.get(r.id)
            if m is not None and m.visible_at > now:
                continue  # listing lag: created, not listed yet
            if r.state is ResourceState.TERMINATED:
                if m is None or m.terminated_at is None or now - m.terminated_at >= timedelta(seconds=m.ghost_for):
                    continue
                listed.append(_ghost(r))  # a stale listing still shows it
                continue
            listed.append(_resource(r))
        return listed

    # ---- deletion: the product's algorithm over the memory cloud's operations ----------

    def operations(self, region: str) -> SimOperations:
        return SimOperations(self.sim_cloud, region, self.sim, self.backend, None)

    @contextmanager
    def deleting(self, group: ResourceGroup) -> Iterator[Deletion]:
        """One group's deletion (``deletion.delete_group`` runs inside): the faults before it
        acts, the other pieces of the cleanup that run meanwhile, a timeout after it acted,
        and the checks around it (G1, T1, P2, and what it touched: V1, K1, J1, R1, R2)."""
        sim = self.sim
        cycle = sim._cycle()
        sim.checker.provider_call(self.backend, self.sim_cloud, f"delete {group.key}")
        sim.checker.delete_attempt(cycle, self.backend.id, self.sim_cloud, group)
        sim.checker.delete_reaches(cycle, self.backend, self.sim_cloud, group)
        sim.provider_call_started(group)
        try:
            dice = sim.dice
            if dice.roll("delete_unavailable"):
                raise ProviderUnavailable(f"{group.region}: service unavailable (injected)", region=group.region)
            if dice.roll("delete_throttled"):
                raise ProviderThrottled(f"{group.region}: RequestLimitExceeded (injected)", region=group.region)
            if dice.roll("delete_error"):
                raise ProviderError(f"{group.region}: InternalError (injected)", region=group.region)
            sim.concurrent_work(group)
            before = self.sim_cloud.snapshot()
            call = Deletion(SimOperations(self.sim_cloud, group.region, sim, self.backend, group))
            try:
                yield call
            finally:
                after = self.sim_cloud.resources
                sim.provider_touched(group, [rid for rid, (state, _tags, _on) in before.items()
                                             if after[rid].state in GONE and state not in GONE
                                             and rid not in sim.checker.people_removed], before,
                                     self.backend.settings.retain_snapshots_days)
            if dice.roll("delete_timeout_after"):
                sim.trace(f"provider: delete of {group.key} acted, then timed out")
                raise ProviderTimeout(f"{group.region}: read timeout (injected, after acting)", region=group.region)
            result = call.result
            assert result is not None
            sim.trace(f"provider: delete {group.key} -> {result.status.value}"
                      + (f" skipped={[s.reason for s in result.skipped]}" if result.skipped else ""))
            sim.provider_result(group, result)
        except ProviderError as exc:
            sim.provider_result(group, exc)
            raise
        finally:
            sim.provider_call_finished(group)


class SimOperations(MemoryOperations):
    """The memory cloud's operations, watched: every mutating call is checked as the cloud
    acts on it (N1: a call removes only its target and what goes along with it; U1: never
    detached from a live instance, never what an image uses; P3: no instance terminated
    while a persistent spot request would relaunch it)."""

    def __init__(self, cloud: SimCloud, region: str, sim: Simulation, backend: Backend,
                 group: ResourceGroup | None) -> None:
        super().__init__(cloud, region)
        self.sim, self.backend, self.group = sim, backend, group

    def _act(self, call: str, live: Live, act: Callable[[], object]) -> None:
        cloud, checker = self.cloud, self.sim.checker
        target = cloud.named(live.target.kind, live.target.location, live.item.resource.name)
        checker.provider_acts(self.sim._cycle(), self.group, call, live.id, target, cloud)
        before = {rid: (r.state, r.attached_to, r.auto_delete) for rid, r in cloud.resources.items()}
        try:
            act()
        finally:
            removed = [rid for rid, (state, _on, _auto) in before.items()
                       if cloud.resources[rid].state in GONE and state not in GONE]
            checker.provider_removed(self.sim._cycle(), self.group, call, live.id, removed, before)


def group_size(group: ResourceGroup, keep: frozenset[str]) -> tuple[int, int]:
    """A listed group's size in a message, as listed and reduced to the tags that matter
    (the simulation's own measure, rule 20)."""
    small = group.model_copy(update={"resources": tuple(
        r.model_copy(update={"tags": {k: v for k, v in r.tags.items() if k in keep}, "details": {}})
        for r in group.resources)})
    return len(group.model_dump_json()) + 1, len(small.model_dump_json()) + 1


def spot_request(cloud: SimCloud, rid: str, rng: random.Random, meta: ResMeta, now: datetime) -> None:
    """A spot instance's request, tagged like it (a member of its group)."""
    vm = cloud.resources[rid]
    req = cloud.create(ResourceKind.SPOT_REQUEST, vm.region, dict(vm.tags), attached_to=rid, created_at=now)
    cloud.meta[req] = meta
    cloud.resources[req].persistent = rng.random() < 0.7
    vm.spot_request = req


def root_volume(cloud: SimCloud, rid: str, meta: ResMeta, now: datetime) -> None:
    """An instance's own root volume: untagged, deleted with it, attached at launch."""
    vol = cloud.create(ResourceKind.VOLUME, cloud.resources[rid].region, {}, attached_to=rid, created_at=now,
                       device=ROOT_DEVICE, auto_delete=True, attached_at=now)
    cloud.meta[vol] = ResMeta(origin="root", owner_id=meta.owner_id, attempt=meta.attempt,
                              visible_at=meta.visible_at, of_instance=rid)



def _resource(r: CloudResource) -> Resource:
    return Resource(kind=r.kind, id=r.id, region=r.region, state=r.state, tags=dict(r.tags),
                    created_at=r.created_at, attached_to=r.attached_to, controller=r.controller,
                    protection=r.protection)


def _ghost(r: CloudResource) -> Resource:
    state = ResourceState.ACTIVE if r.kind is ResourceKind.INSTANCE else ResourceState.AVAILABLE
    return Resource(kind=r.kind, id=r.id, region=r.region, state=state, tags=dict(r.tags),
                    created_at=r.created_at, attached_to=None, controller=r.controller, protection=r.protection)
