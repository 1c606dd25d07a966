"""SAFETY.md rules 10-13 through the real pipeline and a real ledger: ownership
by account (the STEP 3 join computes each owner's account the way ``Backend.scope``
does), identity before action, messages as hints, ``off`` as final, and every
compared timestamp from the database clock. The provider is the in-memory cloud
behind the real port (``tests/support/memory_cloud.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orphan_cleanup.core.errors import MessageRefused
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.results import ListerResult
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import BackendOff, run_cycle
from orphan_cleanup.ledger.records import CycleReport
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, cycle_row, db_now, group, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

ACCOUNT, OTHER = "123456789012", "210987654321"
OLD = timedelta(days=1)


@pytest.fixture
def db(emptied_db):
    return emptied_db


def pipeline(db, cloud: MemoryCloud, **settings) -> Pipeline:
    return Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0,
                                       ORPHAN_CLEANUP_MAX_MODE="delete", **settings), db=db,
                    provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def vm(db, cloud: MemoryCloud, ref: str, *, backend_id: str | None, status: str = "busy",
        primary: str | None = None, region: str = "us-east-1") -> str:
    t = db_now(db) - OLD
    vm_id = cloud.create(ResourceKind.INSTANCE, region, {"provider_ref": ref}, created_at=t)
    add_instance(db, ref=ref, status=status, backend_id=backend_id, primary_id=primary or vm_id, region=region,
                 issued_at=t, created_at=t, provisioned_at=t,
                 terminated_at=t if status == OwnerStatus.TERMINATED.value else None)
    return vm_id


# ---- rule 10: the join knows each owner's account ------------------------------------------------

@pytest.mark.parametrize("provider, account, settings", [
    ("aws", ACCOUNT, {}),
    ("gcp", "my-project", {}),
    ("gcp", "display-name", {"project": "real-project-id"}),
    ("gcp", "my-project", {"project": ""}),
])
def test_the_join_computes_an_owners_account_as_backend_scope_does(db, provider, account, settings):
    add_backend(db, "owner-backend", provider=provider, account=account, settings=settings,
                regions=("us-central1",) if provider == "gcp" else ("us-east-1",))
    add_backend(db, "lister", account=ACCOUNT)
    ref, _ = add_instance(db, backend_id="owner-backend", primary_id="i-1")
    with LedgerStore(db).session() as session:
        record = session.load_records("lister", [group(ref, "i-1")])[ref]
        expected = session.backend("owner-backend").scope
    assert record.owner_backend_scope == expected


def test_an_owner_naming_no_backend_row_has_no_scope(db):
    add_backend(db, "lister", account=ACCOUNT)
    ref, _ = add_instance(db, backend_id="aws", primary_id="i-1")  # a platform writing 'aws'
    with LedgerStore(db).session() as session:
        assert session.load_records("lister", [group(ref, "i-1")])[ref].owner_backend_scope is None


# ---- rule 10 through a delete cycle --------------------------------------------------------------

def groups_by_vm(report: CycleReport) -> dict[str, dict]:
    return {g["primary_id"]: g for g in report.c3()["groups"]}


def test_a_delete_cycle_keeps_every_vm_tracked_by_any_backend_of_its_account(db):
    # given two platform projects on one account, and one failover to another account
    cloud = MemoryCloud()
    for backend_id, account in (("aws-a", ACCOUNT), ("aws-b", ACCOUNT), ("aws-dr", OTHER)):
        add_backend(db, backend_id, account=account, mode="delete")
    a_live = vm(db, cloud, make_ref(), backend_id="aws-a")
    b_live = vm(db, cloud, make_ref(), backend_id="aws-b")
    b_leak_ref = make_ref()
    b_leak = cloud.create(ResourceKind.INSTANCE, "us-east-1", {"provider_ref": b_leak_ref},
                          created_at=db_now(db) - 2 * OLD)
    # the owner recorded the retry's VM, listed beside the leak (SAFETY.md rule 17)
    b_retry = vm(db, cloud, b_leak_ref, backend_id="aws-b")
    moved_ref = make_ref()
    left_behind = cloud.create(ResourceKind.INSTANCE, "us-east-1", {"provider_ref": moved_ref},
                               created_at=db_now(db) - 2 * OLD)
    t = db_now(db) - OLD
    add_instance(db, ref=moved_ref, status="busy", backend_id="aws-dr", primary_id="i-in-the-dr-account",
                 issued_at=t, created_at=t, provisioned_at=t)
    unknown = vm(db, cloud, make_ref(), backend_id="aws")  # no backend row is called 'aws'

    # when backend aws-a runs a delete cycle over the shared account
    report = run_cycle(pipeline(db, cloud), "aws-a")

    # then nothing another backend of the account tracks is touched
    got = groups_by_vm(report)
    assert (got[a_live]["verdict"], got[b_live]["verdict"], got[b_retry]["verdict"]) == ("tracked",) * 3
    assert cloud.exists(a_live) and cloud.exists(b_live) and cloud.exists(b_retry)
    assert (got[b_leak]["verdict"], got[b_leak]["reason"], got[b_leak]["action"]) == (
        "orphan", "primary_mismatch", "deleted")
    assert (got[left_behind]["reason"], got[left_behind]["action"]) == ("backend_mismatch", "deleted")
    assert (got[unknown]["verdict"], got[unknown]["reason"]) == ("skipped", "unknown_owner_backend")
    assert cloud.exists(unknown) and not cloud.exists(b_leak) and not cloud.exists(left_behind)
    assert report.outcome == "unsettled"  # the unknown backend's owner keeps the cycle unsettled


def classified(db, cloud: MemoryCloud, backend_id: str) -> tuple[Pipeline, list[DeleteRequest]]:
    """A manual cycle listed and classified, its delete requests not handled yet."""
    p = pipeline(db, cloud)
    p.run_lister(backend_id, manual=True)
    while (body := p.listing_queue.pop()) is not None:
        p.handle_batch(ListingBatch.model_validate_json(body))
    return p, [DeleteRequest.model_validate_json(b) for b in p.delete_queue.items]


# ---- rule 11: identity before action --------------------------------------------------------------

def test_credentials_of_another_account_fail_the_cycle_and_touch_nothing(db):
    cloud = MemoryCloud(account=OTHER)  # the credentials reach another account
    add_backend(db, "aws-a", account=ACCOUNT, mode="delete")
    orphan = vm(db, cloud, make_ref(), backend_id="aws-a", status="terminated")

    report = run_cycle(pipeline(db, cloud), "aws-a")

    assert report.outcome == "failed"
    assert report.c3()["failures"] == [{"region": "*", "error":
                                   f"account_mismatch: credentials reach {OTHER}, backend aws-a says {ACCOUNT}"}]
    assert report.c3()["groups"] == [] and cloud.calls["list"] == 0 and cloud.exists(orphan)


def test_the_deleter_checks_identity_before_deleting(db):
    cloud = MemoryCloud()
    add_backend(db, "aws-a", account=ACCOUNT, mode="delete")
    orphan = vm(db, cloud, make_ref(), backend_id="aws-a", status="terminated")
    p, [request] = classified(db, cloud, "aws-a")
    cloud.account = OTHER  # the role now reaches another account

    assert p.handle_delete(request) == "identity_failed"
    assert cloud.exists(orphan) and cloud.calls["terminate"] == 0
    assert LedgerStore(db).cycle_report(request.cycle_id).outcome == "failed"


# ---- rule 12: messages are hints ----------------------------------------------------------------

def listed(db, cloud, backend_id: str, mode: str) -> tuple[Pipeline, list[str]]:
    p = pipeline(db, cloud)
    p.run_lister(backend_id, mode=mode, manual=True)
    return p, list(p.listing_queue.items)


@pytest.mark.parametrize("field, value", [("mode", "delete"), ("backend", "aws-b"),
                                          ("listed_at", "2020-01-01T00:00:00+00:00"), ("record_all", False)])
def test_a_batch_that_disagrees_with_its_cycle_is_refused_and_applies_nothing(db, field, value):
    cloud = MemoryCloud()
    add_backend(db, "aws-a", account=ACCOUNT)
    add_backend(db, "aws-b", account=ACCOUNT)
    orphan = vm(db, cloud, make_ref(), backend_id="aws-a", status="terminated")
    p, [body] = listed(db, cloud, "aws-a", "report")
    forged = ListingBatch.model_validate({**ListingBatch.model_validate_json(body).model_dump(), field: value})

    with pytest.raises(MessageRefused, match=field):
        p.handle_batch(forged)

    cycle = cycle_row(db, forged.cycle_id)
    assert cycle["applied_batches"] == 0 and cycle["outcome"] is None
    assert p.handle_batch(ListingBatch.model_validate_json(body)).status == "applied"  # the real one flows
    assert LedgerStore(db).cycle_report(forged.cycle_id).outcome == "clean"
    assert len(p.delete_queue) == 0 and cloud.exists(orphan)  # a report cycle, whatever the forgery said


def test_a_delete_request_acts_on_the_recorded_group_of_the_cycles_backend(db):
    cloud = MemoryCloud()
    add_backend(db, "aws-a", account=ACCOUNT, mode="delete")
    add_backend(db, "aws-b", account=ACCOUNT, settings={"protect_tag_key": "other-protect"})
    orphan = vm(db, cloud, make_ref(), backend_id="aws-a", status="terminated")
    tracked = vm(db, cloud, make_ref(), backend_id="aws-a")
    p, [request] = classified(db, cloud, "aws-a")
    tracked_vm = next(r for r in cloud.resources.values() if r.id == tracked)
    extra = group(tracked_vm.tags["provider_ref"], tracked).resources[0]

    with pytest.raises(MessageRefused, match="backend"):
        p.handle_delete(request.model_copy(update={"backend": "aws-b"}))
    with_extra = request.group.model_copy(update={"resources": request.group.resources + (extra,)})
    assert p.handle_delete(request.model_copy(update={"group": with_extra})) == "group_mismatch"
    assert cloud.exists(orphan) and cloud.exists(tracked)

    assert p.handle_delete(request) == "deleted"
    assert not cloud.exists(orphan) and cloud.exists(tracked)


# ---- off is final ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend_mode, global_mode", [("off", "report"), (None, "off")])
def test_no_override_runs_an_off_backend(db, backend_mode, global_mode):
    cloud = MemoryCloud()
    add_backend(db, "aws-a", account=ACCOUNT, mode=backend_mode)
    orphan = vm(db, cloud, make_ref(), backend_id="aws-a", status="terminated")
    p = pipeline(db, cloud, ORPHAN_CLEANUP_MODE=global_mode)

    assert p.run_lister("aws-a", mode="delete", manual=True) == ListerResult(backend="aws-a", started=False,
                                                                             reason="off")
    with pytest.raises(BackendOff, match="backend aws-a is off"):
        run_cycle(p, "aws-a", mode="delete")
    with db.connection() as conn:
        assert conn.run("SELECT count(*) FROM cycles")[0][0] == 0
    assert cloud.exists(orphan) and cloud.calls["list"] == 0


def test_a_backend_switched_off_mid_cycle_deletes_nothing(db):
    cloud = MemoryCloud()
    add_backend(db, "aws-a", account=ACCOUNT, mode="delete")
    orphan = vm(db, cloud, make_ref(), backend_id="aws-a", status="terminated")
    p, [request] = classified(db, cloud, "aws-a")
    with db.connection() as conn:
        conn.run("UPDATE backends SET mode = 'off' WHERE id = 'aws-a'")

    assert p.handle_delete(request) == "backend_off"
    assert cloud.exists(orphan)
    assert LedgerStore(db).cycle_report(request.cycle_id).outcome == "unsettled"


# ---- rule 13: the database's clock ----------------------------------------------------------------

def test_listing_time_and_clean_at_come_from_the_database_clock(db):
    cloud = MemoryCloud()
    add_backend(db, "aws-a", account=ACCOUNT)
    vm(db, cloud, make_ref(), backend_id="aws-a")
    before = db_now(db)
    report = run_cycle(Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=300,
                                       ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                                provider_for=lambda b: MemoryProvider(b, cloud), listing_queue=InProcessQueue(),
                                delete_queue=InProcessQueue()), "aws-a")
    after = db_now(db)
    cycle = cycle_row(db, report.cycle_id)
    assert before <= cycle["listed_at"] <= after and before <= cycle["started_at"] <= cycle["listed_at"]
    with db.connection() as conn:
        clean_at, next_due = conn.run("SELECT clean_at, next_due_at FROM cleanup WHERE backend_id = 'aws-a'")[0]
    assert clean_at == cycle["listed_at"] - timedelta(seconds=300)
    assert before + timedelta(seconds=900) <= next_due <= after + timedelta(seconds=900)


# ---- rule 17: a live owner's other VM is deleted only beside its recorded primary ------------------

def test_a_listing_that_only_claims_the_recorded_primary_deletes_nothing(db):
    # given a busy owner whose primary_id names no VM (a mangled id), and its only VM
    add_backend(db, "aws-a", account=ACCOUNT, mode="delete")
    cloud = MemoryCloud()
    ref = make_ref()
    only_vm = vm(db, cloud, ref, backend_id="aws-a", primary="i-0000000000000000")

    class ClaimingProvider(MemoryProvider):
        """Lists the cloud, plus a group claiming that the recorded primary exists: what a
        forged listing batch (anyone who may write to the listing queue) would carry."""

        def iter_listing(self):  # type: ignore[no-untyped-def]
            for listing in super().iter_listing():
                claimed = group(ref, "i-0000000000000000", created_at=db_now(db) - 2 * OLD)
                yield listing.model_copy(update={"groups": (*listing.groups, claimed)})

    p = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0,
                                       ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                 provider_for=lambda b: ClaimingProvider(b, cloud),
                 listing_queue=InProcessQueue(), delete_queue=InProcessQueue())

    # when a delete cycle classifies the VM beside the claimed primary (a retry leak, for the batch)
    report = run_cycle(p, "aws-a")

    # then the deleter asks the provider, which does not confirm the primary: nothing is deleted
    got = groups_by_vm(report)
    assert (got[only_vm]["verdict"], got[only_vm]["reason"]) == ("orphan", "primary_mismatch")
    assert got[only_vm]["action"] == "reported"
    assert cloud.exists(only_vm) and cloud.calls["terminate"] == 0
    with db.connection() as conn:
        [[skipped]] = conn.run("SELECT result->>'skipped' FROM delete_requests WHERE cycle_id = :c"
                               " AND group_key LIKE :k", c=report.cycle_id, k=f"{ref}/%/{only_vm}")
    assert skipped == "owner_changed:primary_not_listed"
