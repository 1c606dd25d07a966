"""Listing a GCP backend: one ``aggregatedList`` pass per kind for the whole project,
restricted server-side by ``filter=labels.<tag_key>:*`` and paginated, keeping the scopes
that match the configured regions and zones. A failed call fails every configured entry
(it cannot be attributed); a scope reported with a warning (``UNREACHABLE``...) fails the
entry it belongs to; a configured name the API does not list at all fails too (typo guard).

Images (global, ``images.list`` with the same label filter) are placed in the zone of their
``sourceDisk``; an image made from anything else is not listed (kept). Forwarding rules are
regional (``forwardingRules`` aggregated list); global forwarding rules are not listed.

With ``retain_snapshots_days`` set, our snapshots (``snapshots.list``, global, with the
same label filter) older than that are listed too, each in the configured entry of its
source disk's zone (``sourceDisk``); younger ones, and ones that name no disk of a
configured zone or region or no readable creation time, are not listed (kept).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ProviderError, ProviderThrottled
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind
from orphan_cleanup.providers.base import describe_error, group_resources
from orphan_cleanup.providers.gcp.calls import GcpCalls
from orphan_cleanup.providers.gcp.kinds import (
    BENIGN_WARNINGS,
    GcpKind,
    controller_of,
    link_key,
    listed_kinds,
    parse_time,
    protection_of,
    region_of,
    source_zone,
)
from orphan_cleanup.providers.gcp.places import entry_for, location_of, touched
from orphan_cleanup.providers.gcp.snapshots import facts_of, snapshot_name
from orphan_cleanup.providers.sizes import gcp_size_facts
from orphan_cleanup.providers.snapshots import listable


@dataclass
class _Fetched:
    """One kind's aggregated listing: items by location, failed scopes, seen scopes."""

    items: list[tuple[str, Any]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    error: str | None = None
    throttled: bool = False  # the error is throttling past the retry budget


class GcpListing:
    """One listing of a backend's configured entries."""

    def __init__(self, calls: GcpCalls, backend: Backend) -> None:
        self.calls = calls
        self.backend = backend
        self.project = calls.project
        self.tag_key = backend.settings.tag_key

    def regions(self) -> Iterator[RegionListing]:
        entries = tuple(dict.fromkeys(self.backend.regions))
        if not entries:
            return
        kinds = listed_kinds(self.backend.settings.retain_snapshots_days)
        with ThreadPoolExecutor(max_workers=len(kinds), thread_name_prefix="gcp-list") as pool:
            fetched = dict(zip(kinds, pool.map(self._fetch, kinds), strict=True))
        yield from self._assemble(entries, fetched)

    def _fetch(self, spec: GcpKind) -> _Fetched:
        if spec.retained:
            return self._fetch_snapshots(spec)
        if spec.scope == "global":
            return self._fetch_global(spec)
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

    def _fetch_global(self, spec: GcpKind) -> _Fetched:
        """A global kind (images): one ``list`` with the label filter, each item placed in the
        zone of its ``sourceDisk``; one that names no zonal disk is not listed (kept)."""
        out = _Fetched()
        try:
            for page in self.calls.global_pages(spec, f"labels.{self.tag_key}:*"):
                out.items.extend((zone, item) for item in page.items if (zone := source_zone(item)) is not None)
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
                    if zone is not None and listable(facts_of(item), tag_key=self.tag_key, retain_days=retain,
                                                     now=now, name_for=snapshot_name):  # never one we did not take
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


def to_resource(spec: GcpKind, location: str, item: Any, instance_ids: Mapping[str, str]) -> Resource:
    """A listed item as a ``Resource``. ``attached_to`` is the numeric id of the
    first user that is an instance of this listing (``None`` when it is not); an
    instance's ``controller`` and ``protection`` as its metadata and fields say."""
    users = list(getattr(item, "users", ()) or ())
    attached = next((instance_ids[k] for k in map(link_key, users) if k in instance_ids), None)
    details: dict[str, Any] = {"name": item.name, spec.scope: location,
                               "status": getattr(item, "status", ""),  # a forwarding rule has none
                               "self_link": item.self_link}
    if spec.scope == "global":  # placed by its source disk's zone, addressed globally
        details.update({"global": "global", "zone": location,
                        "source_disk_id": str(getattr(item, "source_disk_id", ""))})
    if users:
        details["users"] = users
    if spec.kind is ResourceKind.FORWARDING_RULE:  # informational: the address and target it names
        details.update({"ip_address": str(getattr(item, "I_p_address", "") or ""),
                        "target": str(getattr(item, "target", "") or "")})
    details.update(gcp_size_facts(item))
    return Resource(
        kind=spec.kind, id=str(item.id), region=location, state=spec.state(item),
        tags=dict(item.labels), created_at=parse_time(item.creation_timestamp),
        attached_to=attached, details=details,
        controller=controller_of(item) if spec.primary else None,
        protection=protection_of(item) if spec.primary else None,
    )
