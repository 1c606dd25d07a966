"""Compute Engine resource kinds for the GCP adapter: one declarative table,
the literal state maps, wire-to-``Resource`` conversion and error translation.

Every kind has a numeric ``id`` (uint64, our identity: names are reused after a
delete), a ``name`` (what get/delete take), ``labels``, ``creationTimestamp``
and a ``selfLink``. Dependents name the instances using them in ``users``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import google.auth.exceptions as auth_exceptions
import requests
import urllib3.exceptions
from google.api_core import exceptions as gexc
from google.protobuf import json_format

from orphan_cleanup.core.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderThrottled,
    ProviderTimeout,
    ProviderUnavailable,
    ResourceNotFound,
)
from orphan_cleanup.core.listing import Resource, ResourceKind, ResourceState
from orphan_cleanup.providers.base import older_than_days
from orphan_cleanup.providers.sizes import gcp_size_facts

ACTIVE, AVAILABLE, TERMINATING = ResourceState.ACTIVE, ResourceState.AVAILABLE, ResourceState.TERMINATING

#: Instance ``status`` -> state as listed. Every status the API shows means the
#: VM still exists: ``TERMINATED`` is GCE's word for *stopped* (restartable, its
#: disks kept), not deleted; a deleted instance simply disappears (404).
#: ``STOPPING`` is ``active`` in a listing: from outside, a stop and a delete
#: look the same. Unknown statuses are ``active`` too (it exists, so fail closed).
INSTANCE_STATES: dict[str, ResourceState] = {
    "PROVISIONING": ACTIVE,
    "STAGING": ACTIVE,
    "RUNNING": ACTIVE,
    "STOPPING": ACTIVE,
    "SUSPENDING": ACTIVE,
    "SUSPENDED": ACTIVE,
    "REPAIRING": ACTIVE,
    "TERMINATED": ACTIVE,
}

#: Instance ``status`` right after *our* delete call completed: the states that
#: confirm the deletion is under way. ``STOPPING`` is GCE's shutting-down;
#: ``TERMINATED`` is a stopped VM whose delete operation has not removed it yet.
#: Any other status (``RUNNING``...) means the delete did not take effect.
AFTER_DELETE: dict[str, ResourceState] = {"STOPPING": TERMINATING, "TERMINATED": TERMINATING}

#: Address ``status`` -> state. ``IN_USE``: assigned to a VM or forwarding rule.
ADDRESS_STATES: dict[str, ResourceState] = {"RESERVING": ACTIVE, "RESERVED": AVAILABLE, "IN_USE": ACTIVE}

#: Snapshot ``status`` -> state as listed. ``FAILED`` exists and may be
#: deleted, like AWS ``error``; ``CREATING``/``UPLOADING`` are still being taken; unknown
#: statuses are ``active`` (exists and may be in use).
SNAPSHOT_STATES: dict[str, ResourceState] = {
    "CREATING": ACTIVE, "UPLOADING": ACTIVE, "READY": AVAILABLE, "FAILED": AVAILABLE, "DELETING": TERMINATING,
}

#: Snapshot ``status`` -> what it means for the disk it was taken of: ``READY`` lets the disk
#: be deleted, ``CREATING``/``UPLOADING`` is "not yet". Any other status (``FAILED``,
#: ``DELETING``, unknown, missing) keeps the disk and fails its group (``gcp_snapshot``).
SNAPSHOT_PROGRESS: dict[str, Literal["ready", "pending"]] = {
    "READY": "ready", "CREATING": "pending", "UPLOADING": "pending",
}

#: Aggregated-list scope warnings that are not a failure of that scope.
BENIGN_WARNINGS = frozenset({"NO_RESULTS_ON_PAGE"})

#: Error ``reason`` values (REST body) and operation error ``code`` values that mean
#: "still used by another resource / not ready yet": not yet, never failure.
IN_USE_REASONS = frozenset({"resourceInUseByAnotherResource", "resourceNotReady"})
#: The ``reason`` of a refusal for rate (HTTP 403 on Compute, or 429): throttling, not a denied permission.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
IN_USE_OP_CODES = frozenset({"RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "RESOURCE_NOT_READY"})
NOT_FOUND_OP_CODES = frozenset({"RESOURCE_NOT_FOUND"})


def _disk_state(disk: Any) -> ResourceState:
    if disk.status == "DELETING":
        return TERMINATING
    return ACTIVE if disk.users else AVAILABLE


@dataclass(frozen=True)
class GcpKind:
    """One resource kind: which client lists/gets/deletes it, where it lives,
    the request field naming it, its state, and when it is still in use."""

    kind: ResourceKind
    client: Literal["instances", "disks", "addresses", "snapshots"]
    scope: Literal["zone", "region", "global"]
    name_field: str  # request field naming the resource in get/delete
    items_field: str  # field of the aggregated scoped list holding the items
    state: Callable[[Any], ResourceState]
    in_use: Callable[[Any], bool]
    primary: bool = False
    # Listed only with ``retain_snapshots_days`` set, by a global ``list`` (no aggregated list).
    retained: bool = False


#: Deletion order is table order: the instance first, then what it used; snapshots last
#: (``gcp_delete`` never deletes one while a disk of its group is still there).
KINDS: tuple[GcpKind, ...] = (
    GcpKind(ResourceKind.INSTANCE, "instances", "zone", "instance", "instances",
            state=lambda i: INSTANCE_STATES.get(i.status, ACTIVE), in_use=lambda i: False, primary=True),
    GcpKind(ResourceKind.DISK, "disks", "zone", "disk", "disks",
            state=_disk_state, in_use=lambda d: bool(d.users)),
    GcpKind(ResourceKind.ADDRESS, "addresses", "region", "address", "addresses",
            state=lambda a: ADDRESS_STATES.get(a.status, ACTIVE),
            in_use=lambda a: a.status == "IN_USE" or bool(a.users)),
    GcpKind(ResourceKind.SNAPSHOT, "snapshots", "global", "snapshot", "snapshots",
            state=lambda s: SNAPSHOT_STATES.get(s.status, ACTIVE),
            in_use=lambda s: s.status not in ("READY", "FAILED"), retained=True),
)
KIND_BY_RESOURCE: dict[ResourceKind, GcpKind] = {k.kind: k for k in KINDS}
SNAPSHOT = KIND_BY_RESOURCE[ResourceKind.SNAPSHOT]
DISK = KIND_BY_RESOURCE[ResourceKind.DISK]
ORDER: dict[ResourceKind, int] = {k.kind: n for n, k in enumerate(KINDS)}


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


def expired(snapshot: Any, *, retain_days: int, now: datetime) -> bool:
    """Is this snapshot older than the retention? One without a readable
    ``creationTimestamp`` is kept (never listed, never deleted: fail closed)."""
    return older_than_days(parse_time(getattr(snapshot, "creation_timestamp", "") or ""), retain_days, now)


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


def to_resource(spec: GcpKind, location: str, item: Any, instance_ids: Mapping[str, str]) -> Resource:
    """A listed item as a ``Resource``. ``attached_to`` is the numeric id of the
    first user that is an instance of this listing (``None`` when it is not); an
    instance's ``controller`` and ``protection`` as its metadata and fields say."""
    users = list(getattr(item, "users", ()) or ())
    attached = next((instance_ids[k] for k in map(link_key, users) if k in instance_ids), None)
    details: dict[str, Any] = {"name": item.name, spec.scope: location, "status": item.status,
                               "self_link": item.self_link}
    if spec.scope == "global":  # placed by its source disk's zone, addressed globally
        details.update({"global": "global", "zone": location,
                        "source_disk_id": str(getattr(item, "source_disk_id", ""))})
    if users:
        details["users"] = users
    details.update(gcp_size_facts(item))
    return Resource(
        kind=spec.kind, id=str(item.id), region=location, state=spec.state(item),
        tags=dict(item.labels), created_at=parse_time(item.creation_timestamp),
        attached_to=attached, details=details,
        controller=controller_of(item) if spec.primary else None,
        protection=protection_of(item) if spec.primary else None,
    )


