"""Cycle bookkeeping against a real ledger (cycle_state.py over ledger/store.py):
enrollment, STEP 1 and the lease, fencing, the one-statement join,
idempotent batches, and STEP 7 as stored."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY
from orphan_cleanup.core.classify import ClassifyContext
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.decisions import BatchApplication
from orphan_cleanup.core.errors import LeaseLost
from orphan_cleanup.core.listing import RegionFailure
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus, Outcome
from orphan_cleanup.cycle.cycle_state import (
    DeleteDecision,
    delete_allowed,
    dispatch_deletes,
    fail_cycle,
    finish_if_complete,
    record_delete,
    set_listed_at,
    start_cycle,
)
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.session import LedgerSession
from orphan_cleanup.ledger.store import LedgerStore as S
from tests.support.ledger_helpers import (
    T0,
    CountingConnection,
    add_backend,
    add_instance,
    add_instances_bulk,
    add_ref,
    add_refs_bulk,
    cleanup_row,
    count_rows,
    cycle_row,
    db_now,
    group,
    leftovers,
    limits,
    make_ref,
    table_counts,
)

B = "aws-prod"
LIM = limits()  # margin 0: anything before the listing can be classified


# One migrated database for the module, emptied before each test.
@pytest.fixture
def db(emptied_db):
    return emptied_db


# ---- helpers -------------------------------------------------------------------

def payload(db, cycle_id, groups=(), *, listed_at, seq=0, last=True, batch_count=None, failures=(),
            mode="report", lim=LIM):
    """A classified batch, shaped exactly as the classifier function ships it."""
    batch = ListingBatch(cycle_id=cycle_id, backend=B, seq=seq, listed_at=listed_at, mode=mode,
                         groups=tuple(groups), last=last,
                         batch_count=(batch_count or seq + 1) if last else None,
                         failures=tuple(RegionFailure(region=r, error="unavailable") for r in failures))
    records = S(db).load_records(B, batch.groups)
    ctx = ClassifyContext(backend_id=B, scope="aws:123456789012", listed_at=listed_at, margin=timedelta(seconds=lim.margin_seconds),
                          protect_key=DEFAULT_PROTECT_KEY)
    return classify_batch(batch, records, ctx, mode=batch.mode, record_all=batch.record_all)


def apply(db, p):
    with S(db).session() as session:
        return session.apply(p)


def begin(db, *, mode="report", manual=True, now=None, lim=LIM, listed_at=None):
    """Start a cycle and record its listing time."""
    started = start_cycle(S(db), B, mode, lim, manual=manual, now=now)
    assert started.cycle is not None, started.reason
    listed_at = listed_at or db_now(db)
    set_listed_at(S(db), started.cycle.id, listed_at)
    return started.cycle, listed_at


def clean_cycle(db, *, mode="report", manual=False, lim=LIM, listed_at=None, groups=()):
    cycle, listed_at = begin(db, mode=mode, manual=manual, lim=lim, listed_at=listed_at)
    result = apply(db, payload(db, cycle.id, groups, listed_at=listed_at, mode=mode, lim=lim))
    assert result.status == "applied" and result.listing_complete
    assert finish_if_complete(S(db), cycle.id, lim) is Outcome.CLEAN
    return cycle, listed_at


@pytest.fixture
def ledger(db):
    """Backend B with a tracked instance and a pending owner, all long ago."""
    add_backend(db, B)
    add_instance(db, instance_id="live-1", backend_id=B, primary_id="i-live", region="us-east-1",
                 issued_at=T0, created_at=T0, provisioned_at=T0)
    add_instance(db, instance_id="pending-1", status="pending", issued_at=T0, created_at=T0)
    return db


def orphan_ledger(db, n=1):
    """``n`` refs whose owners were hard-deleted long ago; their listed groups."""
    refs = [add_ref(db, issued_at=T0) for _ in range(n)]
    return [group(r, f"i-{r}", created_at=T0) for r in refs]


# ---- enrollment ------------------------------------------------------------------

def test_enroll_waits_for_refs_and_is_idempotent(db):
    # given two backends and no issued ref
    add_backend(db, "A")
    add_backend(db, B)
    assert S(db).enroll() == 0
    assert count_rows(db, "cleanup") == 0
    # when the ledger has a ref
    add_ref(db)
    # then each backend gets one cleanup row, once
    assert S(db).enroll() == 2
    assert S(db).enroll() == 0
    assert count_rows(db, "cleanup") == 2
    row = cleanup_row(db, B)
    assert (row["clean_at"], row["fence"], row["lease_owner"], row["last_outcome"]) == (None, 0, None, None)
    # and a backend added later is enrolled by the next call
    add_backend(db, "C")
    assert S(db).enroll() == 1


# ---- STEP 1 and the lease --------------------------------------------------------

def test_scheduled_run_of_a_never_cleaned_backend_starts(ledger):
    started = start_cycle(S(ledger), B, "report", LIM, manual=False)
    assert started.reason == "never_cleaned"
    assert started.cycle is not None and started.cycle.fence == 1
    row = cleanup_row(ledger, B)
    assert (row["fence"], row["lease_owner"]) == (1, started.cycle.id)
    assert cycle_row(ledger, started.cycle.id)["mode"] == "report"


def test_no_activity_after_a_clean_cycle_only_marks_processed(ledger):
    # given a clean cycle and no ledger change since
    clean_cycle(ledger, groups=[group(make_ref(), "i-x")])
    before = cleanup_row(ledger, B)
    n_cycles = count_rows(ledger, "cycles")
    # when the schedule fires, an interval later
    now = _after(ledger, 1)
    started = start_cycle(S(ledger), B, "report", LIM, manual=False, now=now)
    # then nothing starts and only the processing times move
    assert (started.cycle, started.reason) == (None, "no_activity")
    after = cleanup_row(ledger, B)
    assert after["last_processed_at"] == now
    assert after["next_due_at"] == now + timedelta(seconds=LIM.interval_seconds)
    for column in ("last_processed_at", "next_due_at"):
        del after[column], before[column]
    assert after == before
    assert count_rows(ledger, "cycles") == n_cycles


def _after(db, intervals):
    """A time past ``intervals`` cleanup intervals: scheduled runs are due again."""
    return db_now(db) + intervals * timedelta(seconds=LIM.interval_seconds + 1)


def _sql(db, statement):
    with db.connection() as conn:
        conn.run(statement)


ACTIVITY = {
    "new ref": lambda db: LedgerClient(db).issue_ref(),
    "instance insert": lambda db: _sql(db, "INSERT INTO instances (id, provider_ref, status, backend_id)"
                                           " SELECT 'late-1', provider_ref, 'idle', 'aws-prod' FROM provider_refs"
                                           " WHERE owner_id = 'spare'"),
    "status update": lambda db: LedgerClient(db).set_status("live-1", OwnerStatus.BUSY),
    "provisioning update": lambda db: LedgerClient(db).mark_provisioning(
        "pending-1", backend_id=B, primary_id="i-new", region="us-east-1"),
    "termination": lambda db: LedgerClient(db).mark_terminated("live-1"),
    "soft delete": lambda db: LedgerClient(db).soft_delete("live-1"),
    "hard delete (client)": lambda db: LedgerClient(db).hard_delete("pending-1"),
    "hard delete (plain SQL)": lambda db: _sql(db, "DELETE FROM instances WHERE id = 'live-1'"),
}


@pytest.mark.parametrize("change", ACTIVITY.values(), ids=ACTIVITY.keys())
def test_ledger_activity_after_a_clean_cycle_starts_a_scheduled_run(ledger, change):
    # given a clean cycle (and a ref whose owner row is not written yet)
    add_ref(ledger, owner_id="spare", issued_at=T0)
    clean_cycle(ledger)
    assert start_cycle(S(ledger), B, "report", LIM, manual=False, now=_after(ledger, 1)).reason == "no_activity"
    # when the ledger changes
    change(ledger)
    # then the next scheduled run lists
    started = start_cycle(S(ledger), B, "report", LIM, manual=False, now=_after(ledger, 3))
    assert started.reason == "activity" and started.cycle is not None


def test_mode_change_starts_a_scheduled_run(ledger):
    clean_cycle(ledger, mode="report")
    started = start_cycle(S(ledger), B, "delete", LIM, manual=False, now=_after(ledger, 1))
    assert started.reason == "mode_changed" and started.cycle is not None
    assert cycle_row(ledger, started.cycle.id)["mode"] == "delete"


def test_manual_run_always_starts(ledger):
    first, _ = clean_cycle(ledger)
    assert start_cycle(S(ledger), B, "report", LIM, manual=False, now=_after(ledger, 1)).reason == "no_activity"
    started = start_cycle(S(ledger), B, "report", LIM, manual=True)
    assert started.reason == "manual"
    assert started.cycle.fence == first.fence + 1
    assert cycle_row(ledger, started.cycle.id)["manual"] is True


@pytest.mark.parametrize("manual", [False, True], ids=["scheduled", "manual"])
def test_a_live_lease_makes_start_busy(ledger, manual):
    # given a running cycle
    now = datetime.now(timezone.utc)
    running = start_cycle(S(ledger), B, "report", LIM, manual=True, now=now).cycle
    before = cleanup_row(ledger, B)
    # when another start comes just before its deadline
    later = now + timedelta(seconds=LIM.cycle_deadline_seconds) - timedelta(microseconds=1)
    started = start_cycle(S(ledger), B, "report", LIM, manual=manual, now=later)
    # then it is busy and changes nothing
    assert (started.cycle, started.reason) == (None, "busy")
    assert cleanup_row(ledger, B) == before
    assert count_rows(ledger, "cycles") == 1
    assert cycle_row(ledger, running.id)["outcome"] is None


def test_an_expired_lease_fails_the_old_cycle_and_starts_with_the_next_fence(ledger):
    # given a cycle that never finished
    now = datetime.now(timezone.utc)
    old = start_cycle(S(ledger), B, "report", LIM, manual=True, now=now).cycle
    # when a scheduled run comes at its deadline
    started = start_cycle(S(ledger), B, "report", LIM, manual=False,
                          now=now + timedelta(seconds=LIM.cycle_deadline_seconds))
    # then the old cycle is failed and a new one holds the next fence
    assert started.cycle is not None and started.cycle.fence == old.fence + 1
    assert started.reason == "never_cleaned"
    failed = cycle_row(ledger, old.id)
    assert (failed["outcome"], failed["failed"]) == ("failed", True)
    assert "deadline" in failed["error"]
    row = cleanup_row(ledger, B)
    assert (row["lease_owner"], row["fence"], row["last_outcome"], row["clean_at"]) == (
        started.cycle.id, old.fence + 1, "failed", None)
    assert row["retry_delay_seconds"] == 60


def test_a_stale_holder_can_write_nothing(ledger):
    # given a delete-mode cycle that listed an orphan and dispatched its deletion...
    now = datetime.now(timezone.utc)
    groups = orphan_ledger(ledger)
    stale, listed_at = begin(ledger, mode="delete", now=now)
    assert apply(ledger, payload(ledger, stale.id, groups, listed_at=listed_at, seq=0, last=False,
                                 mode="delete")).status == "applied"
    assert apply(ledger, payload(ledger, stale.id, [], listed_at=listed_at, seq=1, last=True,
                                 mode="delete")).status == "applied"
    assert [g.key for g in dispatch_deletes(S(ledger), stale.id, LIM).groups] == [groups[0].key]
    # ...then lost its lease to a newer cycle
    fresh = start_cycle(S(ledger), B, "delete", LIM, manual=False,
                        now=now + timedelta(seconds=LIM.cycle_deadline_seconds + 1)).cycle
    assert fresh is not None
    more = orphan_ledger(ledger)
    counts, lease, fresh_row = table_counts(ledger), cleanup_row(ledger, B), cycle_row(ledger, fresh.id)
    # when the stale holder tries every write it has
    assert apply(ledger, payload(ledger, stale.id, more, listed_at=listed_at, seq=2, last=True,
                                 mode="delete")).status == "fenced"
    with pytest.raises(LeaseLost), S(ledger).cycle(stale.id):
        pass
    with pytest.raises(LeaseLost):
        set_listed_at(S(ledger), stale.id, listed_at)
    with pytest.raises(LeaseLost):
        record_delete(S(ledger), stale.id, groups[0], LIM,
                              result=DeleteResult(status=DeleteStatus.DELETED, deleted=(groups[0].primary_id,)))
    with pytest.raises(LeaseLost):
        record_delete(S(ledger), stale.id, groups[0], LIM, error="boom")
    with pytest.raises(LeaseLost):
        dispatch_deletes(S(ledger), stale.id, LIM)
    with pytest.raises(LeaseLost):
        delete_allowed(S(ledger), stale.id, groups[0])
    assert fail_cycle(S(ledger), stale.id, "listing failed", LIM) is None
    assert finish_if_complete(S(ledger), stale.id, LIM) is None
    # then nothing changed
    assert table_counts(ledger) == counts
    assert cleanup_row(ledger, B) == lease
    assert cycle_row(ledger, fresh.id) == fresh_row
    with ledger.connection() as conn:
        assert conn.run("SELECT state FROM delete_requests WHERE cycle_id = :c", c=stale.id) == [["queued"]]
        assert conn.run("SELECT state FROM orphans") == [["open"]]


def test_two_concurrent_starts_take_one_lease(ledger):
    barrier = threading.Barrier(2)

    def go(_):
        barrier.wait(timeout=10)
        return start_cycle(S(ledger), B, "report", LIM, manual=True)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(go, range(2)))
    assert sorted(r.reason for r in results) == ["busy", "manual"]
    winner = next(r.cycle for r in results if r.cycle)
    assert cleanup_row(ledger, B)["lease_owner"] == winner.id
    assert count_rows(ledger, "cycles") == 1


def test_concurrent_batches_complete_the_listing_exactly_once(ledger):
    # given a cycle listed in 8 batches delivered all at once (and the last one twice)
    cycle, listed_at = begin(ledger)
    batches = [payload(ledger, cycle.id, [group(make_ref(), f"i-{seq}")], listed_at=listed_at, seq=seq,
                       last=seq == 7, batch_count=8) for seq in range(8)]
    batches.append(batches[-1])

    def deliver(p):
        return apply(ledger, p)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(deliver, batches))
    # then each batch counted once and exactly one delivery saw the listing complete
    assert sorted(r.status for r in results) == ["applied"] * 8 + ["duplicate"]
    assert sum(1 for r in results if r.listing_complete) == 1
    row = cycle_row(ledger, cycle.id)
    assert (row["applied_batches"], row["expected_batches"], row["groups_listed"]) == (8, 8, 8)
    assert finish_if_complete(S(ledger), cycle.id, LIM) is Outcome.CLEAN


# ---- STEP 3: one statement ------------------------------------------------------

def test_load_records_is_one_statement_for_500_groups(db):
    # given a ledger with live, soft-deleted and hard-deleted owners, and leftovers of earlier orphans
    add_backend(db, B)
    add_backend(db, "other", account="210987654321")
    add_backend(db, "sibling")  # another backend of B's account (rule 10)
    live = [make_ref() for _ in range(200)]
    soft = [make_ref() for _ in range(100)]
    hard = [make_ref() for _ in range(100)]
    left = [make_ref() for _ in range(50)]
    unknown = [make_ref() for _ in range(50)]
    add_refs_bulk(db, live + soft + hard + left)
    add_instances_bulk(db, live, backend_id=B)
    add_instances_bulk(db, soft, backend_id=B, deleted_at=T0 + timedelta(hours=1))
    with db.connection() as conn:
        conn.run("INSERT INTO orphan_resources (backend_id, provider_ref, resource_id)"
                 " SELECT b, x, b || '-vol-' || x FROM unnest(CAST(:refs AS text[])) AS x,"
                 " unnest(ARRAY[:b1, :b2]) AS b", refs=left, b1=B, b2="other")
        conn.run("INSERT INTO orphan_resources (backend_id, provider_ref, resource_id)"
                 " SELECT 'sibling', x, 'sibling-eni-' || x FROM unnest(CAST(:refs AS text[])) AS x",
                 refs=left[:10])
    groups = ([group(r, f"i-{r}") for r in live + soft + hard + unknown]
              + [leftovers(r, f"{B}-vol-{r}") for r in left])
    assert len(groups) == 500
    # when the batch is joined with the ledger
    with db.connection() as conn:
        counting = CountingConnection(conn)
        records = LedgerSession(counting).load_records(B, groups)
    # then it took exactly one statement
    assert len(counting.statements) == 1
    # and every known ref came back, unknown ones did not
    assert set(records) == set(live + soft + hard + left)
    assert all(records[r].instance_found and records[r].deleted_at is None for r in live)
    assert all(records[r].instance_found and records[r].deleted_at == T0 + timedelta(hours=1) for r in soft)
    gone = [records[r] for r in hard + left]
    assert all(not g.instance_found and g.status is None and g.owner_id == f"inst-{g.provider_ref}" for g in gone)
    assert all(g.issued_at == T0 for g in gone)
    # leftovers carry the known orphan resource ids of this backend's account only: a sibling
    # backend's deletion counts (ownership by account), another account's does not
    assert all(records[r].known_orphan_resource_ids == {f"{B}-vol-{r}", f"sibling-eni-{r}"} for r in left[:10])
    assert all(records[r].known_orphan_resource_ids == {f"{B}-vol-{r}"} for r in left[10:])
    assert all(records[r].known_orphan_resource_ids == frozenset() for r in live + hard)
    live_rec = records[live[0]]
    assert (live_rec.status, live_rec.backend_id, live_rec.primary_id) == ("idle", B, f"i-{live[0]}")


def test_load_records_of_an_empty_batch_issues_nothing(db):
    with db.connection() as conn:
        counting = CountingConnection(conn)
        assert LedgerSession(counting).load_records(B, []) == {}
    assert counting.statements == []


# ---- batches ------------------------------------------------------------------------

def test_the_same_batch_twice_is_applied_once(ledger):
    # given a cycle and a batch with an orphan and a tracked group
    cycle, listed_at = begin(ledger)
    groups = orphan_ledger(ledger) + [group(make_ref(), "i-unknown"),
                                      group(_refs_of(ledger, "live-1")[0], "i-live")]
    p = payload(ledger, cycle.id, groups, listed_at=listed_at, seq=0, last=False)
    first = apply(ledger, p)
    assert first.status == "applied" and first.listing_complete is False
    counts, row = table_counts(ledger), cycle_row(ledger, cycle.id)
    assert counts["orphans"] == 1 and counts["events"] == 1
    # when it is delivered again
    second = apply(ledger, p)
    # then the duplicate changes nothing
    assert second.status == "duplicate"
    assert table_counts(ledger) == counts
    assert cycle_row(ledger, cycle.id) == row
    assert row["applied_batches"] == 1 and row["groups_listed"] == 3


def _refs_of(db, instance_id):
    with db.connection() as conn:
        return [r[0] for r in conn.run("SELECT provider_ref FROM instances WHERE id = :i", i=instance_id)]


def test_batches_out_of_order_finish_once_all_are_in(ledger):
    cycle, listed_at = begin(ledger)
    # the last batch (of 2) arrives first
    assert apply(ledger, payload(ledger, cycle.id, [], listed_at=listed_at, seq=1, last=True,
                                 batch_count=2)).listing_complete is False
    assert finish_if_complete(S(ledger), cycle.id, LIM) is None
    result = apply(ledger, payload(ledger, cycle.id, [group(make_ref(), "i-1")], listed_at=listed_at,
                                   seq=0, last=False))
    assert result.listing_complete is True
    assert finish_if_complete(S(ledger), cycle.id, LIM) is Outcome.CLEAN
    # and only once
    assert finish_if_complete(S(ledger), cycle.id, LIM) is None


def test_unknown_cycle(db):
    nope = BatchApplication(cycle_id="nope", seq=0, last=False, batch_count=None, failures=(), groups=0,
                            skipped=False)
    assert apply(db, nope).status == "unknown_cycle"
    with pytest.raises(LeaseLost), S(db).cycle("nope"):
        pass


# ---- STEP 7 as stored ----------------------------------------------------------------

def _due_offset(db, since, until):
    row = cleanup_row(db, B)
    return row, (row["next_due_at"] - since).total_seconds(), (row["next_due_at"] - until).total_seconds()


def test_clean_at_moves_only_on_clean_cycles_and_failures_back_off(ledger):
    lim = limits(margin_seconds=300, interval_seconds=900)
    # a clean cycle sets clean_at to its listing time minus the margin
    _, listed = clean_cycle(ledger, manual=True, lim=lim)
    first_clean = listed - timedelta(seconds=300)
    assert cleanup_row(ledger, B)["clean_at"] == first_clean

    # an unsettled cycle (a region failed) keeps it and retries after the interval
    cycle, listed2 = begin(ledger, lim=lim, listed_at=listed + timedelta(minutes=10))
    apply(ledger, payload(ledger, cycle.id, [], listed_at=listed2, failures=["eu-west-1"], lim=lim))
    t0 = datetime.now(timezone.utc)
    assert finish_if_complete(S(ledger), cycle.id, lim) is Outcome.UNSETTLED
    row, lo, hi = _due_offset(ledger, t0, datetime.now(timezone.utc))
    assert (row["clean_at"], row["retry_delay_seconds"], row["last_outcome"]) == (first_clean, 0, "unsettled")
    assert lo >= 900 >= hi

    # consecutive failed cycles keep it and back off 60, 120, 240 (with jitter)
    for expected in (60, 120, 240):
        cycle, _ = begin(ledger, lim=lim, listed_at=listed + timedelta(minutes=20))
        t0 = datetime.now(timezone.utc)
        assert fail_cycle(S(ledger), cycle.id, "listing failed: boom", lim) is Outcome.FAILED
        row, lo, hi = _due_offset(ledger, t0, datetime.now(timezone.utc))
        assert (row["clean_at"], row["retry_delay_seconds"], row["last_outcome"]) == (first_clean, expected, "failed")
        assert row["last_error"] == "listing failed: boom"
        assert lo >= 0.8 * expected and hi <= 1.2 * expected

    # the next clean cycle moves it forward and resets the delay
    _, listed3 = clean_cycle(ledger, manual=True, lim=lim, listed_at=listed + timedelta(minutes=30))
    row = cleanup_row(ledger, B)
    assert (row["clean_at"], row["retry_delay_seconds"], row["last_outcome"], row["last_error"]) == (
        listed3 - timedelta(seconds=300), 0, "clean", None)

    # and a clean cycle with an older listing never moves it back
    clean_cycle(ledger, manual=True, lim=lim, listed_at=listed)
    assert cleanup_row(ledger, B)["clean_at"] == listed3 - timedelta(seconds=300)


def test_a_skipped_group_makes_the_cycle_unsettled(ledger):
    # given a listed group whose owner is still pending
    clean_cycle(ledger, manual=True)
    clean_at = cleanup_row(ledger, B)["clean_at"]
    cycle, listed_at = begin(ledger)
    pending_ref = _refs_of(ledger, "pending-1")[0]
    apply(ledger, payload(ledger, cycle.id, [group(pending_ref, "i-p", created_at=T0)], listed_at=listed_at))
    assert finish_if_complete(S(ledger), cycle.id, LIM) is Outcome.UNSETTLED
    assert cleanup_row(ledger, B)["clean_at"] == clean_at
    with ledger.connection() as conn:
        assert conn.run("SELECT verdict, reason FROM cycle_groups WHERE cycle_id = :c", c=cycle.id) == [
            ["skipped", "owner_pending"]]


# ---- deletions -----------------------------------------------------------------------

def _deleting_cycle(db, lim=LIM, n=1):
    groups = orphan_ledger(db, n)
    cycle, listed_at = begin(db, mode="delete", lim=lim)
    assert apply(db, payload(db, cycle.id, groups, listed_at=listed_at, mode="delete", lim=lim)).listing_complete
    return cycle, groups, listed_at


RESULTS = {
    "deleted": (dict(result=DeleteResult(status=DeleteStatus.DELETED)), Outcome.CLEAN, "deleted", "deleted"),
    "deleting": (dict(result=DeleteResult(status=DeleteStatus.DELETING)), Outcome.UNSETTLED, "deleting", "deleting"),
    "skipped on re-read": (dict(result=DeleteResult(status=DeleteStatus.SKIPPED)), Outcome.UNSETTLED, "reported",
                           "open"),
    "delete failed": (dict(error="AccessDenied"), Outcome.FAILED, "delete_failed", "delete_failed"),
    "region tripped": (dict(error="timeout", trip_region=True), Outcome.UNSETTLED, "delete_failed",
                       "delete_failed"),
}


@pytest.mark.parametrize("kw, outcome, action, state", RESULTS.values(), ids=RESULTS.keys())
def test_a_recorded_deletion_finishes_the_cycle(ledger, kw, outcome, action, state):
    # given a delete-mode cycle with one orphan dispatched
    cycle, groups, _ = _deleting_cycle(ledger)
    dispatch = dispatch_deletes(S(ledger), cycle.id, LIM)
    assert (len(dispatch.groups), dispatch.blocked, dispatch.outcome) == (1, None, None)
    # registered once: a repeated dispatch (a redelivered last batch) registers nothing more and
    # gives back the requests still queued, to be published again (SAFETY.md rule 20)
    assert dispatch_deletes(S(ledger), cycle.id, LIM).groups == groups
    assert cycle_row(ledger, cycle.id)["open_deletes"] == 1
    assert delete_allowed(S(ledger), cycle.id, groups[0]) == DeleteDecision(None, groups[0])
    # when its deletion is recorded
    assert record_delete(S(ledger), cycle.id, groups[0], LIM, **kw) is outcome
    # then the cycle's outcome, the group's action and the orphan's state follow
    assert cycle_row(ledger, cycle.id)["outcome"] == outcome.value
    with ledger.connection() as conn:
        assert conn.run("SELECT action FROM cycle_groups WHERE cycle_id = :c", c=cycle.id) == [[action]]
        assert conn.run("SELECT state FROM orphans") == [[state]]
        # the event targets the (deleted) owner by the id kept in provider_refs
        assert conn.run("SELECT owner_id FROM events WHERE kind = :k", k=f"orphan_{action}") == [
            [f"inst-{groups[0].provider_ref}"]]
    # and recording it again changes nothing
    counts = table_counts(ledger)
    with pytest.raises(LeaseLost):  # the cycle is over
        record_delete(S(ledger), cycle.id, groups[0], LIM, **kw)
    assert table_counts(ledger) == counts


def test_a_second_record_of_the_same_deletion_is_a_no_op(ledger):
    cycle, groups, _ = _deleting_cycle(ledger, n=2)
    dispatch_deletes(S(ledger), cycle.id, LIM)
    assert record_delete(S(ledger), cycle.id, groups[0], LIM, error="boom") is None
    counts, row = table_counts(ledger), cycle_row(ledger, cycle.id)
    assert record_delete(S(ledger), cycle.id, groups[0], LIM,
                                 result=DeleteResult(status=DeleteStatus.DELETED)) is None
    assert delete_allowed(S(ledger), cycle.id, groups[0]).refusal == "already_done"
    assert table_counts(ledger) == counts
    assert cycle_row(ledger, cycle.id) == row
    # the failure still decides the outcome once the other group is in
    assert record_delete(S(ledger), cycle.id, groups[1], LIM,
                                 result=DeleteResult(status=DeleteStatus.DELETED)) is Outcome.FAILED


def test_blast_radius_cap_deletes_nothing_and_says_why(ledger):
    lim = limits(max_deletes=1)
    cycle, groups, _ = _deleting_cycle(ledger, lim=lim, n=2)
    dispatch = dispatch_deletes(S(ledger), cycle.id, lim)
    assert dispatch.groups == [] and dispatch.outcome is Outcome.UNSETTLED
    assert "2" in str(dispatch.blocked)
    assert count_rows(ledger, "delete_requests") == 0
    with ledger.connection() as conn:
        assert conn.run("SELECT DISTINCT action FROM cycle_groups WHERE cycle_id = :c", c=cycle.id) == [["reported"]]
        assert conn.run("SELECT kind FROM events WHERE cycle_id = :c", c=cycle.id) == [["delete_blocked"]]
    assert cycle_row(ledger, cycle.id)["blocked_reason"] == str(dispatch.blocked)


def test_delete_gate_is_per_ref(db):
    add_backend(db, B)
    assert S(db).acquire_gate(B, "aaaaaaaaaaaa", "h1", 60)
    assert not S(db).acquire_gate(B, "aaaaaaaaaaaa", "h2", 60)
    assert S(db).acquire_gate(B, "bbbbbbbbbbbb", "h2", 60)  # another ref never waits
    assert S(db).acquire_gate(B, "aaaaaaaaaaaa", "h1", 60)  # the holder may renew
    S(db).release_gate(B, "aaaaaaaaaaaa", "h2")  # not the holder: no effect
    assert not S(db).acquire_gate(B, "aaaaaaaaaaaa", "h2", 60)
    S(db).release_gate(B, "aaaaaaaaaaaa", "h1")
    assert S(db).acquire_gate(B, "aaaaaaaaaaaa", "h2", 60)


def test_an_expired_gate_can_be_taken(db):
    add_backend(db, B)
    assert S(db).acquire_gate(B, "aaaaaaaaaaaa", "crashed", 0)
    assert S(db).acquire_gate(B, "aaaaaaaaaaaa", "h2", 60)

