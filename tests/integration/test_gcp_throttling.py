"""GCP listing at the floor and under throttling (issue #17 items 1-2): the real
google-cloud-compute client against the fake Compute server, whose request log
counts the calls and whose faults answer Compute's rate refusals (403
``rateLimitExceeded``, 429); a real cycle against a real Postgres ledger."""

from __future__ import annotations

from typing import Any

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.gcp.provider import build_gcp_provider
from orphan_cleanup.providers.ratelimit import DESCRIBE, MUTATE, TERMINATE, Budget, RateLimits
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend, cycle_row
from tests.support.listing import collect

REF = "abcdefabcdef"
FAST = {DESCRIBE: Budget(50.0, 50), MUTATE: Budget(50.0, 50), TERMINATE: Budget(50.0, 50)}
AGGREGATED = "/aggregated/"


def test_listing_600_instances_costs_two_aggregated_pages_of_500(gcp: FakeCompute) -> None:
    # given 600 labelled instances, a disk, an address, a forwarding rule and an image, in a project of this test alone: the
    # session's fake server is shared, and a listing an earlier test abandoned (a timed-out
    # region) may still be calling it
    project = "floor-project"
    for n in range(600):
        gcp.add_instance(f"vm-{n}", zone="us-central1-a", labels={"provider_ref": REF}, project=project)
    gcp.add_disk("d", zone="us-central1-a", labels={"provider_ref": REF}, project=project)
    gcp.add_address("ip", region="us-central1", labels={"provider_ref": REF}, project=project)
    gcp.add_forwarding_rule("fr", region="us-central1", labels={"provider_ref": REF}, address="ip", project=project)
    disk = gcp.get("disks", "us-central1-a", "d", project=project)
    gcp.add_image("img", disk=disk, labels={"provider_ref": REF}, project=project)

    # when the region is listed
    floor = Backend(id="gcp-floor", provider="gcp", account=project, regions=("us-central1",))
    listing = collect(build_gcp_provider(floor, endpoint=gcp.url, timeout=30, limits=RateLimits(FAST)))

    # then every item is there, in ceil(600 / 500) instance pages and one page per other kind
    assert not listing.failures
    assert sum(len(g.resources) for g in listing.groups) == 604
    mine = f"/projects/{project}/aggregated/"
    lists = [c for c in gcp.calls if mine in c.path or c.path.endswith(f"/projects/{project}/global/images")]
    assert gcp.count("GET", mine + "instances") == 2
    assert gcp.count("GET", mine + "disks") == gcp.count("GET", mine + "addresses") == 1
    # forwarding rules: one aggregated list; images: one global list (docs/PERFORMANCE.md)
    assert gcp.count("GET", mine + "forwardingRules") == 1
    assert gcp.count("GET", f"/projects/{project}/global/images") == 1
    assert len(lists) == 6
    # each at the API's largest page, always label-filtered
    assert {c.query.get("maxResults") for c in lists} == {"500"}
    assert all(c.query.get("filter", "").startswith("labels.provider_ref") for c in lists)


@pytest.mark.parametrize(("status", "reason"), [(403, "rateLimitExceeded"), (429, None)])
def test_refused_reads_are_retried_within_the_budget_and_the_listing_completes(
        gcp: FakeCompute, status: int, reason: str | None) -> None:
    # given a listing whose first two aggregated calls are refused for their rate, in a project
    # of this test alone (calls are counted by project: see the test above)
    project = f"refused-{status}"
    gcp.add_instance("vm", zone="us-central1-a", labels={"provider_ref": REF}, project=project)
    gcp.add_fault(path_contains=AGGREGATED, status=status, reason=reason, times=2)
    limits = RateLimits(FAST)

    # when the region is listed
    mine = Backend(id="gcp-refused", provider="gcp", account=project, regions=("us-central1",))
    listing = collect(build_gcp_provider(mine, endpoint=gcp.url, timeout=30, limits=limits))

    # then it is complete; the extra calls are the two retries, and the bucket slowed down twice
    assert not listing.failures and len(listing.groups) == 1
    calls = [c for c in gcp.calls if f"/projects/{project}" in c.path]
    refused = [c for c in calls if c.status == status]
    assert len(refused) == 2
    # four aggregated lists (instances, disks, addresses, forwarding rules) and the retries
    assert sum(1 for c in calls if c.method == "GET" and AGGREGATED in c.path) == 4 + len(refused)
    assert sum(b.throttles for b in limits.buckets().values()) == 2
    assert sum(b.acquired for b in limits.buckets().values()) == len(calls)  # every request took a token


def test_a_project_refusing_every_list_leaves_the_cycle_unsettled_and_deletes_nothing(
        gcp: FakeCompute, emptied_db: Database) -> None:
    # given a GCP backend with a leftover disk (no ledger record: it would be an orphan)
    db = emptied_db
    add_backend(db, "gcp-throttled", provider="gcp", account=gcp.project, regions=("us-central1",))
    gcp.add_disk("left", zone="us-central1-a", labels={"provider_ref": REF})
    gcp.add_fault(path_contains=AGGREGATED, status=403, reason="rateLimitExceeded")  # every time

    def provider_for(b: Any) -> Any:
        return build_gcp_provider(b, endpoint=gcp.url, timeout=2, limits=RateLimits(FAST))

    # when a delete cycle runs
    pipeline = Pipeline(settings=Settings.explicit(confirm_seconds=0,
                                                   margin_seconds=0), db=db, provider_for=provider_for,
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    report = run_cycle(pipeline, "gcp-throttled", mode="delete")

    # then the region is unavailable for this cycle: unsettled, not failed, nothing deleted
    assert report.outcome == "unsettled"
    assert [f.region for f in report.failures] == ["us-central1"]
    assert "ProviderThrottled" in report.failures[0].error
    assert report.groups == ()
    assert gcp.count("DELETE") == 0
    assert cycle_row(db, report.cycle_id)["outcome"] == "unsettled"
