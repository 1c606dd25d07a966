"""What `report` reads is written by real cycles (C3): a report cycle on moto records since
when the leak is an orphan (its owner's end, never before the VM's creation) and its size as
listed; a delete cycle records when it was deleted; `report --json` then counts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest

from orphan_cleanup.ledger.db import Database
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-prod"
MARGIN = 1

pytestmark = pytest.mark.usefixtures("moto_reset")


def cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
               "ORPHAN_CLEANUP_CONFIRM_SECONDS": "0", "NO_COLOR": "1"}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return proc


def orphan_row(db: Database, ref: str) -> dict[str, object]:
    with db.connection() as conn:
        cols = ["state", "first_seen", "orphan_since", "deleted_at", "size"]
        [row] = conn.run(f"SELECT {', '.join(cols)} FROM orphans WHERE provider_ref = :r", r=ref)
    return dict(zip(cols, row, strict=True))


def test_cycles_record_when_an_orphan_began_its_size_and_its_deletion(db):
    # given a backend and an instance whose termination gave up
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " VALUES (:i, 'aws', '123456789012', '{us-east-1}', '{}')", i=BACKEND)
    platform = MotoPlatform(db, BACKEND)
    leaked = platform.terminated_leak()
    time.sleep(MARGIN + 0.2)

    # when a report cycle has run
    cli(db, "run", "--backend", BACKEND, "--mode", "report", "--json")

    # then its orphans row says since when it is one: the owner's end, never before the VM's creation
    with db.connection() as conn:
        [(terminated_at,)] = conn.run("SELECT terminated_at FROM instances WHERE id = :o", o=leaked.owner_id)
    launched = platform.ec2.describe_instances(InstanceIds=[leaked.instance_id])[
        "Reservations"][0]["Instances"][0]["LaunchTime"]
    row = orphan_row(db, leaked.ref)
    assert row["orphan_since"] == max(terminated_at, launched)
    assert row["state"] == "open" and row["deleted_at"] is None
    gb = sum(v["Size"] for v in platform.ec2.describe_volumes(VolumeIds=list(leaked.volume_ids))["Volumes"])
    assert row["size"] == {"instance_type": "m1.small", "disk_gb": gb}

    # when delete cycles run until its row is closed
    for _ in range(5):
        cli(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes", "--json")
        if orphan_row(db, leaked.ref)["state"] == "deleted":
            break

    # then the deletion's time is recorded, by the database clock, after it was first seen
    row = orphan_row(db, leaked.ref)
    assert row["state"] == "deleted" and isinstance(row["deleted_at"], datetime)
    assert row["first_seen"] <= row["deleted_at"]
    assert platform.instance_state(leaked.instance_id) == "terminated"
    # and the report counts it: found, deleted, its time to delete from the row's own times
    doc = json.loads(cli(db, "report", "--json").stdout)
    assert (doc["orphans_found"], doc["orphans_deleted"], doc["orphans_open"]) == (1, 1, 0)
    took = (row["deleted_at"] - row["orphan_since"]).total_seconds()
    assert doc["time_to_delete_seconds"]["p50"] == pytest.approx(took, abs=0.001)
    assert doc["orphan_hours"] == pytest.approx(took / 3600, abs=1e-6)
