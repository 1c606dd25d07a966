"""Listing cost at scale against the fake Compute server (excluded by default).

Run: ``python -m pytest tests/integration/test_gcp_scale.py -m slow -s -q``
"""

from __future__ import annotations

import time

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.providers.gcp.provider import build_gcp_provider
from tests.support.gcp_fake import FakeCompute
from tests.support.listing import collect

ZONES = ["us-central1-a", "us-central1-b", "us-central1-c", "europe-west1-b", "europe-west1-c"]


@pytest.mark.slow
@pytest.mark.parametrize("instances", [1000])
def test_listing_cost_for_instances_with_disks(gcp: FakeCompute, instances: int) -> None:
    # Given: N instances, each with a boot disk, all labelled (distinct refs)
    for n in range(instances):
        zone = ZONES[n % len(ZONES)]
        labels = {"provider_ref": f"{n:012d}"}
        gcp.add_instance(f"vm-{n}", zone=zone, labels=labels)
        gcp.add_disk(f"vm-{n}-boot", zone=zone, labels=labels, attached_to=f"vm-{n}", boot=True)
    backend = Backend(id="scale", provider="gcp", account=gcp.project, regions=["us-central1", "europe-west1"])
    provider = build_gcp_provider(backend, endpoint=gcp.url, timeout=30)
    gcp.clear_calls()

    # When
    started = time.perf_counter()
    listing = collect(provider)
    elapsed = time.perf_counter() - started

    # Then
    resources = sum(len(g.resources) for g in listing.groups)
    assert listing.failures == () and len(listing.groups) == instances and resources == 2 * instances
    calls = len(gcp.calls)
    per_1000 = calls * 1000 / resources
    print(f"\nGCP listing: {instances} instances + {instances} disks = {resources} resources, "
          f"{calls} calls ({per_1000:.2f} per 1,000 resources), {elapsed:.2f} s")
    assert per_1000 < 10