# --- error translation -------------------------------------------------------------

#: SDK exception -> our error, first match wins (subclasses before their bases).
ERROR_MAP: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], type[ProviderError]], ...] = (
    (gexc.NotFound, ResourceNotFound),
    ((gexc.Forbidden, gexc.Unauthorized), AccessDenied),  # PermissionDenied, Unauthenticated
    (gexc.TooManyRequests, ProviderThrottled),  # ResourceExhausted
    (gexc.GatewayTimeout, ProviderTimeout),  # DeadlineExceeded
    (gexc.ServerError, ProviderUnavailable),  # InternalServerError, BadGateway, ServiceUnavailable
    (requests.exceptions.Timeout, ProviderTimeout),
    (requests.exceptions.ConnectionError, ProviderUnavailable),
    (auth_exceptions.TransportError, ProviderUnavailable),
    (auth_exceptions.GoogleAuthError, AccessDenied),  # RefreshError, DefaultCredentialsError
)
TRANSLATED: tuple[type[BaseException], ...] = (
    gexc.GoogleAPIError, requests.exceptions.RequestException, auth_exceptions.GoogleAuthError,
    json_format.Error,  # a reply whose JSON does not fit the API's types: a plain ProviderError, fail closed
)


def is_throttle(exc: BaseException) -> bool:
    """Whether the API refused a call for its rate: a 429, or a 403 whose reason is a
    rate limit (Compute's per-project per-minute quotas answer so)."""
    return isinstance(exc, gexc.TooManyRequests) or (
        isinstance(exc, gexc.Forbidden) and bool(error_reasons(exc) & RATE_LIMIT_REASONS))


