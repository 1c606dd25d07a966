"""The tick (README, Deploy): one schedule for any number of backends. It selects the due
backends in one statement, queues one listing job per group of backends that share a
listing, and a job lists once for all of them while each backend keeps its own cycle,
lease, mode and outcome. Real pipeline, real Postgres, the in-memory cloud behind the
real provider port."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.messages import ListingBatch, ListingJob
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, cleanup_row, cycle_row, db_now, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

ACCOUNT, OTHER = "123456789012", "210987654321"
OLD = timedelta(days=1)


class World:
    """One memory cloud per account; the pipeline with real queues in process."""

    def __init__(self, db: Database, **settings: str) -> None:
        self.db = db
        self.clouds: dict[str, MemoryCloud] = {}
        self.built: list[Backend] = []
        self.jobs = InProcessQueue()
        self.listing = InProcessQueue()
        self.pipeline = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0,
                                       ORPHAN_CLEANUP_MAX_MODE="delete", **settings), db=db,
                                 provider_for=self.provider, listing_queue=self.listing,
                                 delete_queue=InProcessQueue(), jobs_queue=self.jobs)

    def cloud(self, account: str) -> MemoryCloud:
        return self.clouds.setdefault(account, MemoryCloud())

    def provider(self, backend: Backend) -> MemoryProvider:
        self.built.append(backend)
        return MemoryProvider(backend, self.cloud(backend.account))

    def tracked_vm(self, backend_id: str, account: str = ACCOUNT, region: str = "us-east-1") -> str:
        t = db_now(self.db) - OLD
        ref = make_ref()
        vm = self.cloud(account).create(ResourceKind.INSTANCE, region, {"provider_ref": ref}, created_at=t)
        add_instance(self.db, ref=ref, status="busy", backend_id=backend_id, primary_id=vm, region=region,
                     issued_at=t, created_at=t, provisioned_at=t)
        return vm

    def tick(self) -> tuple[dict, list[ListingJob]]:
        result = self.pipeline.run_tick().model_dump()
        jobs = []
        while (body := self.jobs.pop()) is not None:
            jobs.append(ListingJob.model_validate_json(body))
        return result, jobs

    def classify_all(self) -> Counter[str]:
        """Deliver every listing batch; count the batches per backend."""
        per_backend: Counter[str] = Counter()
        while (body := self.listing.pop()) is not None:
            batch = ListingBatch.model_validate_json(body)
            per_backend[batch.backend] += 1
            self.pipeline.handle_batch(batch)
        return per_backend


@pytest.fixture
def world(emptied_db: Database) -> World:
    return World(emptied_db)


def test_backends_sharing_an_account_are_listed_once_and_each_keeps_its_own_cycle(world):
    # given three backends of one account and regions (dstack Sky: one per project),
    # one of another account, and owners in each
    for b in ("proj-a", "proj-b", "proj-c"):
        add_backend(world.db, b, account=ACCOUNT, regions=("us-east-1", "us-west-2"))
    add_backend(world.db, "other", account=OTHER)
    vms = {b: world.tracked_vm(b) for b in ("proj-a", "proj-b", "proj-c")}
    world.tracked_vm("other", account=OTHER)

    # when the schedule ticks and each job runs
    tick, jobs = world.tick()
    assert sorted(map(sorted, tick["jobs"])) == [["other"], ["proj-a", "proj-b", "proj-c"]]
    assert tick["due"] == {b: "never_cleaned" for b in ("other", "proj-a", "proj-b", "proj-c")}
    results = [world.pipeline.run_job(job).model_dump() for job in jobs]
    per_backend = world.classify_all()

    # then the shared account was listed once (two regions: two list calls, not six)
    assert world.cloud(ACCOUNT).calls["list"] == 2
    assert world.cloud(ACCOUNT).calls["identity"] == 1
    assert world.cloud(OTHER).calls["list"] == 1
    assert sorted(r["listings"] for r in results) == [1, 1]
    # and every backend has its own cycle, finished clean, with its own clean_at
    started = {r["backend"]: r for job in results for r in job["results"]}
    assert set(started) == {"proj-a", "proj-b", "proj-c", "other"}
    assert len({r["cycle_id"] for r in started.values()}) == 4
    assert per_backend == {"proj-a": 1, "proj-b": 1, "proj-c": 1, "other": 1}
    for b, r in started.items():
        assert r["started"] and r["reason"] == "never_cleaned"
        assert cycle_row(world.db, r["cycle_id"])["outcome"] == "clean", b
        assert cleanup_row(world.db, b)["clean_at"] is not None
    # each backend's cycle classified every VM of the account (all tracked: same-account owners)
    for b in ("proj-a", "proj-b", "proj-c"):
        assert cycle_row(world.db, started[b]["cycle_id"])["groups_listed"] == len(vms)


def test_the_tick_leaves_alone_what_is_off_not_enrolled_idle_busy_or_not_due(world):
    add_backend(world.db, "idle")
    add_backend(world.db, "switched-off", mode="off")
    world.tracked_vm("idle")
    tick, jobs = world.tick()
    assert tick["skipped"] == {"switched-off": "off"}
    for job in jobs:
        world.pipeline.run_job(job)
    world.classify_all()

    # a second tick right away: the clean backend is not due yet
    tick, jobs = world.tick()
    assert (tick["jobs"], tick["skipped"]) == ([], {"idle": "not_due", "switched-off": "off"})

    # once due with no ledger activity it is idle: marked processed, no job
    with world.db.connection() as conn:
        conn.run("UPDATE cleanup SET next_due_at = now() - interval '1 hour' WHERE backend_id = 'idle'")
    before = cleanup_row(world.db, "idle")["last_processed_at"]
    tick, jobs = world.tick()
    assert (tick["jobs"], tick["skipped"]["idle"]) == ([], "no_activity")
    after = cleanup_row(world.db, "idle")
    assert after["last_processed_at"] > before
    assert after["next_due_at"] > db_now(world.db)

    # a live lease: busy; an expired lease: due (the job's start fails the stale cycle first)
    with world.db.connection() as conn:
        conn.run("UPDATE cleanup SET lease_owner = 'x', lease_expires_at = now() + interval '1 hour',"
                 " next_due_at = now() - interval '1 hour' WHERE backend_id = 'idle'")
    assert world.tick()[0]["skipped"]["idle"] == "busy"
    with world.db.connection() as conn:
        conn.run("UPDATE cleanup SET lease_expires_at = now() - interval '1 second' WHERE backend_id = 'idle'")
    tick, jobs = world.tick()
    assert tick["due"] == {"idle": "lease_expired"}


def test_a_backend_with_no_ref_issued_yet_is_not_enrolled_by_the_tick(world):
    add_backend(world.db, "fresh")
    tick, jobs = world.tick()
    assert (tick["jobs"], tick["skipped"]) == ([], {"fresh": "not_enrolled"})
    with world.db.connection() as conn:
        assert conn.run("SELECT count(*) FROM cleanup")[0][0] == 0


def test_a_backend_row_added_by_the_platform_is_picked_up_by_the_next_tick(world):
    add_backend(world.db, "first")
    world.tracked_vm("first")
    for job in world.tick()[1]:
        world.pipeline.run_job(job)
    world.classify_all()
    # the platform inserts a backend row with plain SQL; nothing is redeployed
    add_backend(world.db, "added-later", account=OTHER)
    tick, jobs = world.tick()
    assert tick["jobs"] == [["added-later"]] and tick["due"] == {"added-later": "never_cleaned"}
    [result] = world.pipeline.run_job(jobs[0]).results
    assert result.started and result.backend == "added-later"


def test_a_job_is_a_hint_it_regroups_by_the_rows_and_reapplies_step1(world):
    # given backends of two accounts, and one already clean and not due
    add_backend(world.db, "acct-1", account=ACCOUNT)
    add_backend(world.db, "acct-2", account=OTHER)
    add_backend(world.db, "clean")
    world.tracked_vm("acct-1")
    world.tracked_vm("acct-2", account=OTHER)
    world.pipeline.run_job(ListingJob(backends=("clean",)))
    world.classify_all()
    world.built.clear()

    # when a (forged or stale) job names them together, with a backend that does not exist
    result = world.pipeline.run_job(ListingJob(backends=("acct-1", "acct-2", "clean", "gone"))).model_dump()

    # then the two accounts are listed separately, each with its own credentials,
    # the clean backend is not listed (STEP 1 again) and the unknown one is reported
    by_backend = {r["backend"]: r for r in result["results"]}
    assert result["listings"] == 2
    assert sorted(b.account for b in world.built) == [ACCOUNT, OTHER]
    assert by_backend["clean"] == {"backend": "clean", "started": False, "reason": "not_due"}
    assert by_backend["gone"] == {"backend": "gone", "started": False, "reason": "unknown_backend",
                                  "error": "unknown backend 'gone' (see `orphan-cleanup backend list`)"}
    with world.db.connection() as conn:  # and nothing is made for it
        assert conn.run("SELECT count(*) FROM cleanup WHERE backend_id = 'gone'") == [[0]]
    assert by_backend["acct-1"]["started"] and by_backend["acct-2"]["started"]


def test_listing_settings_that_differ_keep_listings_apart(world):
    # same account and regions, but another tag key or role: another listing
    add_backend(world.db, "plain")
    add_backend(world.db, "own-tag", settings={"tag_key": "other_ref"})
    add_backend(world.db, "own-role", settings={"role_arn": "arn:aws:iam::123456789012:role/x"})
    add_backend(world.db, "same-but-limits", settings={"max_deletes": 3, "dstack_project": "p"})
    add_backend(world.db, "regions-in-another-order", regions=("us-east-1", "us-east-1"))
    world.tracked_vm("plain")
    tick, _ = world.tick()
    assert sorted(map(sorted, tick["jobs"])) == [["own-role"], ["own-tag"],
                                                 ["plain", "regions-in-another-order", "same-but-limits"]]


def test_each_cycle_of_a_shared_listing_keeps_its_own_mode_and_outcome(world):
    # given two backends of one account, one in delete mode with an orphan to delete
    add_backend(world.db, "reporter", mode="report")
    add_backend(world.db, "deleter", mode="delete")
    world.tracked_vm("reporter")
    t = db_now(world.db) - OLD
    ref = make_ref()
    leak = world.cloud(ACCOUNT).create(ResourceKind.INSTANCE, "us-east-1", {"provider_ref": ref}, created_at=t)
    add_instance(world.db, ref=ref, status="terminated", backend_id="deleter", primary_id=leak, issued_at=t,
                 created_at=t, provisioned_at=t, terminated_at=t)

    [job] = world.tick()[1]
    results = {r.backend: r for r in world.pipeline.run_job(job).results}
    world.classify_all()

    assert world.cloud(ACCOUNT).calls["list"] == 1
    assert (results["reporter"].mode, results["deleter"].mode) == ("report", "delete")
    assert cycle_row(world.db, results["reporter"].cycle_id)["outcome"] == "clean"
    # the delete cycle dispatched its orphan; the report cycle only reported it
    assert len(world.pipeline.delete_queue) == 1
    assert cycle_row(world.db, results["deleter"].cycle_id)["outcome"] is None


def test_an_identity_failure_fails_every_cycle_of_the_shared_listing(world):
    add_backend(world.db, "a")
    add_backend(world.db, "b")
    world.tracked_vm("a")
    world.cloud(ACCOUNT).account = OTHER  # the credentials reach another account
    [job] = world.tick()[1]
    results = world.pipeline.run_job(job).results
    assert [r.reason for r in results] == ["identity_failed", "identity_failed"]
    assert world.cloud(ACCOUNT).calls["list"] == 0
    for r in results:
        row = cycle_row(world.db, r.cycle_id)
        assert row["outcome"] == "failed"
    assert len(world.listing) == 0


def test_the_tick_is_one_statement_for_any_number_of_backends(world):
    for i in range(30):
        add_backend(world.db, f"b{i:02}", account=str(100000000000 + i % 3))
    world.tracked_vm("b00")
    traced: list[str] = []
    real_connect = world.db.connect

    def connect():
        conn = real_connect()
        run = conn.run

        def counted(sql, **kw):
            traced.append(sql)
            return run(sql, **kw)
        conn.run = counted
        return conn
    world.db.connect = connect
    try:
        tick, _ = world.tick()
    finally:
        world.db.connect = real_connect
    assert len(tick["jobs"]) == 3  # three accounts
    assert len(traced) == 1, traced
