"""GCP adapter: the Compute Engine instances, disks and static addresses of one project.

``backend.account`` is the project id (``settings.project`` overrides it);
``backend.regions`` holds regions (``us-central1``: all its zones, and its
regional addresses) or single zones (``us-central1-a``: that zone, plus the
addresses its listed instances use). Kinds are declared in ``gcp_kinds.KINDS``;
the calls live in ``gcp_calls``, deletion in ``gcp_delete``.

Listing makes one ``aggregatedList`` pass per kind for the whole project,
restricted server-side by ``filter=labels.<tag_key>:*`` and paginated, then
keeps the scopes matching the configured regions/zones. A failed call fails
every configured region (it cannot be attributed); a scope reported with a
warning (``UNREACHABLE``...) fails the configured region or zone it belongs
to; a configured name the API does not list at all fails too (typo guard).

With ``retain_snapshots_days`` set, our snapshots (``snapshots.list``, global, with the
same label filter) older than that are listed too, each in the configured entry of its
source disk's zone (``sourceDisk``); younger ones, and ones that name no disk of a
configured zone or region or no readable creation time, are not listed (kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.api_core.retry import Retry
from pydantic import ValidationError

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError, ProviderError, ProviderThrottled
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteResult
from orphan_cleanup.providers.base import ResourceProvider, describe_error, group_resources, not_yet_is_deleting
from orphan_cleanup.providers.gcp.calls import GcpCalls, read_retry
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.delete import delete_group
from orphan_cleanup.providers.gcp.kinds import (
    BENIGN_WARNINGS,
    KIND_BY_RESOURCE,
    GcpKind,
    expired,
    link_key,
    listed_kinds,
    parse_time,
    region_of,
    source_zone,
    to_resource,
)
from orphan_cleanup.providers.gcp.places import entry_for, location_of, outside_of, touched
from orphan_cleanup.providers.gcp.snapshots import taken_by_us
from orphan_cleanup.providers.ratelimit import DEFAULT_BUDGETS, RateLimits, process_limits

LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_DEFAULT: Any = object()


@dataclass
class _Fetched:
    """One kind's aggregated listing: items by location, failed scopes, seen scopes."""

    items: list[tuple[str, Any]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    error: str | None = None
    throttled: bool = False  # the error is throttling past the retry budget


class GcpProvider(ResourceProvider):
    """``ResourceProvider`` for one GCP backend over injected ``compute_v1`` clients.

    ``timeout`` bounds every call; ``operation_timeout`` bounds waiting for a
    delete operation (then the resource is re-read to confirm). ``retry``
    applies to reads (default: throttling only, see ``read_retry``; ``None``
    disables it). The identity check reads the project itself
    (``projects.get``, permission ``compute.projects.get``) and compares its
    ``name``, the project id.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        instances: Any,
        disks: Any,
        addresses: Any,
        zone_operations: Any,
        region_operations: Any,
        projects: Any,
        snapshots: Any = None,
        global_operations: Any = None,
        timeout: float = 30.0,
        operation_timeout: float = 120.0,
        page_size: int = 500,
        retry: Retry | None = _DEFAULT,
        poll_interval: float = 1.0,
        limits: RateLimits | None = None,
    ) -> None:
        super().__init__(backend)
        if backend.provider != "gcp":
            raise ConfigError(f"backend {backend.id} is not a gcp backend")
        for key in (self.tag_key, *sorted(self.protect_keys)):
            if not LABEL_KEY.fullmatch(key):
                raise ConfigError(f"backend {backend.id}: {key!r} is not a valid GCP label key")
        self.project = backend.settings.project or backend.account
        s = backend.settings
        if (s.snapshot_before_delete or s.retain_snapshots_days is not None) and (
                snapshots is None or global_operations is None):
            raise ConfigError(f"backend {backend.id}: snapshot settings need the snapshots and global operations"
                              " clients")
        self.calls = GcpCalls(
            self.project,
            {"instances": instances, "disks": disks, "addresses": addresses, "projects": projects,
             "snapshots": snapshots},
            {"zone": zone_operations, "region": region_operations, "global": global_operations},
            timeout=timeout, operation_timeout=operation_timeout, page_size=page_size,
            retry=None, poll_interval=poll_interval, limits=limits,
        )
        self.calls.retry = read_retry(timeout, self.calls.on_throttle) if retry is _DEFAULT else retry

    def reached_account(self) -> str:
        return self.calls.project_name()

    # --- listing ---------------------------------------------------------------------

    def iter_listing(self) -> Iterator[RegionListing]:
        entries = tuple(dict.fromkeys(self.backend.regions))
        if not entries:
            return
        kinds = listed_kinds(self.backend.settings.retain_snapshots_days)
        with ThreadPoolExecutor(max_workers=len(kinds), thread_name_prefix="gcp-list") as pool:
            fetched = dict(zip(kinds, pool.map(self._fetch, kinds), strict=True))
        yield from self._assemble(entries, fetched)

    def _fetch(self, spec: GcpKind) -> _Fetched:
        if spec.scope == "global":
            return self._fetch_snapshots(spec)
        out = _Fetched()
        try:
            for page in self.calls.pages(spec, f"labels.{self.tag_key}:*"):
                for scope in page.unreachables:
                    out.failed[location_of(scope)] = "UNREACHABLE"
                for scope, scoped in page.items.items():
                    loc = location_of(scope)
                    out.seen.add(loc)
                    code = scoped.warning.code
                    if code and code not in BENIGN_WARNINGS:
                        out.failed[loc] = f"{code}: {scoped.warning.message}".strip()
                    out.items.extend((loc, item) for item in getattr(scoped, spec.items_field))
        except ProviderError as e:
            out.error = f"{spec.client}: {describe_error(e)}"
            out.throttled = isinstance(e, ProviderThrottled)
        return out

    def _fetch_snapshots(self, spec: GcpKind) -> _Fetched:
        """Our expired snapshots, each placed in its source disk's zone. A retained (young)
        snapshot is not listed: never an orphan, never holding a cycle unsettled."""
        out, retain = _Fetched(), self.backend.settings.retain_snapshots_days
        if retain is None:
            return out
        now = datetime.now(UTC)  # the retention is days: no margin of rule 13 is compared against it
        try:
            for page in self.calls.global_pages(spec, f"labels.{self.tag_key}:*"):
                for item in page.items:
                    zone = source_zone(item)
                    if zone is not None and expired(item, retain_days=retain, now=now) \
                            and taken_by_us(item, self.tag_key):  # never a snapshot we did not take
                        out.items.append((zone, item))
        except ProviderError as e:
            out.error = f"{spec.client}: {describe_error(e)}"
            out.throttled = isinstance(e, ProviderThrottled)
        return out

    def _assemble(self, entries: tuple[str, ...], fetched: dict[GcpKind, _Fetched]) -> Iterator[RegionListing]:
        failures: dict[str, str] = {}
        # Entries whose only trouble is throttling (SAFETY.md rule 5: unavailable this cycle, never failed).
        other = {entry for got in fetched.values() if got.error and not got.throttled for entry in entries}
        other |= {entry for got in fetched.values() for loc in got.failed for entry in touched(entries, loc)}
        throttled = {entry for got in fetched.values() if got.error and got.throttled for entry in entries} - other
        for got in fetched.values():
            for entry in entries if got.error else ():
                failures.setdefault(entry, got.error or "")
            for loc, why in got.failed.items():
                for entry in touched(entries, loc):
                    failures.setdefault(entry, f"{loc}: {why}")
        seen = set().union(*(got.seen for got in fetched.values()))
        for entry in entries:
            if not any(entry in (loc, region_of(loc)) for loc in seen):
                failures.setdefault(entry, f"{entry}: no such zone or region in project {self.project}")

        instance_ids = {link_key(item.self_link): str(item.id)
                        for spec in fetched if spec.primary for _, item in fetched[spec].items}
        entry_of: dict[tuple[ResourceKind, str], str] = {}
        resources = []
        for spec in fetched:  # instances first (table order), so dependents can follow their instance's entry
            for loc, item in fetched[spec].items:
                try:
                    res = to_resource(spec, loc, item, instance_ids)
                except ValidationError as e:  # an unexpected shape: fail closed for that place
                    for entry in touched(entries, loc):
                        failures.setdefault(entry, f"{loc}: unexpected {spec.client} item: {describe_error(e)}")
                    continue
                place = entry_for(entries, loc) or entry_of.get((ResourceKind.INSTANCE, res.attached_to or ""))
                if place is not None:
                    entry_of[(res.kind, res.id)] = place
                    resources.append(res)

        groups: dict[str, list[ResourceGroup]] = {entry: [] for entry in entries}
        for group in group_resources(resources, self.tag_key):
            anchor = group.primary or group.resources[0]
            groups[entry_of[(anchor.kind, anchor.id)]].append(group)
        for entry in entries:
            if entry in failures:
                yield RegionListing(region=entry, failure=failures[entry], throttled=entry in throttled)
            else:
                yield RegionListing(region=entry, groups=tuple(groups[entry]))

    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        """Only in ``region`` (the group's zone), and only a zone of this backend's entries."""
        if not instance_id.isdigit() or entry_for(tuple(self.backend.regions), region) is None:
            return False
        spec = KIND_BY_RESOURCE[ResourceKind.INSTANCE]
        try:
            for page in self.calls.pages(spec, f"labels.{self.tag_key} = {ref}"):
                for scope, scoped in page.items.items():
                    if location_of(scope) == region and any(
                            str(item.id) == instance_id and dict(item.labels).get(self.tag_key) == ref
                            for item in scoped.instances):
                        return True
        except ProviderError:  # cannot confirm, so no
            return False
        return False

    def instance_created_at(self, instance: Resource) -> datetime | None:
        """``instances.get`` by the zone and name it was listed with; another id there is a
        replacement (None). Its ``creationTimestamp``, as the listing reads it."""
        zone, name = str(instance.details.get("zone") or ""), str(instance.details.get("name") or "")
        if not zone or not name or entry_for(tuple(self.backend.regions), zone) is None:
            raise ProviderError(f"instance {instance.id} names zone {zone!r}, not a zone of backend"
                                f" {self.backend.id}", region=instance.region)
        live = self.calls.get(KIND_BY_RESOURCE[ResourceKind.INSTANCE], zone, name)
        if live is None or str(live.id) != instance.id:
            return None
        return parse_time(live.creation_timestamp or "")

    # --- deletion --------------------------------------------------------------------

    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        # GCP's protections (deletionProtection, a managed instance group) are read by every
        # listing and re-read before the delete: nothing is remembered.
        if (outside := outside_of(tuple(self.backend.regions), group)) is not None:
            raise ProviderError(f"group {group.key} names {outside}, not in a zone or region of backend"
                                f" {self.backend.id}", region=group.region)
        return not_yet_is_deleting(
            group, lambda: delete_group(self.calls, group, tag_key=self.tag_key, protect_key=self.protect_key,
                                        protect_keys=self.protect_keys, journal=journal,
                                        known_attached=known_attached,
                                        snapshot_before_delete=self.backend.settings.snapshot_before_delete,
                                        retain_snapshots_days=self.backend.settings.retain_snapshots_days))


# --- composition ---------------------------------------------------------------------


def build_gcp_provider(backend: Backend, *, endpoint: str | None = None, timeout: float = 30.0,
                       limits: RateLimits | None = None) -> GcpProvider:
    """Build a ``GcpProvider`` with real ``compute_v1`` clients (see ``build_gcp_clients``);
    ``limits``: the request budgets (default: the process's, at the default rates)."""
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=endpoint), timeout=timeout,
                       limits=limits if limits is not None else process_limits(DEFAULT_BUDGETS))
