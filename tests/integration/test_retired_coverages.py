"""Migration 0020's triggers (docs/SAFETY.md rule 24) on the real Postgres: which changes of a
backends row leave a retired coverage and what it holds; that the tick, STEP 1 and STEP 3 see
it as they saw the backend; that it goes, with its schedule, when it is dropped."""

from __future__ import annotations

from typing import Any

import pg8000.exceptions
import pytest

from orphan_cleanup.core.errors import BackendBusy, ConfigError
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from tests.support.ledger_helpers import T0, add_backend, add_instance, db_now, group


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


def sql(db: Database, statement: str, **params: Any) -> list[list[Any]]:
    with db.connection() as conn:
        return conn.run(statement, **params)


def coverages(db: Database) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in sql(db, "SELECT backend_id, account, regions, mode, why FROM retired_coverages"
                                      " ORDER BY id")]


@pytest.mark.parametrize("mode", [None, "report", "delete", "off"])
def test_a_deleted_backend_leaves_its_coverage_with_its_last_settings_and_mode(db, mode):
    add_backend(db, "aws-a", regions=("us-east-1", "eu-west-1"), settings={"max_deletes": 3}, mode=mode)
    LedgerStore(db).enroll()  # no ref yet: nothing enrolled; a cleanup row by hand
    sql(db, "INSERT INTO cleanup (backend_id) VALUES ('aws-a')")

    sql(db, "DELETE FROM backends WHERE id = 'aws-a'")

    assert coverages(db) == [("aws-a", "123456789012", ["us-east-1", "eu-west-1"], mode, "removed")]
    [[settings]] = sql(db, "SELECT settings FROM retired_coverages")
    assert queries.json_value(settings) == {"max_deletes": 3}
    assert sql(db, "SELECT backend_id FROM cleanup") == []  # the backend's schedule went with it


@pytest.mark.parametrize(("row_mode", "shown"), [(None, "delete"), ("report", "report"), ("off", "off")])
def test_a_coverages_mode_follows_its_backends_row_down_never_up(db, row_mode, shown):
    # a moved backend's coverage kept its last mode, delete; the row's mode now lowers it
    add_backend(db, "aws-a", mode="delete")
    sql(db, "UPDATE backends SET account = '210987654321' WHERE id = 'aws-a'")
    sql(db, "UPDATE backends SET mode = :m WHERE id = 'aws-a'", m=row_mode)
    [[mode]] = sql(db, "SELECT mode FROM coverages() WHERE retired_from = 'aws-a'")
    assert mode == shown


@pytest.mark.parametrize(("change", "expected"), [
    ("regions = '{us-east-1}'", [("aws-a", "123456789012", ["eu-west-1"], None, "moved")]),
    ("regions = '{us-east-1,eu-west-1,us-west-2}'", []),
    ("account = '210987654321'", [("aws-a", "123456789012", ["eu-west-1", "us-east-1"], None, "moved")]),
    ("settings = '{\"role_arn\": \"arn:aws:iam::123456789012:role/y\"}'", []),  # the same account
    ("mode = 'delete'", []),
])
def test_a_moved_backend_leaves_what_it_no_longer_covers(db, change, expected):
    add_backend(db, "aws-a", regions=("eu-west-1", "us-east-1"))
    sql(db, f"UPDATE backends SET {change} WHERE id = 'aws-a'")
    assert coverages(db) == expected


def test_a_gcp_backends_project_is_its_scope(db):
    add_backend(db, "gcp-a", provider="gcp", account="acct", regions=("us-central1",),
                settings={"project": "p-one"})
    sql(db, """UPDATE backends SET settings = '{"project": "p-two"}' WHERE id = 'gcp-a'""")
    sql(db, """UPDATE backends SET account = 'other' WHERE id = 'gcp-a'""")  # the project still decides
    [[account, settings]] = sql(db, "SELECT account, settings FROM retired_coverages")
    assert (account, queries.json_value(settings)) == ("acct", {"project": "p-one"})


def test_truncating_backends_is_refused(db):
    add_backend(db, "aws-a")
    with pytest.raises(pg8000.exceptions.DatabaseError, match="rule 24"):
        sql(db, "TRUNCATE backends CASCADE")
    assert sql(db, "SELECT id FROM backends") == [["aws-a"]]


