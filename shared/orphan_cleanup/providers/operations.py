"""The per-cloud operations port of the one deletion algorithm (``deletion``): what a cloud
contributes to a group's deletion, and the words they share. Every operation reads or
calls by the ids it is given and the items it read itself; none takes a fact from a
listing (docs/SAFETY.md rule 21). AWS (``aws/operations.py``), GCP (``gcp/operations.py``)
and the simulation's in-memory cloud implement it; the steps are ``deletion``'s alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from graphlib import TopologicalSorter
from typing import Any, Protocol

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import Journal
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.providers.snapshots import SnapshotOperations


@dataclass(frozen=True)
class Target:
    """A member of a group as the deleter may take it from a listing: its kind, its
    immutable id (AWS id, GCP numeric id) and where to look it up (region, zone)."""

    kind: ResourceKind
    id: str
    location: str


@dataclass(frozen=True)
class Live:
    """A resource as the operations just read it by its id. ``state`` is the deletion's
    view (``TERMINATING``: its deletion is under way; a stopped VM is ``ACTIVE``);
    ``item`` is the provider's reply, read only by the cloud's own operations."""

    target: Target
    tags: Mapping[str, str]
    state: ResourceState
    item: Any = None
    raw_state: str | None = None  # the provider's own word for its state, for messages

    @property
    def id(self) -> str:
        return self.target.id


class Unread:
    """A read the provider answered without the resource it was asked for (not "not
    found"): what cannot be read may carry a protect tag, so it is never taken for gone."""

    def __repr__(self) -> str:
        return "UNREAD"


UNREAD = Unread()
Read = Live | None | Unread


class Readiness(StrEnum):
    READY = "ready"  # nothing uses it (any more): it may be deleted now
    NOT_YET = "not_yet"  # the group's own owner still holds it while it terminates: pending
    IN_USE = "in_use"  # something outside the group uses it: a verdict, never a failure



@dataclass(frozen=True)
class Doomed:
    """One resource the owner's delete call would take along (rule 15), as read now:
    ``live`` None when the owner names it but it cannot be read (it blocks the call);
    ``own_device`` when it is the owner's own root volume, boot disk or primary interface,
    attached at launch (the operations judge it on the times they read)."""

    kind: ResourceKind
    id: str
    live: Live | None
    own_device: bool = False


class DeleteRefused(Exception):
    """The provider refused the owner's delete for a protection no read showed (AWS
    ``OperationNotPermitted``): the group is ``PROTECTED`` (rule 14)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class Blocked(ProviderError):
    """The cloud's operations found that a resource must be left alone this time, for a fact
    only they read (``reason``): nothing is called, the resource (an owner: its group) is
    skipped and the cycle stays unsettled."""

    reason = "blocked"

    def __init__(self, message: str, *, reason: str | None = None, region: str | None = None) -> None:
        super().__init__(message, region=region)
        if reason is not None:
            self.reason = reason


class Replaced(Blocked):
    """The name a delete call addresses (GCP) names another resource than the one read by
    id moments before: nothing is deleted."""

    reason = "replaced"


class Changed(Blocked):
    """The read right before a delete call shows the resource changed since it was judged
    (its tags, a protection, what its delete would take along, its name): nothing is
    deleted this time; the next cycle judges it anew."""

    reason = "changed_since_read"


#: How far from the owner's launch its own root volume, boot disk or primary interface may
#: have been attached (created, on GCP) and still count as attached at launch: the provider
#: attaches them while it launches, within seconds; one attached later (a swapped root) is
#: not the owner's to take along (rule 15).
AT_LAUNCH = timedelta(minutes=2)


def attached_at_launch(attached: datetime | None, launched: datetime | None) -> bool:
    """Whether a device attached (or created) at ``attached`` came with an owner launched at
    ``launched``. A time that cannot be read is not (fail closed)."""
    if attached is None or launched is None or attached.tzinfo is None or launched.tzinfo is None:
        return False
    return abs(attached - launched) <= AT_LAUNCH


class Kind(Protocol):
    """A cloud's row for one kind: which kinds must be gone before it is deleted."""

    @property
    def kind(self) -> ResourceKind: ...

    @property
    def depends_on(self) -> tuple[ResourceKind, ...]: ...


def delete_order(kinds: Iterable[Kind]) -> tuple[ResourceKind, ...]:
    """The kinds in an order where every kind comes after those it depends on."""
    return tuple(TopologicalSorter({k.kind: k.depends_on for k in kinds}).static_order())


class Operations(ABC):
    """The per-cloud operations of one deletion (one backend, one group's region). Every
    method reads or calls by the ids it is given and the items it read itself; none takes a
    fact from a listing. Errors are ``ProviderError`` subclasses (``ProviderUnavailable``:
    skip the rest of the region), never an SDK's.

    ``kinds``: the cloud's kind rows (``depends_on`` orders the dependents);
    ``snapshots``: the snapshot operations (``providers.snapshots``)."""

    kinds: Mapping[ResourceKind, Kind]
    snapshots: SnapshotOperations

    @abstractmethod
    def read(self, targets: Sequence[Target]) -> dict[str, Read]:
        """Each target read by its immutable id, now: its ``Live``; ``None`` when the
        provider says it is gone (not found, terminated, deleted); ``UNREAD`` when the
        answer leaves it out without saying so. Several targets may share calls."""

    @abstractmethod
    def protection(self, owner: Live, remembered: str | None) -> tuple[str, str] | None:
        """Why the owner must never be deleted (rule 14), as ``(reason, evidence)``: a
        controller that would re-create it, a termination or deletion protection (read
        now, read-only). ``remembered`` is a protection an earlier delete found that no
        read shows: one that cannot be read to see it lifted is still a protection."""

    @abstractmethod
    def uses(self, owner: Live, members: Sequence[Live]) -> set[str]:
        """The ids of ``members`` the owner, as read now, uses (attached volumes, disks,
        interfaces, security groups, its spot request, addresses associated with it)."""

    @abstractmethod
    def blast(self, owner: Live, members: Mapping[str, Live]) -> list[Doomed]:
        """What the owner's delete call deletes along with it (AWS ``DeleteOnTermination``,
        GCP ``autoDelete``), each read now by what the owner's own read names (a member's
        read of moments ago, ``members``, may serve). ``own_device`` only for a device the
        times read now show attached at launch (``attached_at_launch``)."""

    @abstractmethod
    def replaced_by(self, owner: Live) -> Live | None:
        """What would launch a replacement of the owner once it is deleted and must be
        deleted first (the AWS persistent spot request), read now; None when nothing would.
        ``ProviderError`` when that cannot be told: nothing is deleted."""

    @abstractmethod
    def delete(self, live: Live, journal: Journal, blast: Sequence[str] = ()) -> Live | None:
        """Delete ``live`` by what its own read says (a GCP name is checked against the id
        right before the call: ``Replaced``), journaled with ``blast`` (rule 19), and say
        what it is now, read again: ``None`` gone, a ``Live`` whose state is ``TERMINATING``
        while its deletion is under way; any other state: the call did not take. Raises
        ``DependencyNotReady`` ("not yet"), ``ResourceInUse`` (something outside the group
        uses it), ``DeleteRefused`` (a protection the call revealed)."""

    @abstractmethod
    def created_at(self, live: Live) -> datetime | None:
        """When the resource was created, as its read says (the field a listing reads for
        ``Resource.created_at``); None when the provider reports none."""

    @abstractmethod
    def ready(self, live: Live, owner_id: str | None, ours: Callable[[Live], bool], journal: Journal) -> Readiness:
        """Whether a dependent may be deleted now, making it so when that is safe (an
        interface detached or an address disassociated from an instance that is gone, or
        from an interface ``ours`` accepts: journaled): ``NOT_YET`` while the group's owner
        ``owner_id`` still holds it, or what holds it cannot be told yet; ``IN_USE`` when
        anything outside the group does. ``ours(live)``: whether a resource, as the
        operations just read it, is a member of the group the deletion may change (the
        group's ref, no protect tag); nothing else may be changed to free a dependent."""
