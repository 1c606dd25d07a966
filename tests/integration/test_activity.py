"""STEP 1's activity query (SAFETY.md rule 9): every ledger change that may
concern a backend is visible after T, and nothing else is.

The query is scoped by time, so the tests of this module share one migrated
database: each builds its own backends and owners and takes its own T.
"""

from __future__ import annotations

import uuid

import pytest

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.queries import activity_since
from tests.support.ledger_helpers import T0, add_backend, add_instance, add_ref, add_volume, db_now

OTHER_ACCOUNT = "111111111111"  # A's; B has add_backend's default account


@pytest.fixture
def L(module_db):
    """Backends A and B on two accounts; an instance on each; a pending owner with no
    backend yet; a ref issued for an instance row not written yet. Then T, the moment after."""
    db, n = module_db, uuid.uuid4().hex[:8]
    ids = dict(a=f"A-{n}", b=f"B-{n}", on_a=f"on-a-{n}", on_b=f"on-b-{n}", pending=f"pending-{n}",
               late=f"late-{n}", cycle=f"cycle-{n}")
    add_backend(db, ids["a"], account=OTHER_ACCOUNT)
    add_backend(db, ids["b"])
    add_instance(db, instance_id=ids["on_a"], backend_id=ids["a"], primary_id="i-a", region="us-east-1",
                 created_at=T0, provisioned_at=T0)
    add_instance(db, instance_id=ids["on_b"], backend_id=ids["b"], primary_id="i-b", region="us-east-1",
                 created_at=T0, provisioned_at=T0)
    # volume owners (C1): one on each backend, a ref issued for a volume row not written yet
    ids.update(vol_a=f"vol-a-{n}", vol_b=f"vol-b-{n}", late_volume=f"late-volume-{n}")
    add_volume(db, volume_id=ids["vol_a"], backend_id=ids["a"], primary_id="vol-a", region="us-east-1",
               created_at=T0, provisioned_at=T0)
    add_volume(db, volume_id=ids["vol_b"], backend_id=ids["b"], primary_id="vol-b", region="us-east-1",
               created_at=T0, provisioned_at=T0)
    client = LedgerClient(db)
    client.issue_ref(owner_id=ids["pending"])
    spare_ref = add_ref(db, owner_id=ids["late"])
    spare_volume_ref = add_ref(db, owner_id=ids["late_volume"], owner_type="volume")
    t = db_now(db)
    # a test whose "nothing happened" baseline is already true proves nothing
    assert not active(db, ids["a"], t) and not active(db, ids["b"], t)
    return dict(db=db, client=client, t=t, spare_ref=spare_ref, spare_volume_ref=spare_volume_ref, **ids)


def active(db, backend_id, t) -> bool:
    with db.connection() as conn:
        return activity_since(conn, backend_id, t)


def sql(L, statement, **params):
    with L["db"].connection() as conn:
        conn.run(statement, **params)


