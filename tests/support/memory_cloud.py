"""An in-memory cloud for pipeline tests, the simulation and benchmarks. Like a real
cloud it contributes only its listing and the deletion's operations (SAFETY.md rule 21):
``MemoryOperations`` implements the port ``providers.operations.Operations`` (and
``MemorySnapshots`` the snapshot operations); the steps of a deletion are the product's
own (``deletion.delete_group``), so what a test proves about deleting is the product's
code, not a copy of it.

What the cloud models, so that the product's checks matter (each stays out of the way
unless a test or the simulation sets it up):

- names: every resource has one (its id unless given). A delete call addresses a
  resource by its name, as GCP does, and names can be reused (``rename``, ``create(name=)``);
  the operations check, right before the call, that the name still names the id they
  read (``operations.Replaced``). A hook armed with ``after_read`` runs once a deletion
  has read the resource, at the cloud's first request that is not a read by id (the
  check of a name, a call): how the simulation reuses a name between a deletion's last
  read and its call, however many times the deletion reads it first;
- devices: an attachment has a device name and a time; an instance names its root device
  and was launched at ``created_at``. A root volume swapped in on a stopped instance later
  is not its own (``operations.attached_at_launch``), whatever its flags;
- use from outside a group: a resource attached to an instance that is not terminated
  cannot be deleted (``ResourceInUse``, as EC2's ``VolumeInUse``), nor can a snapshot an
  image uses (``used_by``: ``InvalidSnapshot.InUse``); a resource is detached only from
  an instance that is gone;
- snapshots: creation time, source volume, progress; listed only for retention, only the
  deleter's own, and only past the retention, on the wall clock as the real listings do;
- spot requests: a ``persistent`` request launches a replacement once its instance is
  terminated, unless it was cancelled first;
- termination: an instance shuts down for ``terminate_lag`` reads of the deletion's
  operations before it is gone; its dependents are detached then;
- SAFETY.md rule 14 as the real adapters meet it: an instance a controller manages
  (``controller``, listed like the AWS adapter's controller tags), one with a deletion
  protection the listing shows (``protection``, GCP ``deletionProtection``) or one with
  AWS termination protection (``termination_protected``: no listing shows it, the
  operations read the attribute, and a terminate call is refused).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ProviderError, ProviderUnavailable, ResourceInUse
from orphan_cleanup.core.journal import NO_JOURNAL, Journal, journaled
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteResult
from orphan_cleanup.providers import operations, snapshots
from orphan_cleanup.providers.base import group_resources
from orphan_cleanup.providers.deletion import OperationsProvider, targets_of
from orphan_cleanup.providers.operations import (
    DeleteRefused,
    Doomed,
    Live,
    Operations,
    Readiness,
    Replaced,
    Target,
)
from orphan_cleanup.providers.snapshots import SnapshotFacts

PREFIX = {"instance": "i", "volume": "vol", "network-interface": "eni", "security-group": "sg",
          "address": "eipalloc", "disk": "disk", "snapshot": "snap", "spot-request": "sir"}
#: The device of an instance's own root volume (AWS ``RootDeviceName``).
ROOT_DEVICE = "/dev/sda1"
#: A snapshot's progress (``SnapshotFacts.progress``); anything else failed.
SNAPSHOT_PROGRESS = {"ready": "ready", "pending": "pending"}


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
    name: str = ""  # what a delete call addresses (the id unless given); names can be reused
    device: str | None = None  # the device name it is attached at
    attached_at: datetime | None = None  # when it was attached
    root_device: str | None = None  # an instance: the device of its own root volume
    stopped: bool = False  # an instance: stopped (still ACTIVE for a deletion: it exists)
    spot_request: str | None = None  # an instance: the spot request that launched it
    persistent: bool = False  # a spot request: launches a replacement of its terminated instance
    source_id: str | None = None  # a snapshot: the volume it was taken of
    progress: str = "ready"  # a snapshot: ready | pending | failed
    used_by: str | None = None  # what outside every group uses it (an image using a snapshot)
    size_gb: int = 8


@dataclass(frozen=True)
class Attachment:
    """What an instance's read says is attached to it."""

    id: str
    kind: ResourceKind
    device: str | None
    attached_at: datetime | None
    auto_delete: bool


