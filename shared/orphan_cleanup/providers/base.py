"""The provider port: what the pipeline needs from a cloud, and nothing more.

An adapter is built for one backend (account + regions + settings) with its
SDK clients injected; it never reads the environment itself.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import IdentityMismatch, OrphanCleanupError, ProviderThrottled
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, is_valid_ref
from orphan_cleanup.core.verdicts import DeleteResult


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

    Deletion contract (``delete_resource_group``), for every cloud the one algorithm of
    ``providers.deletion`` over the cloud's operations (SAFETY.md rule 21):
      - of the group it uses only the ref, the kinds, the immutable ids and the region or
        zone to look them up in; every other fact comes from its own reads by id, right
        before the call that depends on it;
      - a resource that is gone counts as deleted ("already gone = done"); one that lost or
        changed its ref, or carries a protect tag (any of ``protect_keys``: the account's,
        SAFETY.md rule 16), is left alone and reported in ``DeleteResult.skipped``; a
        protect tag on any member, re-read right before the owner's delete, protects the
        whole group (rule 12), and so does a member that cannot be read;
      - an owner a controller manages or that carries a termination or deletion
        protection (or one an earlier delete found: ``remembered_protection``) is
        ``PROTECTED`` (rule 14);
      - the blast of a call is the group (rule 15): what the provider deletes along with
        the owner must be verified members, or the owner's own root volume, boot disk or
        primary interface attached at launch; otherwise ``SKIPPED``, naming the resource
        (``blast_protected``, ``blast_foreign``, ``blast_unlisted``, ``blast_unreadable``);
      - only the dependents the owner's re-read shows attached to it (or those an earlier
        call confirmed attached: ``known_attached``, what ``DeleteResult.attached``
        reported) go with it; any other member is left for the next listing to regroup
        (``not_attached``; ``primary_gone`` when the owner was already gone: ``SKIPPED``);
      - every mutating call is journaled through ``journal`` (``core.journal``: intent
        before, result after, rule 19); a call whose intent cannot be written is not made;
      - deletes the owner first and confirms that it is terminating or gone; while it
        shuts down the result is ``DELETING`` and the dependents are deleted by a later
        call; then the dependents in dependency order. "Not yet" (still held by the
        group's own owner) is ``DELETING``, never failure; a dependent something outside
        the group uses is skipped ``in_use`` (unsettled, never failure);
      - is idempotent: calling it again after ``DELETED`` does nothing and returns
        ``DELETED``;
      - raises a ``ProviderError`` subclass on failure (a group no listing could have
        produced, one outside the backend's regions); ``ProviderUnavailable`` (including
        timeouts) tells the caller to skip the rest of that region.
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

    def holds_volume(self, region: str, volume_id: str, ref: str) -> bool:
        """``holds_instance`` for a volume owner (README, C1): whether ``volume_id`` is, now, a
        volume (AWS) or disk (GCP) of the backend's account in ``region`` carrying ``ref`` and
        not being deleted (read-only): what makes another volume of that ref a lost attempt
        (SAFETY.md rule 17). An adapter that cannot tell answers False (fail closed: the
        leak is skipped)."""
        return False

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
    def created_times(self, group: ResourceGroup) -> dict[str, datetime | None]:
        """The creation time the provider reports now for each resource of ``group`` (the
        field the listing reads), read by its immutable id, read-only, whatever its tags: what
        the deleter judges the margin and the copy rule on, never a listing message's (SAFETY.md
        rules 2, 12 and 21). A resource that is gone, or cannot be read, is absent. Raises
        ``ProviderError`` as ``delete_resource_group`` would."""

    @abstractmethod
    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        """Delete one orphan group, as described in the class docstring."""


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