COUNTS_FOR_B = {
    "new ref (issue_ref)": lambda L: L["client"].issue_ref(),
    "new ref without an owner row (plain SQL)": lambda L: add_ref(L["db"]),
    "ref row updated": lambda L: sql(L, "UPDATE provider_refs SET owner_name = 'x' WHERE owner_id = :i", i=L["on_a"]),
    "instance insert on B (ref issued earlier)": lambda L: sql(
        L, "INSERT INTO instances (id, provider_ref, status, backend_id) VALUES (:i, :r, 'idle', :b)",
        i=L["late"], r=L["spare_ref"], b=L["b"]),
    "instance insert without a backend (ref issued earlier)": lambda L: sql(
        L, "INSERT INTO instances (id, provider_ref) VALUES (:i, :r)", i=L["late"], r=L["spare_ref"]),
    "status update via the client": lambda L: L["client"].set_status(L["on_b"], OwnerStatus.BUSY),
    "status update via plain SQL": lambda L: sql(L, "UPDATE instances SET status = 'busy' WHERE id = :i",
                                                 i=L["on_b"]),
    "terminated": lambda L: L["client"].mark_terminated(L["on_b"]),
    "provisioning update onto B": lambda L: L["client"].mark_provisioning(
        L["pending"], backend_id=L["b"], primary_id="i-new", region="us-east-1"),
    "update of an owner with no backend yet": lambda L: sql(
        L, "UPDATE instances SET name = 'n' WHERE id = :i", i=L["pending"]),
    "soft delete": lambda L: L["client"].soft_delete(L["on_b"]),
    "hard delete via the client": lambda L: L["client"].hard_delete(L["on_b"]),
    "hard delete via plain SQL": lambda L: sql(L, "DELETE FROM instances WHERE id = :i", i=L["on_b"]),
    "hard delete of a placeholder with no backend": lambda L: L["client"].hard_delete(L["pending"]),
    "instance moved from A to B": lambda L: sql(L, "UPDATE instances SET backend_id = :b WHERE id = :i",
                                                b=L["b"], i=L["on_a"]),
    "instance moved from B to A": lambda L: sql(L, "UPDATE instances SET backend_id = :a WHERE id = :i",
                                                a=L["a"], i=L["on_b"]),
    "instances truncated": lambda L: sql(L, "TRUNCATE instances"),
    # volume owners (C1, SAFETY.md rule 9): the volumes table's triggers
    "volume insert on B (ref issued earlier)": lambda L: sql(
        L, "INSERT INTO volumes (id, provider_ref, status, backend_id) VALUES (:i, :r, 'active', :b)",
        i=L["late_volume"], r=L["spare_volume_ref"], b=L["b"]),
    "volume insert without a backend (ref issued earlier)": lambda L: sql(
        L, "INSERT INTO volumes (id, provider_ref) VALUES (:i, :r)", i=L["late_volume"], r=L["spare_volume_ref"]),
    "volume status update via plain SQL": lambda L: sql(L, "UPDATE volumes SET status = 'deleting' WHERE id = :i",
                                                        i=L["vol_b"]),
    "volume deleted (status and deleted_at)": lambda L: sql(
        L, "UPDATE volumes SET status = 'deleted', deleted_at = now() WHERE id = :i", i=L["vol_b"]),
    "volume hard delete via plain SQL": lambda L: sql(L, "DELETE FROM volumes WHERE id = :i", i=L["vol_b"]),
    "volume moved from A to B": lambda L: sql(L, "UPDATE volumes SET backend_id = :b WHERE id = :i",
                                              b=L["b"], i=L["vol_a"]),
    "volume moved from B to A": lambda L: sql(L, "UPDATE volumes SET backend_id = :a WHERE id = :i",
                                              a=L["a"], i=L["vol_b"]),
    "volume naming no backend row updated": lambda L: sql(
        L, "UPDATE volumes SET name = 'n', backend_id = 'aws' WHERE id = :i", i=L["vol_a"]),
    "volumes truncated": lambda L: sql(L, "TRUNCATE volumes"),
}


@pytest.mark.parametrize("change", COUNTS_FOR_B.values(), ids=COUNTS_FOR_B.keys())
def test_ledger_change_is_activity_for_b(L, change):
    # when the ledger changes after T
    change(L)
    # then STEP 1 sees activity for B
    assert active(L["db"], L["b"], L["t"])


def test_activity_is_only_after_t(L):
    # given a change after T
    L["client"].set_status(L["on_b"], OwnerStatus.BUSY)
    after = db_now(L["db"])
    # then it is activity since T but not since a moment after it
    assert active(L["db"], L["b"], L["t"])
    assert not active(L["db"], L["b"], after)


ONLY_FOR_A = {
    "status update of A's instance": lambda L: L["client"].set_status(L["on_a"], OwnerStatus.BUSY),
    "A's instance terminated": lambda L: L["client"].mark_terminated(L["on_a"]),
    "A's instance soft-deleted": lambda L: L["client"].soft_delete(L["on_a"]),
    "A's instance hard-deleted": lambda L: sql(L, "DELETE FROM instances WHERE id = :i", i=L["on_a"]),
    "A's instance re-provisioned on A": lambda L: L["client"].mark_provisioning(
        L["on_a"], backend_id=L["a"], primary_id="i-a2", region="us-east-1"),
    "status update of A's volume": lambda L: sql(L, "UPDATE volumes SET status = 'deleting' WHERE id = :i",
                                                  i=L["vol_a"]),
    "A's volume hard-deleted": lambda L: sql(L, "DELETE FROM volumes WHERE id = :i", i=L["vol_a"]),
    "instance insert on A (ref issued earlier)": lambda L: sql(
        L, "INSERT INTO instances (id, provider_ref, status, backend_id) VALUES (:i, :r, 'idle', :a)",
        i=L["late"], r=L["spare_ref"], a=L["a"]),
}


@pytest.mark.parametrize("change", ONLY_FOR_A.values(), ids=ONLY_FOR_A.keys())
def test_change_to_a_is_not_activity_for_b(L, change):
    change(L)
    assert active(L["db"], L["a"], L["t"])
    assert not active(L["db"], L["b"], L["t"])