@dataclass(frozen=True)
class Item:
    """One read's answer (``Live.item``): the resource as it was then, and, for an
    instance, what was attached to it then. Never the cloud's record itself: a later
    rename or swap does not change what a read said."""

    resource: CloudResource
    attachments: tuple[Attachment, ...] = ()


class TerminationRefused(ProviderError):
    """The terminate call was refused: the instance has termination protection."""


#: The requests that read by id (``describe``, the attribute read): the hooks armed on a
#: read wait past them for the next check or call.
READS = frozenset({"describe", "describe_attribute"})


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
    # The progress of a snapshot the deleter takes (``snapshot_before_delete``).
    snapshot_progress: str = "ready"
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _after_read: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    _before_call: list[Callable[[], None]] = field(default_factory=list)

    # ---- what tests and platforms do ----------------------------------------------------

    def create(self, kind: ResourceKind, region: str, tags: dict[str, str] | None = None, *,
               attached_to: str | None = None, created_at: datetime | None = None, name: str | None = None,
               device: str | None = None, auto_delete: bool = False, attached_at: datetime | None = None) -> str:
        rid = f"{PREFIX[kind.value]}-{next(self._ids):08x}"
        state = ResourceState.ACTIVE if kind is ResourceKind.INSTANCE or attached_to else ResourceState.AVAILABLE
        when = created_at or datetime.now(UTC)
        with self._lock:
            self.resources[rid] = CloudResource(
                kind, rid, region, dict(tags or {}), when, state, attached_to, name=name or rid,
                device=device if attached_to else None, auto_delete=auto_delete,
                attached_at=(attached_at or when) if attached_to else None,
                root_device=ROOT_DEVICE if kind is ResourceKind.INSTANCE else None)
        return rid

    def exists(self, rid: str) -> bool:
        r = self.resources.get(rid)
        return r is not None and r.state is not ResourceState.TERMINATED

    def attach(self, rid: str, instance_id: str, *, device: str | None = None, at: datetime | None = None,
               auto_delete: bool = False) -> None:
        r = self.resources[rid]
        r.attached_to, r.device, r.auto_delete = instance_id, device, auto_delete
        r.attached_at = at or datetime.now(UTC)
        r.state = ResourceState.ACTIVE

    def detach(self, rid: str) -> None:
        r = self.resources[rid]
        r.attached_to, r.device, r.attached_at, r.auto_delete = None, None, None, False
        if r.state is ResourceState.ACTIVE:
            r.state = ResourceState.AVAILABLE

    def rename(self, rid: str, name: str) -> None:
        self.resources[rid].name = name

    def after_read(self, rid: str, hook: Callable[[], None]) -> None:
        """Run ``hook`` once ``rid`` has been read by a deletion, at the cloud's first request
        after that which is not a read by id: between the deletion's last read and its call."""
        self._after_read.setdefault(rid, []).append(hook)

    # ---- the provider's side of a request ------------------------------------------------

    def request(self, call: str, region: str) -> None:
        """One API request in ``region``: refused when the region fails; unless it is a read
        by id, the hooks due before a call run first (what happened since the reads)."""
        if region in self.unavailable_regions:
            raise ProviderUnavailable(f"{region} is unavailable", region=region)
        if region in self.failing_regions:
            raise ProviderError(f"{region} failed", region=region)
        self.calls[call] += 1
        if call in READS:
            return None
        hooks, self._before_call = self._before_call, []
        for hook in hooks:
            hook()

    def describe(self, rid: str, *, progress: bool = True) -> Item | None:
        """A read by id: None when it is gone. With ``progress`` (a deletion's read) an
        instance shutting down moves on (one read of ``terminate_lag``), as time passes between
        a deletion's reads, and the hooks armed on this read (``after_read``) are due; a
        read-only look (``holds_instance``, ``created_times``) does neither."""
        with self._lock:
            r = self.resources.get(rid)
            if r is None:
                return None
            if progress and r.kind is ResourceKind.INSTANCE and r.state is ResourceState.TERMINATING:
                if r.terminating_reads > 0:
                    r.terminating_reads -= 1
                else:
                    self.finish_termination(r)
            if r.state is ResourceState.TERMINATED:
                return None
            attachments = tuple(Attachment(d.id, d.kind, d.device, d.attached_at, d.auto_delete)
                                for d in self.resources.values()
                                if d.attached_to == rid and d.state is not ResourceState.TERMINATED) \
                if r.kind is ResourceKind.INSTANCE else ()
            item = Item(dataclasses.replace(r, tags=dict(r.tags)), attachments)
        if progress:
            self._before_call.extend(self._after_read.pop(rid, ()))
        return item

    def named(self, kind: ResourceKind, region: str, name: str) -> str | None:
        """The id of the resource of ``kind`` that ``name`` names in ``region`` now."""
        with self._lock:
            for r in self.resources.values():
                if r.kind is kind and r.region == region and r.name == name and r.state is not ResourceState.TERMINATED:
                    return r.id
        return None

    def delete_named(self, kind: ResourceKind, region: str, name: str) -> str | None:
        """The delete call: acts on whatever ``name`` names when the call arrives. An
        instance shuts down, taking its auto-delete attachments along; anything else goes
        at once unless something uses it. Returns the id acted on (None: nothing)."""
        with self._lock:
            rid = self.named(kind, region, name)
            if rid is None:
                return None
            r = self.resources[rid]
            if kind is ResourceKind.INSTANCE:
                if r.termination_protected:
                    raise TerminationRefused(f"{rid}: OperationNotPermitted (disableApiTermination)", region=region)
                if r.state is ResourceState.ACTIVE:
                    r.state, r.terminating_reads = ResourceState.TERMINATING, self.terminate_lag
                    self.deleted.append(rid)
                    for b in list(self.resources.values()):
                        if b.attached_to == rid and b.auto_delete and b.state is not ResourceState.TERMINATED:
                            b.attached_to, b.state = None, ResourceState.TERMINATED
                            self.deleted.append(b.id)
                return rid
            if kind is ResourceKind.SPOT_REQUEST:  # a cancel: the instance it launched stays
                r.state = ResourceState.TERMINATED
                return rid
            holder = self.resources.get(r.attached_to or "")
            if holder is not None and holder.state is not ResourceState.TERMINATED:
                raise ResourceInUse(f"{rid} is in use by {holder.id}", region=region)
            if r.used_by is not None:
                raise ResourceInUse(f"{rid} is in use by {r.used_by}", region=region)
            r.state, r.attached_to = ResourceState.TERMINATED, None
            self.deleted.append(rid)
            return rid

    def finish_termination(self, r: CloudResource) -> None:
        """An instance is gone: its attachments are detached, and a persistent spot request
        that was not cancelled launches a replacement."""
        r.state = ResourceState.TERMINATED
        for dep in self.resources.values():
            if dep.attached_to == r.id:
                if dep.kind is ResourceKind.SPOT_REQUEST:
                    continue
                dep.attached_to, dep.device, dep.attached_at = None, None, None
                if dep.state is ResourceState.ACTIVE:
                    dep.state = ResourceState.AVAILABLE
        request = self.resources.get(r.spot_request or "")
        if request is not None and request.persistent and request.state is not ResourceState.TERMINATED:
            new = self.create(ResourceKind.INSTANCE, r.region, dict(r.tags))
            self.resources[new].spot_request = request.id
            request.attached_to = new
            self.replaced(r, self.resources[new])

    def replaced(self, old: CloudResource, new: CloudResource) -> None:
        """A spot request launched ``new`` in place of ``old`` (a seam for the simulation)."""


