"""The request budgets (``providers/ratelimit``): token buckets driven by their own
clock parameter (a counter we advance), so nothing sleeps; the bucket's ``sleep``
advances that clock by what it was asked to wait."""

from __future__ import annotations

import threading

import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.providers.ratelimit import (
    DEFAULT_BUDGETS,
    DESCRIBE,
    MUTATE,
    TERMINATE,
    Budget,
    RateLimits,
    TokenBucket,
    aws_api_class,
    process_limits,
    settings_budgets,
)


class Clock:
    """Time as a number we move: ``sleep`` moves it, and records how long each wait was."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.now += seconds


def bucket(rate: float = 5.0, burst: float = 25, clock: Clock | None = None) -> tuple[TokenBucket, Clock]:
    clock = clock or Clock()
    return TokenBucket(Budget(rate, burst), clock=clock, sleep=clock.sleep), clock


def test_a_full_bucket_serves_its_burst_then_one_token_per_refill_interval():
    b, clock = bucket(rate=5.0, burst=25)
    waits = [b.acquire() for _ in range(35)]
    assert waits[:25] == [0.0] * 25
    assert waits[25:] == pytest.approx([0.2] * 10)  # 1 / rate each
    assert clock.now == pytest.approx(2.0)  # 10 tokens past the burst at 5/s


def test_idle_time_refills_up_to_the_burst_only():
    b, clock = bucket(rate=5.0, burst=25)
    for _ in range(25):
        b.acquire()
    clock.now += 3600  # an hour idle: still only a burst's worth
    assert [b.acquire() for _ in range(25)] == [0.0] * 25
    assert b.acquire() == pytest.approx(0.2)


def test_throttling_halves_the_rate_down_to_a_floor_and_success_wins_it_back_slowly():
    b, _ = bucket(rate=4.0)
    b.throttled()
    assert b.rate == pytest.approx(2.0)
    for _ in range(10):
        b.throttled()
    assert b.rate == pytest.approx(0.4)  # MIN_SHARE of the configured rate
    b.succeeded()
    assert b.rate == pytest.approx(0.6)  # + 5% of the configured rate per success
    for _ in range(100):
        b.succeeded()
    assert b.rate == pytest.approx(4.0)  # never above the configured rate


def test_a_throttle_empties_the_bucket_so_the_next_call_waits_at_the_lowered_rate():
    b, _ = bucket(rate=5.0, burst=25)
    b.throttled()
    assert b.acquire() == pytest.approx(1 / 2.5)


def test_threads_share_one_bucket_and_never_exceed_it():
    clock = Clock()
    b, _ = bucket(rate=10.0, burst=5, clock=clock)
    threads = [threading.Thread(target=lambda: [b.acquire() for _ in range(10)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.acquired == 40
    # 40 tokens from a bucket of 5 refilled at 10/s: the waits add up to 35 refills at least
    assert sum(clock.slept) >= 3.5 - 1e-9


def test_one_bucket_per_account_region_service_and_class():
    clock = Clock()
    limits = RateLimits(DEFAULT_BUDGETS, clock=clock, sleep=clock.sleep)
    a = limits.bucket("111", "us-east-1", "ec2", DESCRIBE)
    assert limits.bucket("111", "us-east-1", "ec2", DESCRIBE) is a
    others = {limits.bucket("222", "us-east-1", "ec2", DESCRIBE), limits.bucket("111", "eu-west-1", "ec2", DESCRIBE),
              limits.bucket("111", "us-east-1", "sts", DESCRIBE), limits.bucket("111", "us-east-1", "ec2", MUTATE)}
    assert a not in others and len(others) == 4
    assert limits.bucket("111", "us-east-1", "ec2", TERMINATE).budget == Budget(1.25, 25)


def test_the_process_shares_buckets_between_adapters_with_equal_budgets():
    assert process_limits(DEFAULT_BUDGETS) is process_limits(dict(DEFAULT_BUDGETS))
    assert process_limits({DESCRIBE: Budget(1.0, 1)}) is not process_limits(DEFAULT_BUDGETS)


@pytest.mark.parametrize(("operation", "api_class"), [
    ("DescribeInstances", DESCRIBE), ("GetCallerIdentity", DESCRIBE), ("TerminateInstances", TERMINATE),
    ("DeleteVolume", MUTATE), ("CreateSnapshot", MUTATE), ("CancelSpotInstanceRequests", MUTATE)])
def test_ec2_operations_fall_in_their_throttling_class(operation, api_class):
    assert aws_api_class(operation) == api_class


def test_defaults_are_a_quarter_of_ec2s_buckets_and_configurable():
    assert settings_budgets(Settings.explicit()) == dict(DEFAULT_BUDGETS)
    assert DEFAULT_BUDGETS[DESCRIBE] == Budget(20 / 4, 100 / 4)
    assert DEFAULT_BUDGETS[TERMINATE].rate == 5 / 4
    configured = Settings(ORPHAN_CLEANUP_DESCRIBE_RATE="2", ORPHAN_CLEANUP_DESCRIBE_BURST="3")
    assert settings_budgets(configured)[DESCRIBE] == Budget(2.0, 3)


def test_a_budget_must_let_calls_through():
    with pytest.raises(ValueError):
        Budget(0.0, 10)
    with pytest.raises(ValueError):
        Budget(1.0, 0)
