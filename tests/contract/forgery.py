"""Forged listing messages for the provider contract suite (SAFETY.md rule 21).

A listing batch (``core.messages.ListingBatch``) travels on the listing queue, which anyone
with queue access can write to. ``ForgingQueue`` is the pipeline's in-process listing queue
(``queues.memory.InProcessQueue``, passed through ``Driver.pipeline``) that rewrites every
batch the lister publishes before the classifier reads it: one field (or every field) of
every resource of every group is altered, while the group's ref, region and primary and
each resource's kind, id and region (the lookup the deleter may take from a listing) stay
as they are; anything else in a forged batch is refused by the test (``Forged``).

A forgery is written in the suite's roles (``Driver``): ``victim`` is the role whose link,
name, device or id the forged fields name (the protected disk / volume of someone else
attached to the orphan VM, or the foreign one swapped in as its boot device), ``vm`` the
orphan VM every member is pointed at. What differs per cloud (the details keys, the other
zone, the link a cloud does not list) comes from the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.queues.memory import InProcessQueue
from tests.contract.clouds import Driver

#: What one forgery makes of one resource of a group: the fields to replace (``details``
#: keys are merged into the resource's own details).
Alter = Callable[[Driver, Resource, ResourceGroup, str], Mapping[str, Any]]

#: A size no disk has (more than a 64-bit integer holds), and none at all.
HUGE, NONE = 2**70, 0


def AGED() -> datetime:  # noqa: N802 (a constant, as of now)
    """Ten days ago."""
    return datetime.now(UTC) - timedelta(days=10)

#: A state swapped: listed active (a running VM, an attached disk) reads available, and back.
SWAPPED = {ResourceState.ACTIVE: ResourceState.AVAILABLE, ResourceState.AVAILABLE: ResourceState.ACTIVE,
           ResourceState.TERMINATING: ResourceState.ACTIVE, ResourceState.TERMINATED: ResourceState.ACTIVE}


def _details(**values: Any) -> dict[str, Any]:
    return {"details": values}


def _attached_to(d: Driver, r: Resource, g: ResourceGroup, victim: str) -> Mapping[str, Any]:
    # every member pointed at the orphan VM, the VM itself at the victim: by id, and by link
    # in the users GCP lists (AWS lists none: the forged batch carries them anyway)
    to = victim if r.kind is ResourceKind.INSTANCE else "vm"
    return {"attached_to": d.things[to].id, "details": {"users": [d.link(to)]}}


def _state(d: Driver, r: Resource, g: ResourceGroup, victim: str) -> Mapping[str, Any]:
    swapped = SWAPPED[r.state]
    return {"state": swapped, "details": {d.raw_state_key: swapped.value}}


def _sizes(value: int) -> Alter:
    def alter(d: Driver, r: Resource, g: ResourceGroup, victim: str) -> Mapping[str, Any]:
        return _details(**{d.size_key: value, "gpus": value})
    return alter


FORGERIES: dict[str, Alter] = {
    # GCP lists a self link; AWS lists none: the forged batch carries one anyway
    "self_link": lambda d, r, g, victim: _details(self_link=d.link(victim)),
    "name": lambda d, r, g, victim: _details(name=d.name(victim)),
    "zone": lambda d, r, g, victim: _details(**{d.zone_key: d.other_zone}),
    # neither cloud lists device names: the forged batch carries the victim's anyway
    "device": lambda d, r, g, victim: _details(device_name=d.device(victim)),
    "attached_to": _attached_to,
    # an attacker ages things to get them past the margin: every resource, or all but the
    # group's VM (whose listed creation time the deleter checks against its own read)
    "created_at": lambda d, r, g, victim: {"created_at": AGED()},
    "created_at_members": lambda d, r, g, victim: {} if r.id == g.primary_id else {"created_at": AGED()},
    "state": _state,
    "sizes_zero": _sizes(NONE),
    "sizes_huge": _sizes(HUGE),
    # every listed resource claims the group's ref and no other tag (no protect tag)
    "tags": lambda d, r, g, victim: {"tags": {DEFAULT_TAG_KEY: g.provider_ref}},
    # no controller would re-create anything, no provider protection (rule 14)
    "controller": lambda d, r, g, victim: {"controller": None, "protection": None},
    # nothing is attached to anything: a volume an instance holds looks free to delete
    "detached": lambda d, r, g, victim: {"attached_to": None, "state": ResourceState.AVAILABLE,
                                         "details": {"users": [], d.raw_state_key: "available"}},
}
#: Every field at once (one size: the huge one); and every field with the group's VM's
#: creation time kept, so that the forged batch gets past the deleter's check of it.
ALL, ALL_BUT_VM_CREATED_AT = "all", "all_but_vm_created_at"
#: (``detached`` is a volume owner's forgery: ``attached_to`` and ``state`` already forge a VM's group)
COMBINED: dict[str, tuple[str, ...]] = {
    ALL: tuple(f for f in FORGERIES if f not in ("sizes_zero", "created_at_members", "detached")),
    ALL_BUT_VM_CREATED_AT: tuple(f for f in FORGERIES if f not in ("sizes_zero", "created_at", "detached")),
}


@dataclass(frozen=True)
class Forgery:
    """Which field a scenario's listing batches are forged in (or a ``COMBINED`` set of
    them), naming which role."""

    field: str
    victim: str = "precious"

    def alter(self, d: Driver, r: Resource, g: ResourceGroup) -> dict[str, Any]:
        fields = COMBINED.get(self.field, (self.field,))
        out: dict[str, Any] = {"details": dict(r.details)}
        for name in fields:
            update = dict(FORGERIES[name](d, r, g, self.victim))
            out["details"].update(update.pop("details", {}))
            out.update(update)
        return out

    def group(self, d: Driver, g: ResourceGroup) -> ResourceGroup:
        resources = tuple(r.model_copy(update=self.alter(d, r, g)) for r in g.resources)
        return g.model_copy(update={"resources": resources})


def lookup(g: ResourceGroup) -> tuple[Any, ...]:
    """What a forged batch keeps of a group: its ref, region and primary, and each
    resource's kind, id and region (rule 21: all the deleter may take from a listing)."""
    return (g.provider_ref, g.region, g.primary_id, g.malformed_ref,
            tuple((r.kind, r.id, r.region) for r in g.resources))


class Forged(AssertionError):
    """The forgery changed what it must keep (a bug of the test, not of the product)."""


class ForgingQueue(InProcessQueue):
    """The listing queue, forging every ``ListingBatch`` published on it with ``forgery``.
    ``altered``: the (resource id, field) pairs whose listed value the forgery changed;
    ``forged``: group key -> its resources as published."""

    def __init__(self, driver: Driver, forgery: Forgery) -> None:
        super().__init__()
        self.driver, self.forgery = driver, forgery
        self.altered: list[tuple[str, str]] = []
        self.forged: dict[str, tuple[Resource, ...]] = {}

    def publish(self, message: BaseModel) -> None:
        if isinstance(message, ListingBatch) and message.groups:
            groups = tuple(self.forgery.group(self.driver, g) for g in message.groups)
            for honest, forged in zip(message.groups, groups, strict=True):
                if lookup(honest) != lookup(forged):
                    raise Forged(f"{lookup(honest)} became {lookup(forged)}")
                self.forged[forged.key] = forged.resources
                for before, after in zip(honest.resources, forged.resources, strict=True):
                    self.altered += [(after.id, name) for name in Resource.model_fields
                                     if getattr(before, name) != getattr(after, name)]
            message = message.model_copy(update={"groups": groups})
        super().publish(message)