# ---- the deletion's operations -----------------------------------------------------------


@dataclass(frozen=True)
class MemoryKind:
    kind: ResourceKind
    depends_on: tuple[ResourceKind, ...] = ()


KINDS: Mapping[ResourceKind, MemoryKind] = {k.kind: k for k in (
    MemoryKind(ResourceKind.INSTANCE),
    MemoryKind(ResourceKind.SPOT_REQUEST, (ResourceKind.INSTANCE,)),
    MemoryKind(ResourceKind.ADDRESS, (ResourceKind.INSTANCE,)),
    MemoryKind(ResourceKind.NETWORK_INTERFACE, (ResourceKind.INSTANCE, ResourceKind.ADDRESS)),
    MemoryKind(ResourceKind.VOLUME, (ResourceKind.INSTANCE,)),
    MemoryKind(ResourceKind.DISK, (ResourceKind.INSTANCE,)),
    MemoryKind(ResourceKind.SECURITY_GROUP, (ResourceKind.INSTANCE, ResourceKind.NETWORK_INTERFACE)),
    MemoryKind(ResourceKind.SNAPSHOT, (ResourceKind.INSTANCE, ResourceKind.VOLUME, ResourceKind.DISK)),
)}


class MemoryOperations(Operations):
    """``operations.Operations`` over a ``MemoryCloud`` in one region. Every fact comes from
    the cloud's answer to a read by id made here (rule 21); every mutating call goes
    through ``_mutate`` (journaled, rule 19)."""

    kinds = KINDS

    def __init__(self, cloud: MemoryCloud, region: str) -> None:
        self.cloud = cloud
        self.region = region
        self.snapshots = MemorySnapshots(self)

    # -- reads ---------------------------------------------------------------------------

    def read(self, targets: Sequence[Target]) -> dict[str, operations.Read]:
        return {t.id: self._read(t) for t in targets}

    def _read(self, target: Target) -> Live | None:
        self.cloud.request("describe", target.location)
        item = self.cloud.describe(target.id)
        if item is None or item.resource.kind is not target.kind or item.resource.region != target.location:
            return None  # not found where it was looked up (another region's, another kind's id)
        r = item.resource
        return Live(target, dict(r.tags), r.state, item, r.state.value)

    def created_at(self, live: Live) -> datetime | None:
        return live.item.resource.created_at  # type: ignore[no-any-return]

    # -- the owner -----------------------------------------------------------------------

    def protection(self, owner: Live, remembered: str | None) -> tuple[str, str] | None:
        """A controller or the listed protection as read now, then the termination
        protection attribute, which only this read shows (always readable here)."""
        r = owner.item.resource
        if r.controller is not None:
            return "managed_by_controller", f"{owner.id} is managed by {r.controller}"
        if r.protection is not None:
            return r.protection, f"{owner.id} has {r.protection}"
        self.cloud.request("describe_attribute", owner.target.location)
        now = self.cloud.resources.get(owner.id)
        if now is not None and now.termination_protected:
            return "termination_protection", f"{owner.id} has disableApiTermination True"
        return None

    def uses(self, owner: Live, members: Sequence[Live]) -> set[str]:
        """What the owner's read shows attached to it, and its spot request."""
        used = {a.id for a in owner.item.attachments} | {owner.item.resource.spot_request}
        return {m.id for m in members if m.id in used}

    def blast(self, owner: Live, members: Mapping[str, Live]) -> list[Doomed]:
        """The auto-delete attachments the owner's read names, each read now (a member's
        read may serve); its own root volume is the one at its root device attached at
        launch, judged on the attach time and the launch time read now."""
        instance = owner.item.resource
        out: list[Doomed] = []
        for a in owner.item.attachments:
            if not a.auto_delete:
                continue
            live = members.get(a.id) or self._read(Target(a.kind, a.id, owner.target.location))
            if live is None:
                continue  # gone already: nothing goes with the call
            own = a.device is not None and a.device == instance.root_device \
                and operations.attached_at_launch(a.attached_at, instance.created_at)
            out.append(Doomed(a.kind, a.id, live, own))
        return out

    def replaced_by(self, owner: Live) -> Live | None:
        """The instance's spot request when it is persistent and not cancelled."""
        rid = owner.item.resource.spot_request
        if rid is None:
            return None
        request = self._read(Target(ResourceKind.SPOT_REQUEST, rid, owner.target.location))
        return request if request is not None and request.item.resource.persistent else None

    # -- calls ---------------------------------------------------------------------------

    def delete(self, live: Live, journal: Journal, blast: Sequence[str] = ()) -> Live | None:
        kind, where, name = live.target.kind, live.target.location, live.item.resource.name
        if not self._still_named(live):
            return None
        call = {ResourceKind.INSTANCE: "terminate", ResourceKind.SPOT_REQUEST: "cancel"}.get(kind, "delete")
        try:
            self._mutate(call, live, lambda: self.cloud.delete_named(kind, where, name), journal=journal, blast=blast)
        except TerminationRefused as refused:
            raise DeleteRefused("termination_protection", f"{live.id}: terminate refused ({refused})") from refused
        return self._read(live.target)  # confirmed by a re-read by id, never assumed (seed 002)

    def _still_named(self, live: Live) -> bool:
        """Whether the name the call takes still names ``live`` (False: nothing does, it is
        gone); ``Replaced`` when it names another resource now. One request before the call."""
        where = live.target.location
        self.cloud.request("get", where)
        now = self.cloud.named(live.target.kind, where, live.item.resource.name)
        if now is not None and now != live.id:
            raise Replaced(f"{live.item.resource.name} names {now} now, not {live.id}: nothing is deleted",
                           region=where)
        return now is not None

    def _mutate(self, call: str, live: Live, act: Callable[[], object], *, journal: Journal,
                blast: Sequence[str] = ()) -> None:
        """One mutating call: journaled (intent before, result after: rule 19), one request."""
        with journaled(journal, f"memory:{call}", live.id, region=live.target.location, blast=list(blast)) as entry:
            try:
                self.cloud.request(call, live.target.location)
                self._act(call, live, act)
            except TerminationRefused:
                entry.outcome = "refused"
                raise

    def _act(self, call: str, live: Live, act: Callable[[], object]) -> None:
        """The cloud acting on one call (a seam: the simulation watches every call here)."""
        act()

    def ready(self, live: Live, owner_id: str | None, ours: Callable[[Live], bool], journal: Journal) -> Readiness:
        """A snapshot once taken; anything else once nothing holds it: detached from an
        instance that is gone, never from a live one."""
        r = live.item.resource
        if live.target.kind is ResourceKind.SNAPSHOT:
            return Readiness.READY if r.progress != "pending" else Readiness.NOT_YET
        if r.attached_to is None:
            return Readiness.READY
        held = self._holder(r.attached_to, owner_id, live.target.location)
        if held is Readiness.READY and live.target.kind is not ResourceKind.SPOT_REQUEST:
            self._mutate("detach", live, lambda: self.cloud.detach(live.id), journal=journal)
        return held

    def _holder(self, instance_id: str, owner_id: str | None, where: str) -> Readiness:
        """What the instance holding a dependent means now: gone: ready (detach it); the
        group's owner, or one shutting down: not yet; any other: in use."""
        self.cloud.request("describe", where)
        holder = self.cloud.describe(instance_id)
        if holder is None:
            return Readiness.READY
        if instance_id == owner_id or holder.resource.state is ResourceState.TERMINATING:
            return Readiness.NOT_YET
        return Readiness.IN_USE


