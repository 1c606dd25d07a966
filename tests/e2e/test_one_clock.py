"""One clock (SAFETY.md rule 13): the functions' clocks are skewed two hours
either way with libfaketime (Debian's ``faketime``), far above the 300 s
margin, while Postgres and moto keep the real time. Every compared timestamp
must still come from the database: ``listed_at`` is the database's now,
``clean_at`` is ``listed_at`` minus the margin, and a ledger write after a
clean cycle is seen as activity by the next scheduled run (rule 9).

The deployed pieces run as subprocesses under ``faketime``: the CLI
(``python -m orphan_cleanup run``) and the real lister Lambda handler.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from orphan_cleanup.ledger.db import Database
from tests.support.ledger_helpers import add_backend, add_ref, cleanup_row, cycle_row, db_now
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-clock"
MARGIN = timedelta(seconds=300)  # the default (ORPHAN_CLEANUP_MARGIN_SECONDS unset)
CLOSE = timedelta(seconds=30)  # "within seconds": far below the two hours of skew
SKEWS = {"+2h": 7200, "-2h": -7200}
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.usefixtures("moto_reset"),
    pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime (libfaketime) is not installed"),
]

LISTER = """
import json, sys
from functions.aws import lister
from tests.support.sqs_harness import context
print("RESULT " + json.dumps(lister.handler({"backend": sys.argv[1]}, context("lister")), default=str))
"""


def skewed(skew: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **env}
    for key in ("ORPHAN_CLEANUP_MODE", "ORPHAN_CLEANUP_MARGIN_SECONDS", "FAKETIME", "LD_PRELOAD"):
        environ.pop(key, None)
    return subprocess.run(["faketime", "-f", skew, sys.executable, *argv], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=REPO, check=False)


def scheduled_lister(skew: str, env: dict[str, str]) -> dict[str, Any]:
    proc = skewed(skew, ["-c", LISTER, BACKEND], env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["ok"], result
    return result


def make_due(db: Database) -> None:
    with db.connection() as conn:
        conn.run("UPDATE cleanup SET next_due_at = now() - interval '1 hour' WHERE backend_id = :b", b=BACKEND)


@pytest.mark.parametrize("skew", list(SKEWS))
def test_a_skewed_function_clock_changes_no_compared_timestamp(emptied_db: Database, skew: str) -> None:
    # libfaketime must really skew a Python subprocess here, or this test proves nothing
    probe = skewed(skew, ["-c", "import time; print(time.time())"], {})
    assert probe.returncode == 0, probe.stderr
    assert abs(float(probe.stdout) - time.time() - SKEWS[skew]) < 60, "faketime does not skew a Python process"

    # given a backend with a tracked owner; every ledger change is old (an hour ago)
    db = emptied_db
    add_backend(db, BACKEND)
    platform = MotoPlatform(db, BACKEND)
    platform.tracked()
    platform.age_ledger()
    with db.connection() as conn:
        conn.run("UPDATE ledger_activity SET at = at - interval '1 hour'")
    sqs = boto3.client("sqs", region_name="us-east-1")
    env = {"DATABASE_URL": db.info.url(), "NO_COLOR": "1",
           "LISTING_QUEUE_URL": sqs.create_queue(QueueName="clock-listing")["QueueUrl"],
           "DELETE_QUEUE_URL": sqs.create_queue(QueueName="clock-delete")["QueueUrl"],
           "POWERTOOLS_METRICS_NAMESPACE": "OrphanCleanupClock", "POWERTOOLS_SERVICE_NAME": "orphan-cleanup"}

    # when a manual run happens under the skewed clock
    proc = skewed(skew, ["-m", "orphan_cleanup", "run", "--backend", BACKEND, "--json"], env)

    # then its listing time is the database's now and clean_at is that minus the margin
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["outcome"] == "clean", doc
    now = db_now(db)
    cycle = cycle_row(db, doc["cycle_id"])
    assert abs(now - cycle["listed_at"]) < CLOSE, (now, cycle["listed_at"])
    for column in ("started_at", "finished_at"):
        if cycle.get(column) is not None:
            assert abs(now - cycle[column]) < CLOSE, (column, now, cycle[column])
    clean_at = cleanup_row(db, BACKEND)["clean_at"]
    assert clean_at == cycle["listed_at"] - MARGIN
    assert clean_at < now

    # and a scheduled run (skewed too) with nothing new does not list...
    make_due(db)
    idle = scheduled_lister(skew, env)
    assert idle["started"] is False and idle["reason"] == "no_activity", idle

    # ...but after a new ref is issued, it lists for activity (rule 9 holds under skew)
    platform.ledger.issue_ref(owner_name="after the clean cycle")
    make_due(db)
    active = scheduled_lister(skew, env)
    assert active["started"] is True and active["reason"] == "activity", active
    listed_at = cycle_row(db, active["cycle_id"])["listed_at"]
    assert abs(db_now(db) - listed_at) < CLOSE, listed_at


TICK = """
import json
from functions.aws import lister
from tests.support.sqs_harness import context
print("RESULT " + json.dumps(lister.handler({}, context("lister")), default=str))
"""


@pytest.mark.parametrize("skew", list(SKEWS))
def test_a_skewed_tick_selects_due_backends_by_the_database_clock(emptied_db: Database, skew: str) -> None:
    # given three backends of one account, never cleaned, due an hour ago, in 30 s (within
    # the hourly interval's 60 s tolerance: due, so the tick's statement must send its facts)
    # and in two hours (beyond its horizon: sent without facts, not due)
    db = emptied_db
    add_ref(db)  # the ledger has issued a ref: the tick enrolls every backend
    due_in = {"clock-past": "- interval '1 hour'", "clock-near": "+ interval '30 seconds'",
              "clock-later": "+ interval '2 hours'"}
    for backend, offset in due_in.items():
        add_backend(db, backend, settings={"interval_seconds": 3600})
        with db.connection() as conn:
            conn.run(f"INSERT INTO cleanup (backend_id, next_due_at) VALUES (:b, now() {offset})", b=backend)
    sqs = boto3.client("sqs", region_name="us-east-1")
    env = {"DATABASE_URL": db.info.url(), "NO_COLOR": "1",
           "JOBS_QUEUE_URL": sqs.create_queue(QueueName="clock-jobs")["QueueUrl"],
           "LISTING_QUEUE_URL": sqs.create_queue(QueueName="clock-listing")["QueueUrl"],
           "DELETE_QUEUE_URL": sqs.create_queue(QueueName="clock-delete")["QueueUrl"],
           "POWERTOOLS_METRICS_NAMESPACE": "OrphanCleanupClock", "POWERTOOLS_SERVICE_NAME": "orphan-cleanup"}

    # when the deployed tick runs with its clock two hours off
    proc = skewed(skew, ["-c", TICK], env)

    # then the database's clock decided: +2h would make "later" due, -2h would make "past" not due
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT "))
    tick = json.loads(line.removeprefix("RESULT "))
    assert tick["ok"], tick
    assert tick["due"] == {"clock-near": "never_cleaned", "clock-past": "never_cleaned"}, tick
    assert tick["skipped"] == {"clock-later": "not_due"}, tick
    assert tick["jobs"] == [["clock-near", "clock-past"]], tick
