"""Where things are on Compute Engine, against a backend's configured entries
(``backend.regions``: regions such as ``us-central1`` or single zones such as
``us-central1-a``)."""

from __future__ import annotations

from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.providers.gcp.kinds import region_of


def location_of(scope: str) -> str:
    """``zones/us-central1-a`` -> ``us-central1-a``; ``regions/x`` -> ``x``."""
    return scope.partition("/")[2] or scope


def touched(entries: tuple[str, ...], location: str) -> list[str]:
    """The configured entries a zone or region's trouble affects: a zone fails its
    own entry and its region's; a region fails its entry and its zones' entries."""
    return [e for e in entries if location in (e, region_of(e)) or e == region_of(location)]


def entry_for(entries: tuple[str, ...], location: str) -> str | None:
    """The configured entry a zone or region belongs to: the zone itself, else its region."""
    if location in entries:
        return location
    region = region_of(location)
    return region if region != location and region in entries else None


def outside_of(entries: tuple[str, ...], group: ResourceGroup) -> str | None:
    """The place outside the configured entries that a group names (a forged listing batch:
    SAFETY.md rule 12), or None. The group's zone or region must belong to an entry, and each
    of its resources must be looked up there (its ``region``: the zone, the zone's region for
    an address, a snapshot's source zone), the only place the deleter takes from a listing
    (rule 21)."""
    if entry_for(entries, group.region) is None:
        return group.region
    home = (group.region, region_of(group.region))
    for res in group.resources:
        if res.region not in home:
            return res.region
    return None
