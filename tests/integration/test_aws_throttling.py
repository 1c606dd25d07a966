"""Throttling never fails a cycle (issue #17 item 2), on real parts: the product's AWS
adapter sends every call through a throttling proxy (``tests/support/aws_proxy``)
in front of the moto server, and a real cycle (``runner.run_cycle``: lister,
classifier, deleter) runs against a real Postgres ledger.

- below 50% refusals the cycle finishes (clean or unsettled), no region fails, and the
  calls beyond an unthrottled run stay within twice the refused ones;
- at 100% refusals (the identity call included) every region is unavailable: the cycle
  is unsettled, not failed (no failed-cycle backoff), and nothing is deleted.

The request budget is the real ``RateLimits`` with the real clock, at rates high
enough that its waits stay short; no assertion is about time.
"""

from __future__ import annotations

from typing import Any

import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.providers.ratelimit import DESCRIBE, MUTATE, TERMINATE, Budget, RateLimits
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.aws_proxy import AwsProxy
from tests.support.ledger_helpers import add_backend, cycle_row, reset
from tests.support.moto import reset_moto
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-throttled"
FAST = {DESCRIBE: Budget(50.0, 50), MUTATE: Budget(50.0, 50), TERMINATE: Budget(50.0, 50)}


def cycle(db: Database, proxy: AwsProxy, limits: RateLimits) -> Any:
    def provider_for(backend: Any) -> Any:
        # botocore's max_attempts counts retries: a call refused 4 times in a row spends the region's budget.
        return build_aws_provider(backend, connect_timeout=5, read_timeout=30, max_attempts=3,
                                  endpoint_url=proxy.url, limits=limits)

    pipeline = Pipeline(settings=Settings.explicit(confirm_seconds=0,
                                                   margin_seconds=0), db=db, provider_for=provider_for,
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    return run_cycle(pipeline, BACKEND, mode="delete")


def scenario(db: Database, moto_url: str) -> MotoPlatform:
    """Fresh moto and ledger: one tracked instance and one leak (its owner terminated)."""
    reset_moto(moto_url)
    reset(db)
    add_backend(db, BACKEND)
    platform = MotoPlatform(db, BACKEND)
    platform.tracked(data_volume=False)
    platform.terminated_leak(data_volume=False)
    return platform


@pytest.mark.parametrize("share", [pytest.param(0.1, marks=pytest.mark.slow),
                                   pytest.param(0.3, marks=pytest.mark.slow), 0.49])
def test_below_half_refused_the_cycle_finishes_and_extra_calls_stay_within_twice_the_refusals(
        emptied_db: Database, moto_server: str, share: float) -> None:
    db = emptied_db
    # given the unthrottled run of the scenario, as the baseline
    scenario(db, moto_server)
    with AwsProxy(moto_server, share=0.0) as proxy:
        baseline = cycle(db, proxy, RateLimits(FAST))
        baseline_calls = len(proxy.log)
    assert baseline.outcome == "clean" and baseline.failures == ()
    assert [g.action for g in baseline.groups if g.verdict == "orphan"] == ["deleted"]

    # when a share of the calls is refused with EC2's RequestLimitExceeded
    scenario(db, moto_server)
    limits = RateLimits(FAST)
    with AwsProxy(moto_server, share=share) as proxy:
        report = cycle(db, proxy, limits)

    # then the cycle finished, no region failed, and the leak went as without throttling
    assert report.outcome in ("clean", "unsettled"), report
    assert report.failures == ()
    assert proxy.refused >= 1
    assert len(proxy.log) - baseline_calls <= 2 * proxy.refused, (len(proxy.log), proxy.refused)
    # and the budget saw every refusal (the adaptive decrease is fed)
    assert sum(b.throttles for b in limits.buckets().values()) == proxy.refused


def test_every_call_refused_leaves_the_cycle_unsettled_and_deletes_nothing(
        emptied_db: Database, moto_server: str) -> None:
    db = emptied_db
    # given a leak that a clean run would delete
    platform = scenario(db, moto_server)
    leak = platform.terminated_leak(data_volume=False)

    # when every call is refused, the identity check's included
    with AwsProxy(moto_server, share=1.0) as proxy:
        report = cycle(db, proxy, RateLimits(FAST))

    # then the regions are unavailable for this cycle: unsettled, not failed, nothing deleted
    assert report.outcome == "unsettled"
    assert [f.region for f in report.failures] == ["us-east-1"]
    assert "ProviderThrottled" in report.failures[0].error
    assert report.groups == ()
    assert set(proxy.actions()) == {"GetCallerIdentity"}  # nothing listed, nothing deleted
    assert proxy.refused == len(proxy.log) == 4  # the call's four attempts (the first and 3 retries)
    assert platform.instance_state(leak.instance_id) == "running"
    row = cycle_row(db, report.cycle_id)
    assert row["outcome"] == "unsettled"


def test_a_region_throttled_past_its_retries_is_unavailable_while_the_others_are_listed(
        emptied_db: Database, moto_server: str) -> None:
    db = emptied_db
    # given a backend of two regions, one of which refuses every call
    reset_moto(moto_server)
    reset(db)
    add_backend(db, BACKEND, regions=("us-east-1", "eu-west-1"))
    tracked = MotoPlatform(db, BACKEND).tracked(data_volume=False)

    # when a cycle runs
    with AwsProxy(moto_server, share=1.0, regions={"eu-west-1"}) as proxy:
        report = cycle(db, proxy, RateLimits(FAST))

    # then eu-west-1 is unavailable (unsettled), us-east-1 is listed, the cycle is not failed
    assert report.outcome == "unsettled"
    assert [f.region for f in report.failures] == ["eu-west-1"]
    assert "ProviderThrottled" in report.failures[0].error
    assert [(g.region, g.primary_id, g.verdict) for g in report.groups] == [
        ("us-east-1", tracked.instance_id, "tracked")]
    # and eu-west-1 gave up on its first describe: four attempts, then the region was skipped
    assert proxy.actions(refused=True) == ["DescribeInstances"] * 4
