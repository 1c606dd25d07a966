"""Compute Engine resource kinds for the GCP adapter: one declarative row each, with the
literal state maps, and the facts read off an item (controllers, protections, places).

Every kind has a numeric ``id`` (uint64, our identity: names are reused after a delete and
instances can be renamed), a ``name`` (what get/delete take), ``labels``,
``creationTimestamp`` and a ``selfLink``. Dependents name what uses them in ``users``. The
deletion orders the kinds by ``depends_on`` (``deletion.delete_order``), as on AWS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal

from orphan_cleanup.core.listing import ResourceKind, ResourceState

ACTIVE, AVAILABLE, TERMINATING = ResourceState.ACTIVE, ResourceState.AVAILABLE, ResourceState.TERMINATING
_literal = MappingProxyType

#: Instance ``status`` -> state as listed. Every status the API shows means the
#: VM still exists: ``TERMINATED`` is GCE's word for *stopped* (restartable, its
#: disks kept), not deleted; a deleted instance simply disappears (404).
#: ``STOPPING`` is ``active`` in a listing: from outside, a stop and a delete
#: look the same. Unknown statuses are ``active`` too (it exists, so fail closed).
INSTANCE_STATES = _literal({
    "PROVISIONING": ACTIVE,
    "STAGING": ACTIVE,
    "RUNNING": ACTIVE,
    "STOPPING": ACTIVE,
    "SUSPENDING": ACTIVE,
    "SUSPENDED": ACTIVE,
    "REPAIRING": ACTIVE,
    "TERMINATED": ACTIVE,
})
#: Instance ``status`` as the deletion reads it: ``STOPPING`` is a deletion under way (no
#: second call); right after *our* delete, ``TERMINATED`` is a stopped VM the operation has
#: not removed yet (``AFTER_DELETE``). Any other status after our delete: it did not take.
INSTANCE_DELETING = _literal({"STOPPING": TERMINATING})
AFTER_DELETE = _literal({"STOPPING": TERMINATING, "TERMINATED": TERMINATING})

#: Disk ``status`` -> state: ``DELETING`` is going; otherwise a disk is ``active`` while an
#: instance uses it (``users``) and ``available`` when none does. The deletion waits for a
#: disk someone else is deleting (``DISK_DELETING``): gone is what its next read says.
DISK_STATES = _literal({"DELETING": TERMINATING})
DISK_DELETING = _literal({"DELETING": ACTIVE})

#: Address ``status`` -> state. ``IN_USE``: assigned to a VM or forwarding rule.
ADDRESS_STATES = _literal({"RESERVING": ACTIVE, "RESERVED": AVAILABLE, "IN_USE": ACTIVE})

#: Snapshot ``status`` -> state as listed. ``FAILED`` exists and may be
#: deleted, like AWS ``error``; ``CREATING``/``UPLOADING`` are still being taken; unknown
#: statuses are ``active`` (exists and may be in use).
SNAPSHOT_STATES = _literal({
    "CREATING": ACTIVE, "UPLOADING": ACTIVE, "READY": AVAILABLE, "FAILED": AVAILABLE, "DELETING": TERMINATING,
})

#: Snapshot ``status`` -> what it means for the disk it was taken of: ``READY`` lets the disk
#: be deleted, ``CREATING``/``UPLOADING`` is "not yet". Any other status (``FAILED``,
#: ``DELETING``, unknown, missing) keeps the disk and fails its group (``providers.snapshots``).
SNAPSHOT_PROGRESS: Mapping[str, Literal["ready", "pending"]] = _literal({
    "READY": "ready", "CREATING": "pending", "UPLOADING": "pending",
})

#: Image ``status`` -> state: ``PENDING`` is still being created, ``READY`` and ``FAILED``
#: exist and may be deleted (nothing holds an image: instances created from it keep running),
#: ``DELETING`` is going; unknown statuses are ``active`` (fail closed).
IMAGE_STATES = _literal({"PENDING": ACTIVE, "READY": AVAILABLE, "FAILED": AVAILABLE, "DELETING": TERMINATING})

#: Aggregated-list scope warnings that are not a failure of that scope.
BENIGN_WARNINGS = frozenset({"NO_RESULTS_ON_PAGE"})


@dataclass(frozen=True, eq=False)  # rows compare by identity; mappings are unhashable
class GcpKind:
    """One resource kind: which client lists, gets and deletes it, where it lives, the
    request field naming it, its state maps, and the kinds that must be gone first."""

    kind: ResourceKind
    client: Literal["instances", "disks", "addresses", "snapshots", "forwarding_rules", "images"]
    scope: Literal["zone", "region", "global"]
    name_field: str  # request field naming the resource in get/delete
    items_field: str  # field of the aggregated scoped list holding the items
    states: Mapping[str, ResourceState]  # ``status`` -> ours, as listed
    default: ResourceState = ACTIVE  # a status the map does not name
    held_by_users: bool = False  # ``users`` non-empty: in use (``active``)
    deleting: Mapping[str, ResourceState] = field(default_factory=dict)  # the deletion's reading, over ``states``
    busy: frozenset[str] = frozenset()  # statuses in which something holds it
    free: frozenset[str] | None = None  # when set: every other status holds it (not final yet)
    depends_on: tuple[ResourceKind, ...] = ()
    primary: bool = False
    # Listed only with ``retain_snapshots_days`` set, by a global ``list`` (no aggregated list).
    retained: bool = False

    @property
    def collection(self) -> str:
        """The REST collection (``forwardingRules``): what permissions and journaled calls name."""
        return "forwardingRules" if self.client == "forwarding_rules" else self.client

    def state(self, item: Any, *, deleting: bool = False) -> ResourceState:
        status = str(getattr(item, "status", "") or "")
        state = (self.deleting.get(status) if deleting else None) or self.states.get(status, self.default)
        if self.held_by_users and state is AVAILABLE and getattr(item, "users", None):
            return ACTIVE
        return state

    def in_use(self, item: Any) -> bool:
        """Whether something holds it now: its ``users``, or a status that holds it."""
        if getattr(item, "users", None):
            return True
        status = str(getattr(item, "status", "") or "")
        return status in self.busy or (self.free is not None and status not in self.free)


INSTANCE = GcpKind(ResourceKind.INSTANCE, "instances", "zone", "instance", "instances", INSTANCE_STATES,
                   deleting=INSTANCE_DELETING, primary=True)
DISK = GcpKind(ResourceKind.DISK, "disks", "zone", "disk", "disks", DISK_STATES, default=AVAILABLE,
               held_by_users=True, deleting=DISK_DELETING, depends_on=(ResourceKind.INSTANCE,))
# After the group's forwarding rules: an address one of them uses is ``IN_USE`` until it is gone.
ADDRESS = GcpKind(ResourceKind.ADDRESS, "addresses", "region", "address", "addresses", ADDRESS_STATES,
                  busy=frozenset({"IN_USE"}), depends_on=(ResourceKind.INSTANCE, ResourceKind.FORWARDING_RULE))
# Never deleted while a disk of its group is still there.
SNAPSHOT = GcpKind(ResourceKind.SNAPSHOT, "snapshots", "global", "snapshot", "snapshots", SNAPSHOT_STATES,
                   free=frozenset({"READY", "FAILED"}), depends_on=(ResourceKind.INSTANCE, ResourceKind.DISK),
                   retained=True)

# A regional forwarding rule (``forwardingRules``; global ones are not listed). It has no
# ``status``: it exists (``active``). Its delete takes nothing else, yet it holds the address
# its ``IPAddress`` names (the address's ``users``), so an address is deleted after the
# forwarding rules of its group (an address a forwarding rule outside the group uses is
# ``in_use``). It never joins an instance's group, even with a target instance behind its
# ``target``: a leftover group of its ref and region, like an unattached address.
FORWARDING_RULE = GcpKind(ResourceKind.FORWARDING_RULE, "forwarding_rules", "region", "forwarding_rule",
                          "forwarding_rules", _literal({}), depends_on=(ResourceKind.INSTANCE,))
# An image (global), placed in the zone of its ``sourceDisk``: one made from anything else
# (a snapshot, another image, a file) or from a disk outside the configured entries is not
# listed (kept). Its delete takes nothing else; nothing holds an image.
IMAGE = GcpKind(ResourceKind.IMAGE, "images", "global", "image", "images", IMAGE_STATES,
                depends_on=(ResourceKind.INSTANCE,))

#: Listing order: instances first, so dependents can follow their instance's entry.
KINDS: tuple[GcpKind, ...] = (INSTANCE, DISK, ADDRESS, FORWARDING_RULE, IMAGE, SNAPSHOT)
KIND_BY_RESOURCE: Mapping[ResourceKind, GcpKind] = _literal({k.kind: k for k in KINDS})


def region_of(location: str) -> str:
    """``us-central1-a`` -> ``us-central1``; a region is returned unchanged
    (regions are ``geo-nameN``, zones add one more ``-suffix``)."""
    return "-".join(location.split("-")[:2])


def listed_kinds(retain_days: int | None) -> tuple[GcpKind, ...]:
    """The kinds a listing reads: snapshots only when they can ever expire."""
    return tuple(k for k in KINDS if not k.retained or retain_days is not None)


#: ``.../projects/P/zones/Z/disks/N``: the zone of a snapshot's ``sourceDisk``.
SOURCE_DISK = re.compile(r"(?:^|/)projects/[^/]+/zones/([a-z]+-[a-z]+\d+-[a-z])/disks/[^/]+$")


def source_zone(snapshot: Any) -> str | None:
    """The zone of the disk a snapshot was taken of, from its ``sourceDisk`` link; None
    when it names no zonal disk (such a snapshot cannot be placed: it is never listed)."""
    link = getattr(snapshot, "source_disk", None)
    m = SOURCE_DISK.search(link) if isinstance(link, str) else None
    return m.group(1) if m else None


def link_key(self_link: str) -> str:
    """The stable part of a self link (``projects/p/zones/z/instances/n``), whatever the host."""
    at = self_link.find("projects/")
    return self_link[at:] if at >= 0 else self_link


def parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except (TypeError, ValueError):
        return None


#: What a managed instance group writes in its members' ``metadata`` (``created-by``).
CREATED_BY = "created-by"
MIG = re.compile(r"(?:^|/)(projects/[^/]+/(?:zones|regions)/[^/]+/instanceGroupManagers/[^/]+)$")


def controller_of(instance: Any) -> str | None:
    """The managed instance group an instance belongs to (SAFETY.md rule 14), from its
    ``metadata.items`` entry ``created-by`` (``projects/P/zones/Z/instanceGroupManagers/N``,
    or ``regions/R``): ``mig:projects/...``; None without that entry. A shape that cannot
    be read (items not a list, an entry or value of another type, a ``created-by`` that
    names no group) names an ``unknown:`` controller: fail closed, never an orphan."""
    metadata = getattr(instance, "metadata", None)
    if metadata is None:
        return None
    items = getattr(metadata, "items", None)
    if items is None:
        return None
    if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        return "unknown:metadata.items is not a list"
    for entry in items:
        key = getattr(entry, "key", None)
        if not isinstance(key, str):
            return "unknown:a metadata item without a string key"
        if key != CREATED_BY:
            continue
        value = getattr(entry, "value", None)
        if not isinstance(value, str):
            return "unknown:created-by is not a string"
        m = MIG.search(value)
        return f"mig:{m.group(1)}" if m else f"unknown:created-by {value[:120]}"
    return None


def protection_of(instance: Any) -> Literal["deletion_protection"] | None:
    """``deletion_protection`` unless the instance's ``deletionProtection`` is exactly
    false (or absent: the API's default). Any other value protects (fail closed)."""
    value = getattr(instance, "deletion_protection", False)
    return None if value is False or value is None else "deletion_protection"
