"""Why a cycle failed, from every command an operator has (README, "When one fires"; C3
`status --json` keys `last_error`, `last_failed_at`): subprocesses of `python -m orphan_cleanup`
against a real Postgres and the fake GCP Compute server. A failed `run` says its error once;
`status`, `status --json`, `backend show` and `events` say the same one-line reason, with the
region that failed, and no secret (SAFETY.md rule 22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from typing import Any

from orphan_cleanup.ledger.db import Database
from tests.support.gcp_fake import FakeCompute

BACKEND = "gcp-main"
REGION = "europe-west1"


def cli(db: Database, gcp: FakeCompute, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_GCP_ENDPOINT": gcp.url,
               "NO_COLOR": "1"}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def add_gcp_backend(db: Database, gcp: FakeCompute) -> None:
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " VALUES (:i, 'gcp', :p, CAST(:r AS text[]), '{}'::jsonb)", i=BACKEND, p=gcp.project, r=[REGION])


def status_json(db: Database, gcp: FakeCompute) -> dict[str, Any]:
    proc = cli(db, gcp, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    return row


def test_status_events_and_backend_show_say_why_a_gcp_cycle_failed(db, gcp):
    # given a GCP backend whose one region cannot be listed (its zones unreachable, calls there refused)
    add_gcp_backend(db, gcp)
    gcp.fail_region(REGION, status=403)
    # when the operator runs a cycle
    run = cli(db, gcp, "run", "--backend", BACKEND)
    # then it fails, and says why exactly once, naming the region, with no empty group table
    assert run.returncode == 1, (run.stdout, run.stderr)
    both = run.stdout + run.stderr
    assert both.count(REGION) >= 1
    assert "(none)" not in run.stdout and "0 group(s)" not in run.stdout, run.stdout
    reason_lines = [line for line in both.splitlines() if "UNREACHABLE" in line]
    assert len(reason_lines) == 1, both
    # and `status --json` carries the reason and when it failed (C3)
    row = status_json(db, gcp)
    assert row["last_outcome"] == "failed"
    assert isinstance(row["last_error"], str) and REGION in row["last_error"] and "\n" not in row["last_error"]
    assert datetime.fromisoformat(row["last_failed_at"]).tzinfo is not None
    # and the human status shows it under the table
    status = cli(db, gcp, "status")
    assert status.returncode == 0
    table_end = status.stdout.index(BACKEND)
    assert f"{BACKEND} failed" in status.stdout[table_end:] and row["last_error"] in status.stdout, status.stdout
    # and `backend show` shows the last cycle's failures
    show = cli(db, gcp, "backend", "show", BACKEND)
    assert show.returncode == 0, show.stderr
    assert row["last_error"] in show.stdout, show.stdout
    shown = json.loads(cli(db, gcp, "backend", "show", BACKEND, "--json").stdout)
    assert shown["status"]["last_error"] == row["last_error"]
    assert [f["region"] for f in shown["status"]["failures"]] == [REGION]
    # and the events table recorded the failure with the same reason
    events = cli(db, gcp, "events", "--backend", BACKEND, "--since", "1h")
    assert events.returncode == 0 and "cycle_failed" in events.stdout and row["last_error"] in events.stdout, \
        events.stdout
    [event] = [e for e in json.loads(cli(db, gcp, "events", "--backend", BACKEND, "--since", "1h", "--json").stdout)
               if e["kind"] == "cycle_failed"]
    assert event["message"] == row["last_error"] and event["cycle_id"]


def test_a_run_whose_identity_check_fails_says_why_once_in_either_format(db, gcp):
    # given a GCP backend whose project the credentials may not read (SAFETY.md rule 11)
    add_gcp_backend(db, gcp)
    gcp.add_fault(path_contains=f"/projects/{gcp.project}", status=403)
    # when the operator runs a cycle, as a table
    run = cli(db, gcp, "run", "--backend", BACKEND)
    # then it fails and the reason appears once, as the CLI's error line, with no empty table and no log line
    assert run.returncode == 1
    reason = status_json(db, gcp)["last_error"]
    assert [line for line in (run.stdout + run.stderr).splitlines() if "Injected fault" in line] == [
        f"orphan-cleanup: error: {reason}"], (run.stdout, run.stderr)
    assert "(none)" not in run.stdout and "ERROR" not in run.stderr
    # and as JSON: the document on stdout, the same reason once on stderr
    run = cli(db, gcp, "run", "--backend", BACKEND, "--json")
    assert run.returncode == 1 and json.loads(run.stdout)["outcome"] == "failed"
    assert [line for line in run.stderr.splitlines() if "Injected fault" in line] == [
        f"orphan-cleanup: error: {reason}"], run.stderr