def test_the_tick_and_step_3_see_a_coverage_as_they_saw_its_backend(db):
    # Given: a live owner of aws-a (tracked there), whose backend row then goes
    add_backend(db, "aws-a")
    add_backend(db, "gcp-b", provider="gcp", account="proj", regions=("us-central1",))
    ref, _ = add_instance(db, backend_id="aws-a", primary_id="i-live", region="us-east-1",
                          issued_at=T0, created_at=T0, provisioned_at=T0)
    sql(db, "DELETE FROM backends WHERE id = 'aws-a'")
    [[cov]] = sql(db, "SELECT id FROM retired_coverages")
    store = LedgerStore(db)

    # The tick runs it (under its own id, knowing where it came from) and enrolls it
    runs = {b.id: b.retired_from for b in store.backends()}
    assert runs == {cov: "aws-a", "gcp-b": None}
    assert store.enroll() == 2
    # STEP 3: the owner naming the removed backend is of the coverage's account (rule 10)
    [record] = store.load_records(cov, [group(ref, "i-live", created_at=T0)]).values()
    assert record.owner_backend_scope == "aws:123456789012"
    # STEP 1: that owner's activity is the coverage's
    since = db_now(db)
    sql(db, "UPDATE instances SET status = 'busy' WHERE provider_ref = :r", r=ref)
    with store.session() as s:
        assert s.conn.run("SELECT " + queries.ACTIVITY_EXISTS.format(since=":t", backend=":b"), b=cov,
                          t=since)[0][0]

    # Dropped, it is no known backend any more: the owner is of no known backend (skipped)
    store.forget_coverage(cov)
    [record] = store.load_records("gcp-b", [group(ref, "i-live", created_at=T0)]).values()
    assert record.owner_backend_scope is None
    assert sql(db, "SELECT count(*) FROM cleanup WHERE backend_id = :c", c=cov) == [[0]]
    [[kind, details]] = sql(db, "SELECT kind, details FROM events WHERE backend_id = :c ORDER BY id DESC LIMIT 1",
                            c=cov)
    assert kind == "coverage_forgotten" and queries.json_value(details)["from"] == "aws-a"


def test_a_moved_backends_owner_is_judged_in_either_account(db):
    # An owner of aws-a, which moved to another account: the old account's coverage and the
    # backend itself both count its VMs as their account's (never a failover leftover)
    add_backend(db, "aws-a")
    ref, _ = add_instance(db, backend_id="aws-a", primary_id="i-live", region="us-east-1",
                          issued_at=T0, created_at=T0, provisioned_at=T0)
    sql(db, "UPDATE backends SET account = '210987654321' WHERE id = 'aws-a'")
    [[cov]] = sql(db, "SELECT id FROM retired_coverages")
    store = LedgerStore(db)
    [old] = store.load_records(cov, [group(ref, "i-live", created_at=T0)]).values()
    [new] = store.load_records("aws-a", [group(ref, "i-live", created_at=T0)]).values()
    assert (old.owner_backend_scope, new.owner_backend_scope) == ("aws:123456789012", "aws:210987654321")


def test_a_coverage_is_dropped_only_by_name_and_never_under_a_running_cycle(db):
    add_backend(db, "aws-a")
    sql(db, "DELETE FROM backends WHERE id = 'aws-a'")
    add_backend(db, "aws-a", account="210987654321")  # re-created elsewhere: the name is a backend again
    [[cov]] = sql(db, "SELECT id FROM retired_coverages")
    store = LedgerStore(db)
    with pytest.raises(ConfigError, match="no retired coverage 'aws-a'"):
        store.forget_coverage("aws-a")
    assert store.run_target("aws-a") == ("aws-a", None, False)
    assert store.run_target(cov) == (cov, None, True)
    sql(db, "INSERT INTO cleanup (backend_id, lease_owner, lease_expires_at) VALUES (:c, 'x', now() + interval '1h')",
        c=cov)
    with pytest.raises(BackendBusy):
        store.forget_coverage(cov)
    assert [r[0] for r in sql(db, "SELECT id FROM retired_coverages")] == [cov]


def test_a_backend_never_takes_a_retired_coverages_id(db):
    add_backend(db, "aws-a")
    sql(db, "DELETE FROM backends WHERE id = 'aws-a'")
    [[cov]] = sql(db, "SELECT id FROM retired_coverages")
    with pytest.raises(pg8000.exceptions.DatabaseError, match="is the id of a retired coverage"):
        add_backend(db, cov)
    add_backend(db, "aws-b")
    with pytest.raises(pg8000.exceptions.DatabaseError, match="is the id of a retired coverage"):
        sql(db, "UPDATE backends SET id = :c WHERE id = 'aws-b'", c=cov)
    # and a coverage's id is none a backend holds: plain SQL wrote one with a '~'
    [[n]] = sql(db, "SELECT last_value FROM retired_coverages_seq")
    add_backend(db, f"aws-b~{n + 1}")
    sql(db, "DELETE FROM backends WHERE id = 'aws-b'")
    assert sql(db, "SELECT id FROM retired_coverages WHERE backend_id = 'aws-b'") == [[f"aws-b~{n + 2}"]]


