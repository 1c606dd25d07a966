"""The provider port: what the pipeline needs from a cloud, and nothing more.

An adapter is built for one backend (account + regions + settings) with its
SDK clients injected; it never reads the environment itself.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timedelta

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import DependencyNotReady, IdentityMismatch, OrphanCleanupError, ProviderThrottled
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, is_valid_ref
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus


class ResourceProvider(ABC):
    """Lists and deletes the resource groups of one backend.

    Listing contract (``iter_listing``):
      - yields one ``RegionListing`` per configured region (or zone), in any
        order, as soon as that region is done, so a caller can stream batches;
      - only resources carrying the backend's ref tag key are listed, through
        each service's own describe/list call (never a tagging index alone:
        it shows deleted resources for up to an hour);
      - a resource whose tag value is not a valid ref is listed in a group marked
        ``malformed_ref`` (shown as ``ignored``, never an orphan);
      - terminated instances are not listed;
      - a region that fails (timeout, unavailable, throttled past retries,
        access denied, a warning such as "unreachable" from the API) yields a
        ``RegionListing`` with ``failure`` set and no groups; it never hides
        the other regions; ``throttled`` says the failure was throttling.

    Identity contract (``verify_identity``, SAFETY.md rule 11):
      - before anything is listed or deleted, the pipeline calls ``verify_identity``;
        it asks the provider which account (AWS ``sts:GetCallerIdentity``, after any
        role is assumed) or project (GCP ``projects.get``) the credentials reach and
        raises ``IdentityMismatch`` when that is not ``expected_account``;
      - a check that cannot be made (no credentials, access denied, not found,
        unavailable) raises a ``ProviderError`` subclass: never "assume it matches";
      - a success is cached for the adapter's life (one warm function, one backend
        configuration); a failure is asked again next time.

    Deletion contract (``delete_resource_group``):
      - re-reads every resource of the group by its immutable id right before
        acting; a resource that is gone counts as deleted ("already gone = done");
        one that lost or changed its ref, or carries a protect tag (any of
        ``protect_keys``: the account's, SAFETY.md rule 16), is left alone and
        reported in ``DeleteResult.skipped``;
      - the blast of a call is the group (SAFETY.md rule 15): before a call that makes
        the provider delete more than its target (an instance's ``DeleteOnTermination``
        volumes and interfaces, GCP ``autoDelete`` disks), that set is read afresh and
        each member must be a verified member of the group that still carries its ref (or
        carry no ref tag and no protect tag and be the instance's own root volume, boot disk
        or primary interface); otherwise the
        group is skipped (``DeleteStatus.SKIPPED``) and ``skipped`` names the blocking
        resource (``blast_protected``, ``blast_foreign``);
      - every mutating call is journaled through ``journal`` (``core.journal``: intent
        before, result after, SAFETY.md rule 19); a call whose intent cannot be written
        is not made;
      - a protect tag on any member, as re-read right before the owner's delete,
        protects the whole group (``SKIPPED``: the member ``protected``, the others
        ``group_protected``), as the classifier reads a listing (SAFETY.md rule 12); a member
        that re-read neither answers for nor says gone keeps it too (``unreadable``, the
        owner ``member_unreadable``: what cannot be read may carry a protect tag);
      - only the dependents the owner's re-read shows attached to it (or those an earlier
        call confirmed attached: ``known_attached``, what ``DeleteResult.attached``
        reported, kept by the ledger) go with it; any other member is left for the next
        listing to regroup (``not_attached``; ``primary_gone`` when the owner was already
        gone at the first re-read: ``SKIPPED``);
      - ``remembered_protection``: an earlier delete found the primary protected in a
        way no listing shows; the re-read checks it again, read-only, and a protection
        it cannot read is still a protection (never a terminate attempt to find out);
      - deletes the owner resource first and confirms that it is terminating or
        terminated; while it is still shutting down returns ``DELETING`` and
        the dependents are deleted by a later call ("not yet terminated");
      - then deletes the dependents in dependency order; a dependency that is
        still in use means "not yet" (``DELETING``), never failure. "Not yet" has
        this one channel: ``DependencyNotReady`` never leaves the adapter (run
        the work through ``not_yet_is_deleting``);
      - is idempotent: calling it again after ``DELETED`` does nothing and
        returns ``DELETED``;
      - raises a ``ProviderError`` subclass on failure; ``ProviderUnavailable``
        (including timeouts) tells the caller to skip the rest of that region.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._identity_lock = threading.Lock()
        self._identity_verified = False

    @property
    def expected_account(self) -> str:
        """The account (AWS) or project (GCP) this adapter lists and deletes in."""
        return self.backend.scope_account

    @abstractmethod
    def reached_account(self) -> str:
        """Ask the provider which account/project the credentials reach (one call).
        Raises a ``ProviderError`` subclass when the question cannot be answered."""

    def verify_identity(self) -> None:
        """Raise ``IdentityMismatch`` unless the credentials reach ``expected_account``."""
        with self._identity_lock:
            if self._identity_verified:
                return
            reached = self.reached_account()
            expected = self.expected_account
            if reached != expected:
                raise IdentityMismatch(
                    f"account_mismatch: credentials reach {reached}, backend {self.backend.id} says {expected}")
            self._identity_verified = True

    @property
    def tag_key(self) -> str:
        return self.backend.settings.tag_key

    @property
    def protect_key(self) -> str:
        return self.backend.settings.protect_tag_key

    @property
    def protect_keys(self) -> frozenset[str]:
        """Every protect key that applies (the cycle's snapshot carries the account's)."""
        return self.backend.protect_keys

    @abstractmethod
    def iter_listing(self) -> Iterator[RegionListing]:
        """Yield each configured region's listing as it completes."""

    @abstractmethod
    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        """Whether ``instance_id`` is, now, a live instance of the backend's account carrying
        ``ref`` (read-only): what makes another VM of that ref a retry leak (SAFETY.md rule
        17), confirmed by the provider rather than by a listing message. A read that fails
        or an id of the wrong shape answers False (fail closed: the leak is skipped)."""

    @abstractmethod
    def instance_created_at(self, instance: Resource) -> datetime | None:
        """The creation time the provider reports, now, for the listed instance ``instance``
        (read-only, by its immutable id; the field the listing reads), whatever its tags say
        (the delete's re-read judges them). The deleter judges the copy and margin rules on
        it rather than on a listing message's (SAFETY.md rules 12 and 17). None when it is
        gone or replaced; raises ``ProviderError`` as ``delete_resource_group`` would (a
        region outside the backend, a failed read; ``ProviderUnavailable``: its region
        cannot be reached)."""

    @abstractmethod
    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        """Delete one orphan group, as described in the class docstring."""


