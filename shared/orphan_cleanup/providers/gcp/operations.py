"""The deletion's operations on Compute Engine (``deletion.Operations``): reads by numeric id,
the facts only GCE shows (managed instance groups, ``deletionProtection``, ``autoDelete``
disks, ``users``) and the calls, each journaled (SAFETY.md rule 19). The steps are
``deletion``'s; nothing here takes a fact from a listing (rule 21).

GCE specifics:

- a read by id is a ``list`` of the resource's zone, region (or the project, for snapshots)
  filtered on ``id`` (``GcpCalls.find``): the API's ``get`` and ``delete`` take names, which
  are reused after a delete and can be changed (``instances.setName``). The name a call
  takes comes from that read, and is checked again by a ``get`` immediately before the call
  (``Replaced`` when it now names another id): the name-reuse window is that one round trip,
  never another call's operation wait;
- protections (rule 14): a managed instance group (metadata ``created-by``) or
  ``deletionProtection``, both on every read;
- the blast (rule 15): the instance's ``autoDelete`` disks, each read by the link the
  instance names; its own boot disk is the one marked ``boot`` that was created with it
  (``creationTimestamp`` within ``AT_LAUNCH`` of the instance's: a boot disk swapped in on a
  stopped VM was created at another time); a local SSD (``SCRATCH``) has no disk resource;
- a disk or address is held by the instances its ``users`` name: the group's own owner (or
  an instance already shutting down) is "not yet", any other user is ``in_use``; an address a
  forwarding rule names in ``users`` is ``in_use`` (the group's own rules are deleted before
  its addresses, ``depends_on``: one still named belongs to another group);
- forwarding rules (regional) and images (global) are read, re-read by name and deleted like
  any kind: nothing holds them and their delete takes nothing else (no blast).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import Journal
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.providers.gcp.calls import GcpCalls
from orphan_cleanup.providers.gcp.kinds import (
    AFTER_DELETE,
    DISK,
    INSTANCE,
    KIND_BY_RESOURCE,
    GcpKind,
    controller_of,
    link_key,
    parse_time,
    protection_of,
)
from orphan_cleanup.providers.gcp.snapshots import GcpSnapshots
from orphan_cleanup.providers.operations import (
    UNREAD,
    Changed,
    Doomed,
    Live,
    Operations,
    Read,
    Readiness,
    Replaced,
    Target,
    attached_at_launch,
)

#: ``.../projects/P/zones/Z/disks/N``: an attached disk's ``source``; ``.../instances/N``: a user.
DISK_LINK = re.compile(r"(?:^|/)projects/([^/]+)/zones/([a-z]+-[a-z]+\d+-[a-z])/disks/"
                       r"([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$")
INSTANCE_LINK = re.compile(r"(?:^|/)projects/([^/]+)/zones/([a-z]+-[a-z]+\d+-[a-z])/instances/"
                           r"([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$")


def own_boot_disk(disk: Any, launched: datetime | None) -> bool:
    """Whether a boot disk came with its instance (rule 15): created, and last attached,
    within ``AT_LAUNCH`` of the instance's creation. A disk swapped in later (a stopped VM's
    boot disk replaced) was last attached then, whenever it was created; a time the disk's
    read does not give is not at launch (fail closed)."""
    created = parse_time(getattr(disk, "creation_timestamp", "") or "")
    last_attached = parse_time(getattr(disk, "last_attach_timestamp", "") or "")
    return attached_at_launch(created, launched) and attached_at_launch(last_attached, launched)


class GcpOperations(Operations):
    """``deletion.Operations`` over one project's Compute calls."""

    kinds = KIND_BY_RESOURCE

    def __init__(self, calls: GcpCalls) -> None:
        self.calls = calls
        self.project = calls.project
        self.snapshots = GcpSnapshots(calls)

    # -- reads ---------------------------------------------------------------------------

    def read(self, targets: Sequence[Target]) -> dict[str, Read]:
        out: dict[str, Read] = {}
        for target in targets:
            spec = KIND_BY_RESOURCE[target.kind]
            if not target.id.isdigit():  # no Compute Engine id: nothing to ask for (a forged message)
                out[target.id] = UNREAD
                continue
            items = self.calls.find(spec, self._where(spec, target), target.id)
            match = [i for i in items if str(getattr(i, "id", "")) == target.id]
            if len(match) != len(items) or len(match) > 1:
                out[target.id] = UNREAD  # an answer that is not what was asked: fail closed
            else:
                out[target.id] = self._live(spec, target, match[0]) if match else None
        return out

    @staticmethod
    def _where(spec: GcpKind, target: Target) -> str:
        return "global" if spec.scope == "global" else target.location

    @staticmethod
    def _live(spec: GcpKind, target: Target, item: Any, state: ResourceState | None = None) -> Live:
        return Live(target, dict(getattr(item, "labels", {}) or {}), state or spec.state(item, deleting=True), item,
                    str(getattr(item, "status", "") or ""))

    # -- the owner -----------------------------------------------------------------------

    def protection(self, owner: Live, remembered: str | None) -> tuple[str, str] | None:
        # GCE's protections are read by every listing and re-read here: nothing is remembered.
        name = getattr(owner.item, "name", "")
        controller = controller_of(owner.item)
        if controller is not None:
            return "managed_by_controller", f"{name} ({owner.id}) is managed by {controller}"
        if protection_of(owner.item) is not None:
            return "deletion_protection", f"{name} ({owner.id}) has deletionProtection"
        return None

    def uses(self, owner: Live, members: Sequence[Live]) -> set[str]:
        """Its attached disks (``disks[].source``) and the addresses whose ``users`` name it."""
        sources = {link_key(str(getattr(d, "source", "") or "")) for d in getattr(owner.item, "disks", ()) or ()}
        me = link_key(str(getattr(owner.item, "self_link", "") or ""))
        found = set()
        for m in members:
            if m.target.kind is ResourceKind.DISK and link_key(str(m.item.self_link)) in sources:
                found.add(m.id)
            elif m.target.kind is ResourceKind.ADDRESS and me in {link_key(str(u)) for u in m.item.users or ()}:
                found.add(m.id)
        return found

    def blast(self, owner: Live, members: Mapping[str, Live]) -> list[Doomed]:
        """``instances.delete`` deletes the instance's ``autoDelete`` disks with it (a field
        left out counts as auto-delete). A ``source`` that names no zonal disk of this
        project cannot be verified: it blocks (``live`` None), unless it names none because
        it is a local SSD."""
        launched = parse_time(getattr(owner.item, "creation_timestamp", "") or "")
        by_link = {link_key(str(m.item.self_link)): m for m in members.values() if m.target.kind is ResourceKind.DISK}
        out: list[Doomed] = []
        for attached in getattr(owner.item, "disks", ()) or ():
            if "auto_delete" in attached and attached.auto_delete is False:
                continue  # kept by the API when the instance goes
            source = str(getattr(attached, "source", "") or "")
            if not source and getattr(attached, "type_", None) == "SCRATCH":
                continue  # a local SSD: it exists only with its instance, no disk resource to verify
            live = by_link.get(link_key(source))
            if live is None:
                where = DISK_LINK.search(source)
                if where is None or where.group(1) != self.project:
                    out.append(Doomed(ResourceKind.DISK, source[-200:] or "?", None))
                    continue
                item = self.calls.get(DISK, where.group(2), where.group(3))  # the disk the instance names, now
                if item is None:  # attached, yet not found: it cannot be verified (fail closed)
                    out.append(Doomed(ResourceKind.DISK, source[-200:], None))
                    continue
                live = self._live(DISK, Target(ResourceKind.DISK, str(item.id), where.group(2)), item)
            own = getattr(attached, "boot", False) is True and own_boot_disk(live.item, launched)
            out.append(Doomed(ResourceKind.DISK, live.id, live, own))
        return out

    def replaced_by(self, owner: Live) -> Live | None:
        return None  # nothing re-creates a deleted VM that no controller manages

    # -- calls ---------------------------------------------------------------------------

    def delete(self, live: Live, journal: Journal, blast: Sequence[str] = ()) -> Live | None:
        spec = KIND_BY_RESOURCE[live.target.kind]
        where, name = self._where(spec, live.target), str(getattr(live.item, "name", "") or "")
        now = self.calls.get(spec, where, name)  # the name the call takes, checked just before it
        if now is None:  # no longer under that name: gone, or renamed (then it is not ours to chase now)
            if isinstance(self.read([live.target])[live.id], Live):
                raise Changed(f"{live.id} is no longer named {name}: nothing is deleted", region=where)
            return None
        if str(now.id) != live.id:
            raise Replaced(f"{name} names {now.id} now, not {live.id}: nothing is deleted", region=where)
        if _judged(now) != _judged(live.item):
            raise Changed(f"{name} ({live.id}) changed since it was read: nothing is deleted", region=where)
        self.calls.delete(spec, where, name, target=live.id, blast=blast, journal=journal)
        after = self.read([live.target])[live.id]  # by its id: a new resource of that name is not it
        if after is None:
            return None
        if not isinstance(after, Live):
            raise ProviderError(f"{spec.kind} {live.id} cannot be read after its delete", region=where)
        if spec is INSTANCE:
            return self._live(spec, live.target, after.item, AFTER_DELETE.get(after.raw_state or "", after.state))
        return after

    def created_at(self, live: Live) -> datetime | None:
        return parse_time(getattr(live.item, "creation_timestamp", "") or "")  # as the listing reads it

    def ready(self, live: Live, owner_id: str | None, ours: Callable[[Live], bool], journal: Journal) -> Readiness:
        spec, item = KIND_BY_RESOURCE[live.target.kind], live.item
        if not spec.in_use(item):
            return Readiness.READY
        users = [str(u) for u in getattr(item, "users", ()) or ()]
        if not users:  # a status that holds it (a snapshot being taken, an address being assigned)
            return Readiness.NOT_YET
        for user in users:
            where = INSTANCE_LINK.search(user)
            if where is None or where.group(1) != self.project:
                # a forwarding rule (the group's own are gone first: depends_on), a router, another
                # project's VM: outside the group (SAFETY.md rule 21)
                return Readiness.IN_USE
            instance = self.calls.get(INSTANCE, where.group(2), where.group(3))  # by the name the user link gives
            if instance is not None and str(instance.id) != owner_id and str(instance.status) != "STOPPING":
                return Readiness.IN_USE
        return Readiness.NOT_YET  # the group's owner (or an instance shutting down, or gone) still named


def _judged(item: Any) -> tuple[object, ...]:
    """What a delete's judgement read of a resource: its labels, its protections and what its
    delete takes along (each attached disk's link, ``autoDelete`` and ``boot``). The read by
    name right before the call must show the same."""
    disks = tuple(sorted((link_key(str(getattr(d, "source", "") or "")), "auto_delete" not in d or bool(d.auto_delete),
                          bool(getattr(d, "boot", False))) for d in getattr(item, "disks", ()) or ()))
    metadata = getattr(item, "metadata", None)
    entries = tuple(sorted((str(getattr(e, "key", "")), str(getattr(e, "value", "")))
                           for e in (getattr(metadata, "items", None) or ()))) if metadata is not None else ()
    return (tuple(sorted(dict(getattr(item, "labels", {}) or {}).items())), getattr(item, "deletion_protection", None),
            entries, disks)
