"""A whole listing collected from a provider port (tests and benchmarks): the
pipeline itself streams ``iter_listing`` region by region and never collects it."""

from __future__ import annotations

from dataclasses import dataclass

from orphan_cleanup.core.listing import RegionFailure, ResourceGroup
from orphan_cleanup.providers.base import ResourceProvider


@dataclass(frozen=True)
class Listing:
    groups: tuple[ResourceGroup, ...]
    failures: tuple[RegionFailure, ...]


def collect(provider: ResourceProvider) -> Listing:
    groups: list[ResourceGroup] = []
    failures: list[RegionFailure] = []
    for region in provider.iter_listing():
        if region.failure is not None:
            failures.append(RegionFailure(region=region.region, error=region.failure))
        else:
            groups.extend(region.groups)
    return Listing(tuple(groups), tuple(failures))