class MemorySnapshots:
    """``providers.snapshots.SnapshotOperations`` of the memory cloud: the deleter names
    its snapshots (``oc-<ref>-<volume id>``, as on GCP) and tags them."""

    def __init__(self, ops: MemoryOperations) -> None:
        self.ops = ops

    @staticmethod
    def name_for(ref: str, volume_id: str) -> str | None:
        return f"oc-{ref}-{volume_id}"

    def facts(self, live: Live) -> SnapshotFacts:
        return facts_of(live.item.resource)

    def of_volume(self, volume: Live, *, tag_key: str, ref: str) -> list[SnapshotFacts]:
        cloud, where = self.ops.cloud, volume.target.location
        cloud.request("get", where)
        rid = cloud.named(ResourceKind.SNAPSHOT, where, self.name_for(ref, volume.id) or "")
        item = cloud.describe(rid) if rid is not None else None
        return [] if item is None else [facts_of(item.resource)]

    def take(self, volume: Live, *, name: str | None, tags: Mapping[str, str], journal: Journal) -> str:
        cloud, where = self.ops.cloud, volume.target.location
        if name is None:
            raise ProviderError(f"a snapshot of {volume.id} needs a name", region=where)

        def create() -> None:
            sid = cloud.create(ResourceKind.SNAPSHOT, where, dict(tags), name=name)
            cloud.resources[sid].source_id, cloud.resources[sid].progress = volume.id, cloud.snapshot_progress

        self.ops._mutate("snapshot", volume, create, journal=journal)
        return name


