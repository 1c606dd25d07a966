"""Mark, then sweep (docs/SAFETY.md rule 23): a delete cycle deletes an orphan group only when
an earlier delete-mode listing, at least the confirmation window before its own, found the same
group an orphan for the same reason; until then the group is ``marked``. Real Postgres, the
whole pipeline in one process, the in-memory cloud; the window passes in real time (the
database's clock), or an earlier listing is the one a test backdates."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import CycleReport
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend

WINDOW = 2  # seconds: long enough that two cycles in a row fall inside it, short enough to wait out


@pytest.fixture
def cloud() -> MemoryCloud:
    return MemoryCloud()


@pytest.fixture
def platform(db: Database, cloud: MemoryCloud) -> Platform:
    add_backend(db)
    return Platform(db, cloud)


def pipeline(db: Database, cloud: MemoryCloud, window: int = WINDOW, **settings: object) -> Pipeline:
    return Pipeline(settings=Settings(ORPHAN_CLEANUP_CONFIRM_SECONDS=window, **settings), db=db,
                    provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def group(report: CycleReport, primary: str):
    return next(g for g in report.groups if g.primary_id == primary)


def wait_out(window: int = WINDOW) -> None:
    time.sleep(window + 0.2)


def test_a_delete_cycle_marks_and_a_later_one_past_the_window_deletes(db, cloud, platform):
    _, _, leaked = platform.terminated_leak()
    _, _, tracked = platform.tracked()

    first = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    g = group(first, leaked)
    assert (g.verdict, g.action) == ("orphan", "marked")
    assert g.detail is not None and g.detail.startswith("deleted after ")
    delete_after = datetime.fromisoformat(g.detail.split(";")[0].removeprefix("deleted after "))
    assert 0 <= (delete_after - first.listed_at).total_seconds() - WINDOW < 1
    assert first.outcome == "unsettled" and cloud.deleted == []

    again = run_cycle(pipeline(db, cloud), "mem", mode="delete")  # inside the window: still marked
    assert group(again, leaked).action == "marked" and group(again, leaked).detail == g.detail
    assert cloud.deleted == []

    wait_out()
    swept = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(swept, leaked).action == "deleted"
    assert leaked in cloud.deleted and tracked not in cloud.deleted
    assert swept.outcome == "clean"


def test_a_verdict_change_in_between_starts_the_window_over(db, cloud, platform):
    _, _, leaked = platform.terminated_leak()
    run_cycle(pipeline(db, cloud), "mem", mode="delete")  # marked
    cloud.resources[leaked].tags["orphan-cleanup-protect"] = "yes"
    wait_out()
    protected = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(protected, leaked).verdict == "protected"
    del cloud.resources[leaked].tags["orphan-cleanup-protect"]

    # The window has passed since the first mark, but the group was not an orphan in between.
    after = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(after, leaked).action == "marked" and cloud.deleted == []
    wait_out()
    assert group(run_cycle(pipeline(db, cloud), "mem", mode="delete"), leaked).action == "deleted"


def test_a_reason_change_in_between_starts_the_window_over(db, cloud, platform):
    _, owner, leaked = platform.terminated_leak()
    first = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(first, leaked).reason == "owner_terminated"
    platform.ledger.hard_delete(owner)  # the platform drops the row: another reason
    wait_out()
    changed = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(changed, leaked).reason != "owner_terminated"
    assert group(changed, leaked).action == "marked" and cloud.deleted == []


def test_a_report_mode_listing_in_between_starts_the_window_over(db, cloud, platform):
    _, _, leaked = platform.terminated_leak()
    run_cycle(pipeline(db, cloud), "mem", mode="delete")
    run_cycle(pipeline(db, cloud), "mem", mode="report")
    wait_out()
    after = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(after, leaked).action == "marked" and cloud.deleted == []


def test_a_primary_less_group_whose_members_changed_starts_over(db, cloud, platform):
    # A leftover volume of a failed placeholder: no instance, so no primary; the same ref and
    # region, other members, is another group.
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    vol = cloud.create(ResourceKind.VOLUME, "r1", {DEFAULT_TAG_KEY: issued.provider_ref},
                       created_at=datetime.fromisoformat("2026-01-01T00:00:00+00:00"))
    platform.age(issued.owner_id)
    platform.ledger.hard_delete(issued.owner_id)
    first = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    (g,) = [g for g in first.groups if g.provider_ref == issued.provider_ref]
    assert (g.primary_id, g.action) == (None, "marked")
    cloud.create(ResourceKind.VOLUME, "r1", {DEFAULT_TAG_KEY: issued.provider_ref},
                 created_at=datetime.fromisoformat("2026-01-01T00:00:00+00:00"))
    wait_out()
    second = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    (g,) = [g for g in second.groups if g.provider_ref == issued.provider_ref]
    assert g.action == "marked" and len(g.resources) == 2 and vol not in cloud.deleted


def test_a_region_that_failed_to_list_starts_its_marks_over(db, cloud, platform):
    # A group it showed but found tracked leaves no row: not seen cannot be told from changed.
    _, _, leaked = platform.terminated_leak(region="r2")
    run_cycle(pipeline(db, cloud), "mem", mode="delete")
    cloud.failing_regions.add("r2")
    run_cycle(pipeline(db, cloud), "mem", mode="delete")  # r2 not listed
    cloud.failing_regions.clear()
    wait_out()
    after = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(after, leaked).action == "marked" and leaked not in cloud.deleted
    wait_out()
    assert group(run_cycle(pipeline(db, cloud), "mem", mode="delete"), leaked).action == "deleted"


def test_listings_too_far_apart_confirm_nothing(db, cloud, platform):
    # A backend off (or failing) for weeks: its first listing back marks again.
    _, _, leaked = platform.terminated_leak()
    first = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    with db.transaction() as conn:  # that listing was three intervals and the window ago
        conn.run("UPDATE cycles SET listed_at = listed_at - interval '2702 s' WHERE id = :c", c=first.cycle_id)
        conn.run("UPDATE orphan_marks SET marked_at = marked_at - interval '2702 s'")
    after = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(after, leaked).action == "marked" and leaked not in cloud.deleted


def test_a_row_may_only_lengthen_the_window(db, cloud, platform):
    _, _, leaked = platform.terminated_leak()
    with db.transaction() as conn:
        conn.run("UPDATE backends SET settings = '{\"confirm_seconds\": 0}' WHERE id = 'mem'")
    run_cycle(pipeline(db, cloud), "mem", mode="delete")
    wait_out()
    # the row's 0 is ignored: the stack's window applied, and has passed now
    assert group(run_cycle(pipeline(db, cloud), "mem", mode="delete"), leaked).action == "deleted"

    _, _, other = platform.terminated_leak()
    with db.transaction() as conn:
        conn.run("UPDATE backends SET settings = '{\"confirm_seconds\": 3600}' WHERE id = 'mem'")
    run_cycle(pipeline(db, cloud, window=0), "mem", mode="delete")
    wait_out()
    # the stack turned the window off; the row lengthened it to an hour
    later = run_cycle(pipeline(db, cloud, window=0), "mem", mode="delete")
    assert group(later, other).action == "marked" and other not in cloud.deleted


def test_the_blast_radius_cap_counts_only_the_groups_deleted_now(db, cloud, platform):
    _, _, first_leak = platform.terminated_leak()
    run_cycle(pipeline(db, cloud, ORPHAN_CLEANUP_MAX_DELETES=1), "mem", mode="delete")
    more = [platform.terminated_leak()[2] for _ in range(3)]
    wait_out()
    report = run_cycle(pipeline(db, cloud, ORPHAN_CLEANUP_MAX_DELETES=1), "mem", mode="delete")
    assert report.blocked_reason is None
    assert group(report, first_leak).action == "deleted"
    assert [group(report, m).action for m in more] == ["marked"] * 3


def test_window_zero_deletes_in_the_first_delete_cycle(db, cloud, platform):
    _, _, leaked = platform.terminated_leak()
    report = run_cycle(pipeline(db, cloud, window=0), "mem", mode="delete")
    assert group(report, leaked).action == "deleted" and report.outcome == "clean"


def test_the_digest_lists_the_marked_groups_with_their_delete_after(db, cloud, platform):
    from orphan_cleanup.core.digest import digest, slack_text
    from orphan_cleanup.ledger.store import LedgerStore

    _, _, leaked = platform.terminated_leak()
    first = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    doc = digest(LedgerStore(db).digest_facts(first.cycle_id), interval_seconds=900)
    assert doc is not None  # a new orphan: news
    [marked] = doc["marked"]
    assert marked["primary_id"] == leaked and doc["counts"]["marked"] == 1
    after = datetime.fromisoformat(marked["delete_after"])
    # the detail says it to the second, rounded up (never earlier than it goes)
    said = (after.astimezone(UTC) + timedelta(microseconds=999_999)).replace(microsecond=0)
    assert after > first.listed_at and group(first, leaked).detail.startswith(
        f"deleted after {said:%Y-%m-%dT%H:%M:%SZ}")
    assert f"marked, deleted after {marked['delete_after']}" in slack_text(doc)

    # marked again, no news: no digest
    again = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert digest(LedgerStore(db).digest_facts(again.cycle_id), interval_seconds=900) is None


def test_a_listing_in_between_that_failed_before_its_sweep_starts_the_window_over(db, cloud, platform):
    # Nothing it saw may have been judged: a group it found tracked, say, would not be known.
    _, _, leaked = platform.terminated_leak()
    run_cycle(pipeline(db, cloud), "mem", mode="delete")  # marked
    cloud.failing_regions.update({"r1", "r2"})
    assert run_cycle(pipeline(db, cloud), "mem", mode="delete").outcome == "failed"
    cloud.failing_regions.clear()
    wait_out()
    after = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(after, leaked).action == "marked" and cloud.deleted == []


def test_a_keep_that_won_over_a_delete_starts_the_window_over_when_it_ends(db, cloud, platform):
    """The deleter found a keep written after the plan (the group recorded protected in that
    cycle, after its sweep): once the keep ends, the group is marked again, not deleted on
    the mark it had before the keep."""
    ref, _, leaked = platform.terminated_leak()
    run_cycle(pipeline(db, cloud), "mem", mode="delete")  # marked
    wait_out()

    def keep_while_asked(plan) -> bool:
        with db.transaction() as conn:  # a short keep, written between the plan and the delete
            conn.run("INSERT INTO orphan_keeps (backend_id, provider_ref, until)"
                     " VALUES ('mem', :r, oc_clock() + interval '1 s')", r=ref)
        return True

    kept = run_cycle(pipeline(db, cloud), "mem", mode="delete", confirm=keep_while_asked)
    assert (group(kept, leaked).verdict, group(kept, leaked).reason) == ("protected", "kept_by_operator")
    time.sleep(1.2)  # the keep has ended
    after = run_cycle(pipeline(db, cloud), "mem", mode="delete")
    assert group(after, leaked).action == "marked" and leaked not in cloud.deleted
