"""A stuck `pending` owner is visible (README, "Stale pending owners"): the platform
crashed after the create call, before recording the provisioning data, so every cycle
skips the VM (`owner_pending`) and `clean_at` never moves. `status` lists such owners
(ref, owner, age), the log line names the ref, owner and instance, and once the platform
reaps the row (`LedgerClient.reap_pending`) the next cycle deletes what was left.

Real parts: the pipeline on the in-memory cloud behind the provider port, a real
Postgres ledger, manual cycles (`run_cycle`), the CLI as a subprocess."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from orphan_cleanup.cli.logs import FieldsFormatter
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, add_volume, db_now, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

BACKEND = "aws-prod"
REGION = "us-east-1"
STUCK_KEYS = {"provider_ref", "owner_id", "owner_name", "created_at", "pending_seconds", "region", "primary_id",
              "cycle_id"}


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


def pipeline(db: Database, cloud: MemoryCloud) -> Pipeline:
    return Pipeline(settings=Settings.explicit(confirm_seconds=0, margin_seconds=0), db=db,
                    provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def pending(db: Database, cloud: MemoryCloud, *, since: datetime, vm: bool = True) -> tuple[str, str, str | None]:
    """An owner pending since ``since`` (its VM created then, unless ``vm`` is False)."""
    ref = make_ref()
    _, owner_id = add_instance(db, ref=ref, name="batch-9", status="pending", issued_at=since, created_at=since)
    iid = cloud.create(ResourceKind.INSTANCE, REGION, {"provider_ref": ref}, created_at=since) if vm else None
    return ref, owner_id, iid


def status(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORPHAN_CLEANUP_")}
    env.update(DATABASE_URL=db.info.url(), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", "status", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_status_lists_a_stuck_pending_owner_until_the_platform_reaps_it(db):
    # given a VM whose owner has been pending for two hours, one pending for a minute (a create
    # in flight), and a stale pending owner that never created anything
    add_backend(db, BACKEND)
    cloud = MemoryCloud()
    now = db_now(db)
    ref, owner_id, iid = pending(db, cloud, since=now - timedelta(hours=2))
    pending(db, cloud, since=now - timedelta(minutes=1))
    pending(db, cloud, since=now - timedelta(hours=3), vm=False)
    p = pipeline(db, cloud)
    first = run_cycle(p, BACKEND)
    assert first.outcome == "unsettled" and {g.reason for g in first.groups} == {"owner_pending"}

    # when status is asked
    doc = json.loads(status(db, "--json").stdout)
    table = status(db).stdout

    # then the stuck one is listed with its ref, owner and age, and only it
    [row] = doc
    [stuck] = row["stuck_pending"]
    assert set(stuck) == STUCK_KEYS
    assert (stuck["provider_ref"], stuck["owner_id"], stuck["owner_name"], stuck["primary_id"], stuck["region"],
            stuck["cycle_id"]) == (ref, owner_id, "batch-9", iid, REGION, first.cycle_id)
    assert 7190 <= stuck["pending_seconds"] <= 7400
    assert "stuck pending owners" in table and "Stale pending owners" in table
    [line] = [line for line in table.splitlines() if ref in line]
    assert line.split()[:5] == [BACKEND, ref, owner_id, '"batch-9"', "2h"] and iid in line

    # and once the platform reaps stale pending rows, the next cycles delete what the crash left
    ledger = LedgerClient(db)
    stale = {s.owner_id for s in ledger.stale_pending(3600)}
    assert owner_id in stale and len(stale) == 2  # the one with a VM and the one without
    assert ledger.reap_pending(owner_id) and not ledger.reap_pending(owner_id)  # only while pending
    after = run_cycle(p, BACKEND, mode="delete")  # margin 0: terminated before the listing is old enough
    assert [(g.primary_id, g.reason, g.action) for g in after.groups if g.primary_id == iid] == [
        (iid, "owner_terminated", "deleted")]
    assert not cloud.exists(iid)
    assert json.loads(status(db, "--json").stdout)[0]["stuck_pending"] == []


def test_the_log_line_of_a_stuck_pending_owner_names_its_ref_owner_and_instance(db):
    add_backend(db, BACKEND)
    cloud = MemoryCloud()
    ref, owner_id, iid = pending(db, cloud, since=db_now(db) - timedelta(hours=2))
    lines: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.setFormatter(FieldsFormatter())
    handler.emit = lambda record: lines.append(handler.format(record))  # type: ignore[method-assign]
    logger = logging.getLogger("orphan_cleanup")
    logger.addHandler(handler)
    try:
        run_cycle(pipeline(db, cloud), BACKEND)
    finally:
        logger.removeHandler(handler)

    [line] = [line for line in lines if "pending owner's resources look stuck" in line]
    assert line.startswith("ERROR pending owner's resources look stuck: ")
    for field in (f"backend={BACKEND}", f"provider_ref={ref}", f"owner_id={owner_id}", "owner_name=batch-9",
                  f"primary_id={iid}", f"region={REGION}"):
        assert field in line.split(": ", 1)[1].split(), (field, line)


def test_a_stuck_pending_volume_owner_is_listed_and_reaped_like_an_instance(db):
    # given a volume owner (README, C1) pending for two hours, whose create call made a volume
    add_backend(db, BACKEND)
    cloud = MemoryCloud()
    since = db_now(db) - timedelta(hours=2)
    ref, owner_id = add_volume(db, name="dataset-9", status="pending", issued_at=since, created_at=since)
    vid = cloud.create(ResourceKind.VOLUME, REGION, {"provider_ref": ref}, created_at=since)
    p = pipeline(db, cloud)
    first = run_cycle(p, BACKEND)
    assert [(g.primary_id, g.reason) for g in first.groups] == [(vid, "owner_pending")]

    # then status lists it, with its volume as the group's primary
    [stuck] = json.loads(status(db, "--json").stdout)[0]["stuck_pending"]
    assert (stuck["provider_ref"], stuck["owner_id"], stuck["owner_name"], stuck["primary_id"]) == (
        ref, owner_id, "dataset-9", vid)

    # and once the platform reaps it (deleted, deleted_at now), the next delete cycle deletes the volume
    ledger = LedgerClient(db)
    [stale] = ledger.stale_pending(3600)
    assert (stale.owner_id, stale.owner_type) == (owner_id, "volume")
    assert not ledger.reap_pending(owner_id)  # not an instance's id
    assert ledger.reap_pending(owner_id, "volume") and not ledger.reap_pending(owner_id, "volume")
    after = run_cycle(p, BACKEND, mode="delete")
    assert [(g.primary_id, g.reason, g.action) for g in after.groups] == [(vid, "owner_soft_deleted", "deleted")]
    assert not cloud.exists(vid)
    assert json.loads(status(db, "--json").stdout)[0]["stuck_pending"] == []
