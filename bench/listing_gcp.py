"""Listing benchmark, GCP side: the fake Compute server, a fleet, the shipped
listing and one without the label filter (see ``bench.listing``)."""

from __future__ import annotations

import time
from typing import Any

from bench.common import median
from bench.listing import TAG, Measured
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import ResourceGroup
from tests.support.listing import collect

GCP_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")


def build_gcp_fleet(fake: Any, n_ours: int, n_others: int) -> int:
    for i in range(n_ours):
        zone = GCP_ZONES[i % len(GCP_ZONES)]
        labels = {TAG: f"g{i:011d}"}
        fake.add_instance(f"vm-{i}", zone=zone, labels=labels)
        fake.add_disk(f"vm-{i}-data", zone=zone, labels=labels, attached_to=f"vm-{i}")
    for i in range(n_others):
        fake.add_instance(f"other-{i}", zone=GCP_ZONES[i % len(GCP_ZONES)], labels={"team": "other"})
    return 2 * n_ours


def gcp_floor(n_ours: int) -> int:
    """The fewest calls that can list ``build_gcp_fleet``'s fleet: per kind, its labelled
    items over the largest ``maxResults`` (500), at least one page (an empty kind too)."""
    import math

    from orphan_cleanup.providers.gcp.kinds import listed_kinds

    counts = {"instances": n_ours, "disks": n_ours}
    return sum(max(1, math.ceil(counts.get(spec.client, 0) / 500)) for spec in listed_kinds(None))


#: The kinds listed before forwarding rules and images were added: the same-run baseline of what
#: those cost (``measure``'s ``first kinds`` variant).
FIRST_KINDS = frozenset({"instances", "disks", "addresses", "snapshots"})


def _gcp_provider(fake: Any, *, variant: str) -> Any:
    """The shipped provider (``shipped``), the same without the label filter (``unfiltered``),
    or listing only the first kinds (``first kinds``)."""
    from orphan_cleanup.providers.gcp import listing
    from orphan_cleanup.providers.gcp.provider import build_gcp_provider

    backend = Backend(id="bench-gcp", provider="gcp", account=fake.project, regions=("us-central1",))
    provider = build_gcp_provider(backend, endpoint=fake.url, timeout=60)
    if variant == "unfiltered":
        pages = provider.calls.pages
        provider.calls.pages = lambda spec, _filter: pages(spec, "")
    elif variant == "first kinds":
        class FirstKinds(listing.GcpListing):
            def _fetch(self, spec: Any) -> Any:
                return super()._fetch(spec) if spec.client in FIRST_KINDS else listing._Fetched()

        provider.iter_listing = lambda: FirstKinds(provider.calls, provider.backend).regions()
    return provider


VARIANTS = ("shipped", "unfiltered", "first kinds")


def measure(fake: Any, reps: int) -> list[Measured]:
    """The shipped, unfiltered and first-kinds listings, warmed up, then interleaved."""
    providers = {v: _gcp_provider(fake, variant=v) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    last: dict[str, tuple[list[ResourceGroup], int]] = {}
    try:
        for k in range(reps + 1):
            for variant, provider in providers.items():
                fake.require_label_filter = variant != "unfiltered"
                fake.clear_calls()
                start = time.perf_counter()
                groups = list(collect(provider).groups)
                if k:  # the first round is the warm-up
                    times[variant].append(time.perf_counter() - start)
                last[variant] = (groups, fake.count())
    finally:
        fake.require_label_filter = True
    return [Measured(last[v][0], last[v][1], last[v][1], median(times[v])) for v in VARIANTS]