def product_writes(L):
    """The product's own bookkeeping: none of it is ledger activity."""
    b, c = L["b"], L["cycle"]
    ref = "abcdef123456"
    sql(L, "INSERT INTO cleanup (backend_id) VALUES (:b)", b=b)
    sql(L, "UPDATE cleanup SET clean_at = now(), fence = fence + 1 WHERE backend_id = :b", b=b)
    sql(L, "INSERT INTO cycles (id, backend_id, fence, mode, deadline) VALUES (:c, :b, 1, 'report', now())",
        c=c, b=b)
    sql(L, "INSERT INTO cycle_batches (cycle_id, seq) VALUES (:c, 0)", c=c)
    sql(L, "INSERT INTO cycle_groups (cycle_id, group_key, provider_ref, region, resources, verdict, reason)"
           " VALUES (:c, 'k', :r, 'us-east-1', '[]', 'orphan', 'owner_deleted')", c=c, r=ref)
    sql(L, "INSERT INTO orphans (backend_id, group_key, provider_ref, region, resources, reason)"
           " VALUES (:b, 'k', :r, 'us-east-1', '[]', 'owner_deleted')", b=b, r=ref)
    sql(L, "INSERT INTO orphan_resources (backend_id, provider_ref, resource_id) VALUES (:b, :r, 'v')", b=b, r=ref)
    sql(L, "INSERT INTO delete_requests (cycle_id, group_key) VALUES (:c, 'k')", c=c)
    sql(L, "INSERT INTO delete_gates (backend_id, provider_ref, holder, expires_at) VALUES (:b, :r, 'h', now())",
        b=b, r=ref)
    sql(L, "INSERT INTO events (backend_id, kind, message) VALUES (:b, 'orphan_reported', 'm')", b=b)
    sql(L, "UPDATE orphans SET state = 'deleted' WHERE backend_id = :b", b=b)
    sql(L, "DELETE FROM events WHERE backend_id = :b", b=b)


NOT_ACTIVITY = {
    "nothing": lambda L: None,
    "a new backend in a third account": lambda L: add_backend(L["db"], f"C-{L['b']}", account="222222222222"),
    "the product's own tables": product_writes,
}


@pytest.mark.parametrize("change", NOT_ACTIVITY.values(), ids=NOT_ACTIVITY.keys())
def test_not_ledger_activity(L, change):
    change(L)
    assert not active(L["db"], L["a"], L["t"])
    assert not active(L["db"], L["b"], L["t"])


BACKEND_EDITS = {
    "regions": "UPDATE backends SET regions = array_append(regions, 'eu-west-1') WHERE id = :b",
    "account": "UPDATE backends SET account = '210987654321' WHERE id = :b",
    "settings": "UPDATE backends SET settings = settings || '{\"tag_key\": \"ref\"}' WHERE id = :b",
    "mode": "UPDATE backends SET mode = 'delete' WHERE id = :b",
}


@pytest.mark.parametrize("statement", BACKEND_EDITS.values(), ids=BACKEND_EDITS.keys())
def test_an_edit_of_a_backend_row_is_activity_for_that_backend_only(L, statement):
    # SAFETY.md rule 9: the next scheduled run of the edited backend lists (a new region, ...)
    sql(L, statement, b=L["b"])
    assert active(L["db"], L["b"], L["t"])
    assert not active(L["db"], L["a"], L["t"])


def test_an_update_that_changes_nothing_is_not_activity(L):
    sql(L, "UPDATE backends SET mode = mode WHERE id = :b", b=L["b"])
    assert not active(L["db"], L["b"], L["t"])


def test_activity_of_another_backend_of_the_same_account_counts(L):
    # a VM of backend C's owner is listed by B too (one account): its changes are B's activity
    add_backend(L["db"], f"C-{L['b']}")  # same provider and account as B (add_backend's defaults)
    t = db_now(L["db"])
    sql(L, "INSERT INTO instances (id, provider_ref, status, backend_id) VALUES (:i, :r, 'idle', :c)",
        i=L["late"], r=L["spare_ref"], c=f"C-{L['b']}")  # the ref was issued earlier: only C's row changes
    assert active(L["db"], L["b"], t)
    assert not active(L["db"], L["a"], t)


def test_activity_of_an_owner_naming_no_backend_counts_for_every_backend(L):
    t = db_now(L["db"])
    sql(L, "INSERT INTO instances (id, provider_ref, status, backend_id) VALUES (:i, :r, 'idle', 'aws')",
        i=L["late"], r=L["spare_ref"])  # no backend row is called 'aws'
    assert active(L["db"], L["a"], t) and active(L["db"], L["b"], t)
