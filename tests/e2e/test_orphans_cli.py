"""`orphan-cleanup orphans` and `events` as an operator runs them (C3): subprocesses against a
real Postgres and the moto server. An orphan a report cycle found is listed with the size
the listing read (instance type, disk GB) and, with a price table, its cost; once a delete
cycle has converged it is no longer listed, and the events table tells the story."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import pytest

from orphan_cleanup.ledger.db import Database
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-prod"
MARGIN = 1
ORPHAN_KEYS = {"backend", "provider_ref", "primary_id", "region", "resources", "size", "first_seen", "last_seen",
               "last_action", "reason"}
PRICES = {"instance_hour": {"m1.small": 0.5}, "disk_gb_month": 73.0, "address_hour": 0.005}

pytestmark = pytest.mark.usefixtures("moto_reset")


def cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
               "NO_COLOR": "1"}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def add_backend(db: Database, settings: dict[str, Any]) -> None:
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " VALUES (:i, 'aws', '123456789012', '{us-east-1}', CAST(:s AS jsonb))", i=BACKEND,
                 s=json.dumps(settings))


def orphans_json(db: Database, *extra: str) -> list[dict[str, Any]]:
    proc = cli(db, "orphans", "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def disk_gb(platform: MotoPlatform, volume_ids: tuple[str, ...]) -> int:
    return sum(v["Size"] for v in platform.ec2.describe_volumes(VolumeIds=list(volume_ids))["Volumes"])


def test_an_orphan_is_listed_with_its_size_and_cost_until_a_delete_cycle_converges(db):
    # given a backend with a price table and an instance whose termination gave up, with its volumes
    add_backend(db, {"prices": PRICES})
    platform = MotoPlatform(db, BACKEND)
    tracked = platform.tracked()
    leaked = platform.terminated_leak()
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)
    assert orphans_json(db) == []

    # when a report cycle has run
    report = cli(db, "run", "--backend", BACKEND, "--mode", "report", "--json")
    assert report.returncode == 0, report.stderr
    listed = orphans_json(db)

    # then orphans lists the leaked instance (and not the tracked one) with its size and cost
    assert [o["primary_id"] for o in listed] == [leaked.instance_id]
    [orphan] = listed
    assert set(orphan) == ORPHAN_KEYS | {"cost_per_hour", "cost_so_far"}
    gb = disk_gb(platform, leaked.volume_ids)
    assert orphan["size"] == {"instance_type": "m1.small", "disk_gb": gb}
    assert (orphan["backend"], orphan["provider_ref"], orphan["region"]) == (BACKEND, leaked.ref, "us-east-1")
    assert (orphan["reason"], orphan["last_action"]) == ("owner_terminated", "reported")
    assert {(r["kind"], r["id"]) for r in orphan["resources"]} == {
        ("instance", leaked.instance_id), *(("volume", v) for v in leaked.volume_ids)}
    # 0.5/h for the instance, and 73 per GB-month is 0.1 per GB-hour (730 h a month)
    assert orphan["cost_per_hour"] == pytest.approx(0.5 + 0.1 * gb)
    first_seen = datetime.fromisoformat(orphan["first_seen"])
    assert datetime.fromisoformat(orphan["last_seen"]) >= first_seen
    assert 0 <= orphan["cost_so_far"] <= orphan["cost_per_hour"]  # seen seconds ago: a fraction of an hour
    assert tracked.instance_id not in json.dumps(listed)
    # the same through --backend; the table names the size and the backend's total
    assert orphans_json(db, "--backend", BACKEND) == [{**orphan, "cost_so_far": pytest.approx(
        orphan["cost_so_far"], abs=0.01)}]
    table = cli(db, "orphans").stdout
    assert leaked.ref in table and f"m1.small, {gb} GB disk" in table and f"{BACKEND}: 1 open orphan(s)" in table
    status = cli(db, "status")
    assert "open orphans: 1" in status.stdout and f"stalest backend: {BACKEND}" in status.stdout

    # when delete cycles run until one finishes clean with nothing left to delete
    for _ in range(5):
        run = cli(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes", "--json")
        assert run.returncode == 0, run.stderr
        if not orphans_json(db):
            break

    # then the orphan is no longer listed, and its instance is terminated
    assert orphans_json(db) == []
    assert platform.instance_state(leaked.instance_id) == "terminated"
    assert platform.instance_state(tracked.instance_id) == "running"
    # and the events table tells what happened to its ref
    events = json.loads(cli(db, "events", "--backend", BACKEND, "--since", "1h", "--json").stdout)
    kinds = [e["kind"] for e in events if e["provider_ref"] == leaked.ref]
    assert "orphan_reported" in kinds and "orphan_deleted" in kinds, kinds


def test_without_prices_there_is_no_cost_and_bad_input_exits_2(db):
    add_backend(db, {})
    platform = MotoPlatform(db, BACKEND)
    leaked = platform.terminated_leak(data_volume=False)
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)
    assert cli(db, "run", "--backend", BACKEND, "--json").returncode == 0

    [orphan] = orphans_json(db)

    assert set(orphan) == ORPHAN_KEYS and orphan["primary_id"] == leaked.instance_id
    assert orphan["size"]["instance_type"] == "m1.small"
    for args in (("orphans", "--backend", "nope"), ("events", "--backend", "nope"),
                 ("events", "--since", "yesterday")):
        proc = cli(db, *args)
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stdout)
        assert proc.stderr.startswith("orphan-cleanup: error:") and len(proc.stderr.strip().splitlines()) == 1
