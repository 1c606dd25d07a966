"""STEP 7 outcome and schedule, STEP 1 decision, blast-radius cap: pure rules."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from orphan_cleanup.core.classify import (
    CycleFacts,
    backoff_delay,
    blast_radius_violation,
    may_have_new_orphans,
    next_schedule,
    outcome,
)
from orphan_cleanup.core.verdicts import Outcome, Verdict, VerdictKind
from tests.support.ledger_helpers import T0

CLEAN, UNSETTLED, FAILED = Outcome.CLEAN, Outcome.UNSETTLED, Outcome.FAILED

FACTS = [
    ("nothing happened", CycleFacts(), CLEAN),
    ("a region failed", CycleFacts(region_failures=1), UNSETTLED),
    ("a group was skipped", CycleFacts(skipped=True), UNSETTLED),
    ("a deletion in progress", CycleFacts(deleting=True), UNSETTLED),
    ("a region tripped while deleting", CycleFacts(tripped_regions=2), UNSETTLED),
    ("every unsettled reason at once", CycleFacts(region_failures=3, skipped=True, deleting=True, tripped_regions=1),
     UNSETTLED),
    ("the listing failed", CycleFacts(listing_failed=True), FAILED),
    ("a deletion failed", CycleFacts(delete_failed=True), FAILED),
    ("failed wins over unsettled (delete)", CycleFacts(delete_failed=True, skipped=True, region_failures=1,
                                                       deleting=True, tripped_regions=1), FAILED),
    ("failed wins over unsettled (listing)", CycleFacts(listing_failed=True, region_failures=2), FAILED),
]


@pytest.mark.parametrize("facts, expected", [f[1:] for f in FACTS], ids=[f[0] for f in FACTS])
def test_outcome(facts, expected):
    assert outcome(facts) is expected


NOW = T0
LISTED = T0 - timedelta(minutes=5)
MARGIN = 300
INTERVAL = 900
MAX_BACKOFF = 6 * 3600


def schedule(result, *, clean_at=None, delay=0, listed_at=LISTED, interval=INTERVAL, max_backoff=MAX_BACKOFF,
             rng=None):
    return next_schedule(result, now=NOW, listed_at=listed_at, clean_at=clean_at, retry_delay_seconds=delay,
                         interval_seconds=interval, margin_seconds=MARGIN, max_backoff_seconds=max_backoff,
                         rng=rng or random.Random(7))


class TestClean:
    def test_first_clean_sets_clean_at_to_listing_minus_margin(self):
        s = schedule(CLEAN, clean_at=None)
        assert s.clean_at == LISTED - timedelta(seconds=MARGIN)

    def test_clean_moves_clean_at_forward(self):
        earlier = LISTED - timedelta(hours=3)
        assert schedule(CLEAN, clean_at=earlier).clean_at == LISTED - timedelta(seconds=MARGIN)

    def test_clean_never_moves_clean_at_backwards(self):
        # given a clean_at already past what this (older) listing would give
        later = LISTED + timedelta(hours=1)
        assert schedule(CLEAN, clean_at=later).clean_at == later

    def test_clean_resets_delay_and_is_due_after_the_interval(self):
        s = schedule(CLEAN, delay=480)
        assert s.retry_delay_seconds == 0
        assert s.next_due_at == NOW + timedelta(seconds=INTERVAL)


class TestUnsettled:
    def test_keeps_clean_at_resets_delay_due_after_interval(self):
        kept = LISTED - timedelta(days=1)
        s = schedule(UNSETTLED, clean_at=kept, delay=960)
        assert s.clean_at == kept
        assert s.retry_delay_seconds == 0
        assert s.next_due_at == NOW + timedelta(seconds=INTERVAL)

    def test_never_cleaned_stays_never_cleaned(self):
        assert schedule(UNSETTLED, clean_at=None).clean_at is None


class TestFailed:
    def test_keeps_clean_at(self):
        kept = LISTED - timedelta(days=1)
        assert schedule(FAILED, clean_at=kept).clean_at == kept
        assert schedule(FAILED, clean_at=None).clean_at is None

    def test_delay_doubles_from_60_up_to_the_cap(self):
        # given consecutive failures, each fed the previous delay
        delays, delay = [], 0
        for _ in range(9):
            delay = schedule(FAILED, delay=delay, max_backoff=5000).retry_delay_seconds
            delays.append(delay)
        assert delays == [60, 120, 240, 480, 960, 1920, 3840, 5000, 5000]

    def test_base_delay_is_the_interval_when_shorter_than_a_minute(self):
        assert schedule(FAILED, delay=0, interval=10).retry_delay_seconds == 10
        assert backoff_delay(10, 10, 3600) == 20

    @pytest.mark.parametrize("previous, delay", [(0, 60), (60, 120), (120, 240), (1200, 2400)])
    def test_next_due_is_the_delay_with_jitter_within_20_percent(self, previous, delay):
        offsets = []
        for seed in range(200):
            s = schedule(FAILED, delay=previous, rng=random.Random(seed))
            assert s.retry_delay_seconds == delay
            offsets.append((s.next_due_at - NOW).total_seconds())
        assert all(0.8 * delay <= o <= 1.2 * delay for o in offsets)
        # the jitter really spreads the retries
        assert min(offsets) < 0.9 * delay and max(offsets) > 1.1 * delay

    def test_jitter_is_deterministic_for_a_seed(self):
        a = schedule(FAILED, delay=120, rng=random.Random(42))
        b = schedule(FAILED, delay=120, rng=random.Random(42))
        assert a == b

    def test_jittered_due_time_never_exceeds_the_cap(self):
        for seed in range(100):
            s = schedule(FAILED, delay=1000, max_backoff=1000, rng=random.Random(seed))
            assert s.retry_delay_seconds == 1000
            assert NOW + timedelta(seconds=800) <= s.next_due_at <= NOW + timedelta(seconds=1000)


STEP1 = [
    ("never cleaned", dict(clean_at=None, clean_mode=None, mode="report", activity_since_clean=False),
     (True, "never_cleaned")),
    ("never cleaned wins over everything", dict(clean_at=None, clean_mode="delete", mode="report",
                                                activity_since_clean=True), (True, "never_cleaned")),
    ("mode changed", dict(clean_at=T0, clean_mode="report", mode="delete", activity_since_clean=False),
     (True, "mode_changed")),
    ("activity since clean_at", dict(clean_at=T0, clean_mode="report", mode="report", activity_since_clean=True),
     (True, "activity")),
    ("nothing new", dict(clean_at=T0, clean_mode="report", mode="report", activity_since_clean=False),
     (False, "no_activity")),
]


@pytest.mark.parametrize("kwargs, expected", [s[1:] for s in STEP1], ids=[s[0] for s in STEP1])
def test_may_have_new_orphans(kwargs, expected):
    assert may_have_new_orphans(**kwargs) == expected


BLAST = [
    # to_delete, listed, max_deletes, max_share, violates
    ("nothing to delete", 0, 100, 100, 0.5, False),
    ("exactly at the count cap", 100, 1000, 100, 0.5, False),
    ("one over the count cap", 101, 1000, 100, 0.5, True),
    ("count cap of zero blocks any delete", 1, 1000, 0, 0.5, True),
    ("count cap of zero with nothing to delete", 0, 10, 0, 0.5, False),
    ("10 of 10: share not applied at 10 or fewer", 10, 10, 100, 0.5, False),
    ("11 of 11: share applied above 10", 11, 11, 100, 0.5, True),
    ("11 of 22: exactly at the share cap", 11, 22, 100, 0.5, False),
    ("11 of 21: just over the share cap", 11, 21, 100, 0.5, True),
    ("50 of 1000: under both caps", 50, 1000, 100, 0.5, False),
    ("share 1.0 allows deleting everything", 20, 20, 100, 1.0, False),
    ("share 0 blocks more than 10", 11, 1000, 100, 0.0, True),
    ("share 0 does not block 10", 10, 1000, 100, 0.0, False),
]


@pytest.mark.parametrize("to_delete, listed, max_deletes, max_share, violates", [b[1:] for b in BLAST],
                         ids=[b[0] for b in BLAST])
def test_blast_radius_violation(to_delete, listed, max_deletes, max_share, violates):
    why = blast_radius_violation(to_delete, listed, max_deletes=max_deletes, max_share=max_share)
    assert (why is not None) is violates
    if violates:
        assert str(to_delete) in str(why) and why.to_delete == to_delete and why.listed == listed