def not_yet_is_deleting(group: ResourceGroup, delete: Callable[[], DeleteResult]) -> DeleteResult:
    """Run an adapter's deletion of ``group``; a ``DependencyNotReady`` that escapes it
    becomes the contract's "not yet" (``DELETING``, every resource pending)."""
    try:
        return delete()
    except DependencyNotReady:
        return DeleteResult(status=DeleteStatus.DELETING, pending=tuple(group.resource_ids()))


def describe_error(exc: BaseException) -> str:
    """A one-line description of a listing error for ``RegionFailure.error``."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{name}: {text}"[:500] if text else name


def parallel_regions(
    regions: Iterable[str],
    list_region: Callable[[str], list[ResourceGroup]],
    max_workers: int,
) -> Iterator[RegionListing]:
    """Run ``list_region`` for each region on a bounded pool and yield results
    as they complete. Our own errors become a failed ``RegionListing``;
    anything else is a bug and propagates."""
    regions = list(dict.fromkeys(regions))  # a region named twice is listed once
    if not regions:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(regions)))) as pool:
        pending: dict[Future[list[ResourceGroup]], str] = {
            pool.submit(list_region, r): r for r in regions
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                region = pending.pop(fut)
                try:
                    groups = fut.result()
                except OrphanCleanupError as exc:
                    yield RegionListing(region=region, failure=describe_error(exc),
                                        throttled=isinstance(exc, ProviderThrottled))
                else:
                    yield RegionListing(region=region, groups=tuple(groups))


def group_resources(resources: Iterable[Resource], tag_key: str) -> list[ResourceGroup]:
    """Fold listed resources into groups by (ref, region, owning instance).

    Each instance with a valid ref is the primary of its own group, so two
    instances sharing a ref form two groups. A dependent resource joins the
    group of the instance it is attached to when that instance carries the
    same ref; otherwise it joins the primary-less group of its ref and region.
    Resources without the tag key are not listed. A resource whose tag value is
    not a valid ref (empty, malformed) is folded the same way into a group
    marked ``malformed_ref``, keyed by the raw value: shown, never ours to delete.
    """
    tagged = [r for r in resources if tag_key in r.tags]
    instances = {r.id: r for r in tagged if r.kind is ResourceKind.INSTANCE}
    groups: dict[tuple[str, str, str | None], list[Resource]] = {}
    for res in tagged:
        ref = res.tags[tag_key]
        owner = instances.get(res.id if res.kind is ResourceKind.INSTANCE else res.attached_to or "")
        key: tuple[str, str, str | None]
        if owner is not None and owner.tags[tag_key] == ref:
            key = (ref, owner.region, owner.id)
        else:
            key = (ref, res.region, None)
        groups.setdefault(key, []).append(res)
    return [
        ResourceGroup(provider_ref=ref, region=region, primary_id=primary, resources=tuple(items),
                      malformed_ref=not is_valid_ref(ref))
        for (ref, region, primary), items in groups.items()
    ]


def older_than_days(created: object, days: int, now: datetime) -> bool:
    """Whether a creation time is ``days`` old or more (a snapshot past its retention).
    An unreadable or naive time is not: what cannot be dated is kept (fail closed)."""
    return isinstance(created, datetime) and created.tzinfo is not None and created <= now - timedelta(days=days)


def blast_problem(tags: Mapping[str, str], *, member: bool, ref: str, tag_key: str,
                  protect_keys: frozenset[str], own_device: bool = True) -> str | None:
    """Why a resource the provider would delete along with a call must not go with it
    (SAFETY.md rule 15), or None: ``blast_protected`` (a protect tag), ``blast_foreign``
    (another ref's, a member that lost its ref since the listing, or a resource with no ref
    tag that is not the instance's own), ``blast_unlisted`` (this ref's, but not a listed
    member of the group: the next cycle lists it). A non-member with no ref tag key and no
    protect tag goes only when it is the instance's own root volume, boot disk or primary
    interface (``own_device``, as the instance's re-read shows it; a caller that does not
    tell keeps the earlier rule)."""
    if not protect_keys.isdisjoint(tags):
        return "blast_protected"
    if tag_key not in tags:
        return None if own_device and not member else "blast_foreign"
    if tags[tag_key] != ref:
        return "blast_foreign"
    return None if member else "blast_unlisted"
