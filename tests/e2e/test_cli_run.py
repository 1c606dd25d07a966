"""`orphan-cleanup run --backend ID --json` as a user runs it: a subprocess
(`python -m orphan_cleanup`) with DATABASE_URL and AWS_ENDPOINT_URL pointing at
a real Postgres and the moto server. Checks the C3 document exactly (keys and
value domains) and the exit codes: 0 clean or unsettled, 1 failed, 2 bad input.
"""

from __future__ import annotations

import json
import os
import re
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
TOP_KEYS = {"backend", "cycle_id", "mode", "listed_at", "outcome", "failures", "groups"}
GROUP_KEYS = {"provider_ref", "region", "primary_id", "resources", "verdict", "reason", "action"}
KINDS = {"instance", "volume", "network-interface", "security-group", "address", "disk"}
VERDICTS = {"tracked", "orphan", "skipped", "ignored", "protected"}
ACTIONS = {"none", "reported", "deleted", "deleting", "delete_failed", "marked"}
REF = re.compile(r"^[a-z0-9]{12}$")
REASON = re.compile(r"^[a-z][a-z0-9_]*$")

pytestmark = pytest.mark.usefixtures("moto_reset")


def cli(db: Database, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
               "NO_COLOR": "1", "ORPHAN_CLEANUP_MAX_MODE": "delete", **env}  # a row may say delete (rule 8)
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def add_backend(db: Database, mode: str | None = None, settings: dict[str, Any] | None = None) -> None:
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " VALUES (:i, 'aws', '123456789012', '{us-east-1}', CAST(:s AS jsonb), :m)",
                 i=BACKEND, s=json.dumps(settings or {}), m=mode)


def check_c3(doc: Any) -> None:
    """The `run --json` document of README contract C3, exactly."""
    assert isinstance(doc, dict) and set(doc) == TOP_KEYS, sorted(doc)
    assert doc["backend"] == BACKEND
    assert isinstance(doc["cycle_id"], str) and doc["cycle_id"]
    assert doc["mode"] in {"report", "delete"}
    assert datetime.fromisoformat(doc["listed_at"]).tzinfo is not None
    assert doc["outcome"] in {"clean", "unsettled", "failed"}
    assert isinstance(doc["failures"], list)
    for failure in doc["failures"]:
        assert set(failure) == {"region", "error"} and all(isinstance(v, str) for v in failure.values())
    assert isinstance(doc["groups"], list)
    for g in doc["groups"]:
        assert GROUP_KEYS <= set(g) <= GROUP_KEYS | {"detail"}, sorted(g)
        assert REF.match(g["provider_ref"]) and isinstance(g["region"], str)
        assert g["primary_id"] is None or g["primary_id"].startswith("i-")
        assert g["resources"] and all(set(r) == {"kind", "id"} and r["kind"] in KINDS and r["id"]
                                      for r in g["resources"])
        assert g["verdict"] in VERDICTS and g["action"] in ACTIONS and REASON.match(g["reason"])
        if g["verdict"] == "orphan":  # the evidence's human line (C3 `detail`)
            assert isinstance(g.get("detail"), str) and g["detail"], g


