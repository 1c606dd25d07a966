"""The tick's horizon (issue #17 item 5): the statement sends no STEP 1 facts for a
backend that holds no lease and is due later than any tolerance
(``queries.TICK_HORIZON_SECONDS``), and the tick calls it not due. The filter must be
conservative: every backend Python would call due (SAFETY.md rule 9), at the edges of
the tolerance, in a backoff, on a short interval, never cleaned, enrolled by the same
statement, or active through a sibling of its account, still comes with its facts.
Real pipeline, real Postgres, the database's clock."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_ref, db_now

A, B = "111111111111", "222222222222"
HOUR = {"interval_seconds": 3600}  # a tolerance of 60 s, the largest


def pipeline(db: Database, **kw) -> Pipeline:
    return Pipeline(settings=Settings(), db=db, provider_for=lambda b: None, listing_queue=InProcessQueue(),
                    delete_queue=InProcessQueue(), jobs_queue=InProcessQueue(), **kw)


def enrolled(db: Database, backend_id: str, *, account: str = A, settings: dict | None = None,
             mode: str | None = "report", **cleanup: str) -> None:
    """A backend and its cleanup row: cleaned an hour ago in its mode; ``cleanup`` sets
    more columns, as SQL over the database clock ``t``."""
    add_backend(db, backend_id, account=account, settings=settings or HOUR, mode=mode)
    sets = {"clean_at": "t - interval '1 hour'", "clean_mode": "'report'", **cleanup}
    with db.connection() as conn:
        conn.run("INSERT INTO cleanup (backend_id) VALUES (:b)", b=backend_id)
        conn.run("UPDATE cleanup SET " + ", ".join(f"{k} = {v}" for k, v in sets.items()) +
                 " FROM (SELECT oc_clock() AS t) clk WHERE backend_id = :b", b=backend_id)


def quiet_ledger(db: Database) -> None:
    """Every activity so far (the backends' inserts, the refs) before every clean."""
    with db.connection() as conn:
        conn.run("UPDATE ledger_activity SET at = oc_clock() - interval '2 hours'")


def activity(db: Database, backend_id: str | None, ago: str) -> None:
    with db.connection() as conn:
        conn.run("INSERT INTO ledger_activity (backend_id, at, kind)"
                 " VALUES (:b, oc_clock() - CAST(:ago AS interval), 'instances')", b=backend_id, ago=ago)


def facts_sent(db: Database) -> dict[str, bool]:
    """Per backend: whether the tick's statement sent its facts (after the tick: it enrolls)."""
    with db.connection() as conn:
        _, rows = queries.tick_rows_from_json(
            conn.run(queries.TICK_SQL, horizon=queries.TICK_HORIZON_SECONDS)[0][0])
    return {bytes(raw).split(b'"')[1].decode(): facts is not None for raw, facts in rows}


def test_every_backend_python_calls_due_keeps_its_facts_and_only_later_ones_lose_them(emptied_db):
    db = emptied_db
    add_ref(db)  # the ledger has issued a ref: the tick enrolls
    # due at the edge: next_due_at written as now + 60 s, the tolerance of an hourly interval
    enrolled(db, "at-tolerance", next_due_at="t + interval '60 seconds'")
    # a backoff waits exactly (tolerance 0): due once reached, not due a little before
    enrolled(db, "backoff-due", retry_delay_seconds="300", next_due_at="t - interval '1 second'")
    enrolled(db, "backoff-later", retry_delay_seconds="300", next_due_at="t + interval '30 seconds'")
    # a 300 s interval: a tolerance of 30 s
    enrolled(db, "short-due", settings={"interval_seconds": 300}, next_due_at="t + interval '30 seconds'")
    enrolled(db, "short-later", settings={"interval_seconds": 300}, next_due_at="t + interval '45 seconds'")
    enrolled(db, "null-due", clean_at="NULL", clean_mode="NULL")  # never cleaned, never processed
    enrolled(db, "never-cleaned-later", clean_at="NULL", clean_mode="NULL", next_due_at="t + interval '2 hours'")
    add_backend(db, "fresh", account=A, settings=HOUR, mode="report")  # enrolled by the tick's own statement
    # account B: a due backend whose only activity is its sibling's, and the sibling due in two hours
    enrolled(db, "sibling-due", account=B, next_due_at="t - interval '1 second'")
    enrolled(db, "sibling-later", account=B, next_due_at="t + interval '2 hours'")
    # leases and mode, whatever next_due_at
    enrolled(db, "expired-lease-later", lease_owner="'c-1'", lease_expires_at="t - interval '1 second'",
             next_due_at="t + interval '2 hours'")
    enrolled(db, "busy-later", lease_owner="'c-2'", lease_expires_at="t + interval '1 hour'",
             next_due_at="t + interval '2 hours'")
    enrolled(db, "off-later", mode="off", next_due_at="t + interval '2 hours'")
    quiet_ledger(db)
    activity(db, "sibling-later", ago="30 minutes")  # after sibling-due's clean

    result = pipeline(db).run_tick()

    assert result.due == {"null-due": "never_cleaned", "fresh": "never_cleaned", "sibling-due": "activity",
                          "expired-lease-later": "lease_expired"}
    assert result.skipped == {"at-tolerance": "no_activity", "backoff-due": "no_activity",
                              "backoff-later": "not_due", "short-due": "no_activity", "short-later": "not_due",
                              "never-cleaned-later": "not_due", "sibling-later": "not_due",
                              "busy-later": "busy", "off-later": "off"}
    # and the next statement leaves out the facts of exactly the backends due later than
    # the horizon: those three, and the idle ones the tick marked (due an interval later)
    sent = facts_sent(db)
    assert {b for b, s in sent.items() if not s} == {"never-cleaned-later", "sibling-later", "off-later",
                                                      "at-tolerance", "backoff-due", "short-due"}


def test_activity_of_no_known_backend_makes_a_due_backend_due_beside_later_ones(emptied_db):
    db = emptied_db
    add_ref(db)
    enrolled(db, "due", next_due_at="t - interval '1 second'")
    enrolled(db, "later", next_due_at="t + interval '2 hours'")
    quiet_ledger(db)
    activity(db, None, ago="10 minutes")  # a NULL backend: may concern any backend
    result = pipeline(db).run_tick()
    assert (result.due, result.skipped) == ({"due": "activity"}, {"later": "not_due"})


def test_a_timestamp_msgspec_cannot_read_is_decoded_as_before(emptied_db):
    # plain SQL may write -infinity: the document falls back to the slower decoder, rows
    # without facts included, and the tick decides as it did (any activity is after -infinity)
    db = emptied_db
    add_ref(db)
    enrolled(db, "odd", clean_at="'-infinity'", next_due_at="t - interval '1 second'")
    enrolled(db, "later", next_due_at="t + interval '2 hours'")
    quiet_ledger(db)
    result = pipeline(db).run_tick()
    assert (result.due, result.skipped) == ({"odd": "activity"}, {"later": "not_due"})


def test_a_clock_of_its_own_reads_every_backends_facts(emptied_db):
    # given a backend due in two hours by the database clock, and a pipeline whose own
    # clock is three hours ahead (tests and the simulation may inject one)
    db = emptied_db
    add_ref(db)
    enrolled(db, "later", next_due_at="t + interval '2 hours'")
    quiet_ledger(db)
    ahead = db_now(db) + timedelta(hours=3)
    # then the tick decides on that clock: due (idle), not left out by the database's horizon
    result = pipeline(db, clock=lambda: ahead).run_tick()
    assert result.skipped == {"later": "no_activity"}


def test_a_warm_tick_sees_a_changed_backend_row_and_logs_a_misconfigured_one_every_time(emptied_db, caplog):
    db = emptied_db
    add_ref(db)
    enrolled(db, "changes", next_due_at="t + interval '2 hours'")
    enrolled(db, "broken", next_due_at="t + interval '2 hours'", settings={**HOUR, "tag_key": ""})
    p = pipeline(db)
    with caplog.at_level(logging.ERROR):
        assert p.run_tick().skipped == {"changes": "not_due"}
        with db.connection() as conn:
            conn.run("UPDATE backends SET mode = 'off' WHERE id = 'changes'")
        assert p.run_tick().skipped == {"changes": "off"}
    assert sum("backend broken skipped" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("interval", [1, 59, 60, 599, 600, 601, 3600, 86400, 10**9])
def test_the_horizon_covers_every_tolerance(interval):
    from orphan_cleanup.core import classify
    from tests.support.ledger_helpers import limits

    assert classify.due_tolerance(limits(interval_seconds=interval)) <= timedelta(seconds=queries.TICK_HORIZON_SECONDS)