def error_reasons(exc: BaseException) -> set[str]:
    """The machine-readable ``reason`` values of a REST error body."""
    errors = getattr(exc, "errors", None) or ()
    return {e.get("reason", "") for e in errors if isinstance(e, Mapping)}


_TIMEOUTS = (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)


def _timed_out(exc: BaseException) -> bool:
    """Whether a transport error is a timeout underneath: requests reports a read
    timeout on a reused connection as ``ConnectionError(MaxRetryError(ReadTimeoutError))``."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, _TIMEOUTS):
            return True
        todo.extend(x for x in (e.__cause__, e.__context__, getattr(e, "reason", None), *e.args)
                    if isinstance(x, BaseException))
    return False


def translate(exc: BaseException, *, region: str | None) -> ProviderError:
    """Our error for an SDK/transport exception; decided by type (and the API's
    ``reason`` code for "in use"), never by message text."""
    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        return translate(exc.cause, region=region)
    if isinstance(exc, gexc.RetryError):
        return ProviderTimeout(f"RetryError: {exc}", region=region)
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, gexc.ClientError) and error_reasons(exc) & IN_USE_REASONS:
        return DependencyNotReady(text, region=region)
    if is_throttle(exc):
        return ProviderThrottled(text, region=region)
    if isinstance(exc, requests.exceptions.RequestException) and _timed_out(exc):
        return ProviderTimeout(text, region=region)
    for sdk_types, ours in ERROR_MAP:
        if isinstance(exc, sdk_types):
            return ours(text, region=region)
    return ProviderError(text, region=region)


@contextmanager
def gcp_errors(region: str | None) -> Iterator[None]:
    """Translate SDK errors raised inside the block, ``raise ... from e``."""
    try:
        yield
    except TRANSLATED as e:
        raise translate(e, region=region) from e