def test_an_operator_keeps_what_a_coverage_found_and_its_end_wakes_the_coverage(db):
    # Given: a removed backend's coverage that recorded a ref
    add_backend(db, "aws-a", mode="delete")
    sql(db, "DELETE FROM backends WHERE id = 'aws-a'")
    [[cov]] = sql(db, "SELECT id FROM retired_coverages")
    ref, _ = add_instance(db, backend_id="aws-a", primary_id="i-x", region="us-east-1", issued_at=T0,
                          created_at=T0, provisioned_at=T0)
    sql(db, "INSERT INTO cycles (id, backend_id, fence, mode, deadline) VALUES ('c1', :c, 1, 'delete', now())", c=cov)
    sql(db, "INSERT INTO cycle_groups (cycle_id, group_key, provider_ref, region, resources, verdict, reason)"
            " VALUES ('c1', 'k', :r, 'us-east-1', '[]', 'orphan', 'owner_terminated')", r=ref)
    store = LedgerStore(db)
    since = db_now(db)

    # When: the operator keeps it under the coverage's id
    store.keep_ref(cov, ref, "post-mortem", 1)

    # Then: the keep holds (the deleter's re-check reads it), and its end is the coverage's activity
    [[scope]] = sql(db, "SELECT scope FROM orphan_keeps WHERE backend_id = :c", c=cov)
    assert scope == "aws:123456789012"
    with store.session() as s:
        [[woken]] = s.conn.run("SELECT " + queries.ACTIVITY_EXISTS.format(since=":t", backend=":b"), b=cov,
                               t=since)
    assert woken
    store.release_ref(cov, ref)


def test_a_backend_that_lists_its_coverage_again_takes_it_over(db):
    # a region dropped then added back, and a row deleted and inserted again (an upsert)
    add_backend(db, "aws-a", regions=("eu-west-1", "us-east-1"), mode="delete")
    sql(db, "UPDATE backends SET regions = '{us-east-1}' WHERE id = 'aws-a'")
    assert coverages(db) == [("aws-a", "123456789012", ["eu-west-1"], "delete", "moved")]
    sql(db, "UPDATE backends SET regions = '{us-east-1,eu-west-1}' WHERE id = 'aws-a'")
    assert coverages(db) == []
    with db.transaction() as conn:
        conn.run("DELETE FROM backends WHERE id = 'aws-a'")
        conn.run("INSERT INTO backends (id, provider, account, regions, mode)"
                 " VALUES ('aws-a', 'aws', '123456789012', '{us-east-1}', 'off')")
    assert coverages(db) == [("aws-a", "123456789012", ["eu-west-1"], "delete", "removed")]
    [[mode]] = sql(db, "SELECT mode FROM coverages() WHERE retired_from = 'aws-a'")
    assert mode == "off"  # and the row now says off: so does what is left of its coverage
    kinds = [r[0] for r in sql(db, "SELECT kind FROM events WHERE kind LIKE 'coverage_%' ORDER BY id")]
    assert kinds == ["coverage_retained", "coverage_retired", "coverage_retained"]
    # another backend of the account listing those regions takes nothing over
    add_backend(db, "aws-b", regions=("eu-west-1",))
    assert coverages(db) == [("aws-a", "123456789012", ["eu-west-1"], "delete", "removed")]


def test_an_enrolled_backend_cannot_change_its_id(db):
    add_backend(db, "aws-a")
    sql(db, "UPDATE backends SET id = 'aws-z' WHERE id = 'aws-a'")  # not enrolled: as before
    sql(db, "INSERT INTO cleanup (backend_id) VALUES ('aws-z')")
    with pytest.raises(pg8000.exceptions.DatabaseError, match="cannot change its id"):
        sql(db, "UPDATE backends SET id = 'aws-y' WHERE id = 'aws-z'")


def test_a_coverage_inherits_its_regions_baselines(db):
    add_backend(db, "aws-a", regions=("eu-west-1", "us-east-1"))
    sql(db, "INSERT INTO region_listings (backend_id, region, clean_groups, clean_at) VALUES"
            " ('aws-a', 'eu-west-1', 26, now()), ('aws-a', 'us-east-1', 3, now())")
    sql(db, "UPDATE backends SET regions = '{us-east-1}' WHERE id = 'aws-a'")
    [[cov]] = sql(db, "SELECT id FROM retired_coverages")
    assert sql(db, "SELECT region, clean_groups FROM region_listings WHERE backend_id = :c", c=cov) == \
        [["eu-west-1", 26]]


def test_a_removed_backends_last_mode_keeps_lowering_its_earlier_coverages(db):
    add_backend(db, "aws-a", mode="delete")
    sql(db, "UPDATE backends SET account = '210987654321' WHERE id = 'aws-a'")  # aws-a~n: delete
    sql(db, "UPDATE backends SET mode = 'off' WHERE id = 'aws-a'")
    sql(db, "DELETE FROM backends WHERE id = 'aws-a'")
    assert [r[0] for r in sql(db, "SELECT mode FROM coverages() ORDER BY id")] == ["off", "off"]