def run_json(db: Database, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = cli(db, "run", "--backend", BACKEND, "--json", *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one document: trailing text would not parse
    check_c3(doc)
    return proc.returncode, doc, proc.stderr


def by_primary(doc: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {g["primary_id"] or g["provider_ref"]: (g["verdict"], g["reason"], g["action"]) for g in doc["groups"]}


@pytest.fixture
def platform(db: Database) -> MotoPlatform:
    return MotoPlatform(db, BACKEND)


def settle(platform: MotoPlatform) -> None:
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)  # moto stamps creation times now (whole seconds)


def test_report_run_prints_one_c3_document_and_exits_0(db, platform):
    add_backend(db)
    tracked = platform.tracked()
    leaked = platform.terminated_leak()
    leftovers = platform.leftover_volumes()
    foreign = platform.foreign()
    protected = platform.terminated_leak(protect=True)
    settle(platform)

    code, doc, _ = run_json(db)

    assert code == 0 and doc["outcome"] == "clean" and doc["mode"] == "report" and doc["failures"] == []
    groups = by_primary(doc)
    assert groups[tracked.instance_id] == ("tracked", "tracked", "none")
    assert groups[leaked.instance_id] == ("orphan", "owner_terminated", "reported")
    assert groups[leftovers.ref] == ("orphan", "owner_deleted", "reported")
    assert groups[foreign.instance_id] == ("ignored", "no_record", "none")
    assert groups[protected.instance_id] == ("protected", "protect_tag", "reported")
    kinds = {r["kind"] for g in doc["groups"] for r in g["resources"]}
    assert kinds == {"instance", "volume"}
    assert platform.instance_state(leaked.instance_id) == "running"


def test_an_empty_aws_endpoint_variable_counts_as_unset(db, platform):
    # given AWS_ENDPOINT_URL set but empty, and boto3's per-service variables naming moto
    add_backend(db)
    leaked = platform.terminated_leak()
    settle(platform)
    moto = os.environ["AWS_ENDPOINT_URL"]

    proc = cli(db, "run", "--backend", BACKEND, "--json", AWS_ENDPOINT_URL="", AWS_ENDPOINT_URL_EC2=moto,
               AWS_ENDPOINT_URL_STS=moto, AWS_ENDPOINT_URL_ELASTIC_LOAD_BALANCING_V2=moto)

    # then the run is a run (no "Invalid endpoint" traceback): boto3 finds moto through its own variables
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "Invalid endpoint" not in proc.stderr, (
        proc.stderr)
    assert by_primary(json.loads(proc.stdout))[leaked.instance_id] == ("orphan", "owner_terminated", "reported")


def test_delete_run_that_deletes_exits_0_and_a_protected_one_is_not_a_failure(db, platform):
    add_backend(db)
    leaked = platform.terminated_leak()
    settle(platform)

    code, doc, _ = run_json(db, "--mode", "delete", "--yes")

    assert code == 0 and doc["outcome"] == "clean" and doc["mode"] == "delete"
    assert by_primary(doc)[leaked.instance_id] == ("orphan", "owner_terminated", "deleted")
    assert platform.instance_state(leaked.instance_id) == "terminated"

    stuck = platform.terminated_leak(termination_protection=True)  # SAFETY.md rule 14: a verdict, not a failure
    settle(platform)
    code, doc, _ = run_json(db, "--mode", "delete", "--yes")

    assert code == 0 and doc["outcome"] == "clean"
    assert by_primary(doc)[stuck.instance_id] == ("protected", "termination_protection", "reported")
    [group] = [g for g in doc["groups"] if g["primary_id"] == stuck.instance_id]
    assert stuck.instance_id in group["detail"] and "disableApiTermination" in group["detail"]
    assert platform.instance_state(stuck.instance_id) == "running"


def test_unsettled_run_exits_0(db, platform):
    # A margin of its own (the backend's setting overrides the process's 1 s): a slow
    # machine taking seconds to start the CLI cannot carry the change out of it.
    add_backend(db, mode="delete", settings={"margin_seconds": 600})
    changed = platform.tracked()
    settle(platform)
    platform.ledger.mark_terminated(changed.owner_id)  # inside the margin at listing time

    code, doc, _ = run_json(db, "--yes")  # the backend deletes: consent

    assert code == 0 and doc["outcome"] == "unsettled" and doc["mode"] == "delete"
    assert by_primary(doc)[changed.instance_id] == ("skipped", "recent_owner_change", "none")
    assert platform.instance_state(changed.instance_id) == "running"


@pytest.mark.parametrize("args", [
    ("run", "--json"),
    ("run", "--backend", "no-such-backend", "--json"),
    ("run", "--backend", BACKEND, "--mode", "destroy", "--json"),
], ids=["missing-backend", "unknown-backend", "bad-mode"])
def test_bad_input_exits_2_with_one_line_on_stderr(db, args):
    add_backend(db)

    proc = cli(db, *args)

    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orphan-cleanup: error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_table_shows_the_detail_of_a_group_that_has_one(db, platform):
    # Given: an orphan that an Auto Scaling group launched (SAFETY.md rule 14) and a plain orphan
    add_backend(db)
    asg = platform.asg_leak("web-asg")
    leaked = platform.terminated_leak()
    settle(platform)

    # When: a report run prints its table
    proc = cli(db, "run", "--backend", BACKEND)

    # Then: the table has a detail column naming the controller
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("ref "))
    assert header.split()[-1] == "detail"
    [asg_row] = [line for line in proc.stdout.splitlines() if asg.instance_id in line]
    assert "managed_by_controller" in asg_row and asg_row.endswith(f"{asg.instance_id} is managed by asg:web-asg")
    assert any(leaked.instance_id in line for line in proc.stdout.splitlines())