def facts_of(r: CloudResource) -> SnapshotFacts:
    return SnapshotFacts(id=r.id, tags=dict(r.tags), source_id=r.source_id, name=r.name, created_at=r.created_at,
                         progress=SNAPSHOT_PROGRESS.get(r.progress), state=r.progress)  # type: ignore[arg-type]


# ---- the provider port ---------------------------------------------------------------------


@dataclass
class Deletion:
    """One group's deletion through ``MemoryProvider.deleting``: its operations, its result."""

    ops: MemoryOperations
    result: DeleteResult | None = None



class MemoryProvider(OperationsProvider):
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
                listed = [listed_resource(r) for r in self.cloud.resources.values()
                          if r.region == region and r.state is not ResourceState.TERMINATED
                          and self.tag_key in r.tags and self._listable(r)]
            yield RegionListing(region=region, groups=tuple(group_resources(listed, self.tag_key)))

    def _listable(self, r: CloudResource) -> bool:
        """Rule 15: a snapshot is listed only for retention, only one the deleter took, and
        only past the retention (the product's rule, on the wall clock as the real listings)."""
        if r.kind is not ResourceKind.SNAPSHOT:
            return True
        retain = self.backend.settings.retain_snapshots_days
        return retain is not None and snapshots.listable(facts_of(r), tag_key=self.tag_key, retain_days=retain,
                                                         now=datetime.now(UTC), name_for=MemorySnapshots.name_for)

    def operations(self, region: str) -> MemoryOperations:
        return MemoryOperations(self.cloud, region)

    @contextmanager
    def deleting(self, group: ResourceGroup) -> Iterator[Deletion]:
        """One group's deletion: its operations, and its result once ``delete_group`` gave
        it (a seam: the simulation puts its faults and checks around it)."""
        yield Deletion(self.operations(group.region))

    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        try:
            self.cloud.request("describe", region)
        except ProviderError:
            return False  # cannot confirm, so no
        item = self.cloud.describe(instance_id, progress=False)
        return (item is not None and item.resource.kind is ResourceKind.INSTANCE and item.resource.region == region
                and item.resource.tags.get(self.tag_key) == ref)

    def holds_volume(self, region: str, volume_id: str, ref: str) -> bool:
        """Rule 17 for a volume owner: ``volume_id`` is now a volume (or disk) of this account in
        ``region`` carrying ``ref`` and not being deleted (read-only, no ``progress``)."""
        try:
            self.cloud.request("describe", region)
        except ProviderError:
            return False  # cannot confirm, so no
        item = self.cloud.describe(volume_id, progress=False)
        return (item is not None and item.resource.kind in (ResourceKind.VOLUME, ResourceKind.DISK)
                and item.resource.region == region and item.resource.tags.get(self.tag_key) == ref
                and item.resource.state not in (ResourceState.TERMINATING, ResourceState.TERMINATED))

    def created_times(self, group: ResourceGroup) -> dict[str, datetime | None]:
        """Read-only, as the adapters' (a shutting-down instance does not move on: no
        ``progress``), each resource by its id where the group says it is."""
        targets_of(group, KINDS)  # a shape no listing produces is refused, as by the deletion
        out: dict[str, datetime | None] = {}
        for r in group.resources:
            self.cloud.request("describe", r.region)
            item = self.cloud.describe(r.id, progress=False)
            if item is not None and item.resource.kind is r.kind and item.resource.region == r.region:
                out[r.id] = item.resource.created_at
        return out

    def instance_created_at(self, instance: Resource) -> datetime | None:
        self.cloud.request("describe", instance.region)
        item = self.cloud.describe(instance.id, progress=False)
        if item is None or item.resource.kind is not ResourceKind.INSTANCE or item.resource.region != instance.region:
            return None
        return item.resource.created_at

    def group_operations(self, group: ResourceGroup) -> MemoryOperations:
        if outside := sorted({r.region for r in group.resources} - {group.region}):
            raise ProviderError(f"group {group.key} names {', '.join(outside)}, not its region", region=group.region)
        return self.operations(group.region)

    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        """The product's deletion (``OperationsProvider.delete_with``), inside the ``deleting``
        seam: no step of it is the memory cloud's."""
        self.group_operations(group)
        with self.deleting(group) as call:
            call.result = self.delete_with(call.ops, group, journal, remembered_protection=remembered_protection,
                                           known_attached=known_attached)
        return call.result


def listed_resource(r: CloudResource) -> Resource:
    """A resource as the listing shows it."""
    return Resource(kind=r.kind, id=r.id, region=r.region, state=r.state, tags=dict(r.tags),
                    created_at=r.created_at, attached_to=r.attached_to, controller=r.controller,
                    protection=r.protection)

