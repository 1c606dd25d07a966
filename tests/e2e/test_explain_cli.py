"""`orphan-cleanup explain` as a user runs it: subprocesses (`python -m orphan_cleanup`)
against a real Postgres ledger and EC2 on the moto server. A delete run first
(`run --mode delete --json`), then explain reads back why each VM got its verdict:
a deleted orphan, the kept VM of a retry leak, a protected VM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.db import Database
from tests.support.ledger_helpers import add_backend
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-prod"
ENTRY_KEYS = {"cycle_id", "listed_at", "mode", "group", "verdict", "reason", "action", "detail", "evidence",
              "delete"}

pytestmark = pytest.mark.usefixtures("moto_reset")


def cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with the test database and moto (margin 0: moto stamps launch times with its own clock)."""
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": "0", "NO_COLOR": "1"}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


def explain_json(db: Database, query: str) -> dict[str, Any]:
    proc = cli(db, "explain", "--backend", BACKEND, query, "--json")
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    doc = json.loads(proc.stdout)  # exactly one document
    assert set(doc) == {"backend", "query", "cycles", "journal", "ignored_settings", "keep"} and (doc["backend"], doc["query"]) == (BACKEND, query)
    assert all(set(c) == ENTRY_KEYS for c in doc["cycles"])
    return doc


def test_explain_reads_back_a_delete_run(emptied_db):
    # given a terminated owner's leaked VM and a protected one, terminated an hour ago, and a
    # retry leak (its first VM leaked, the second kept, provisioned just now)
    db = emptied_db
    add_backend(db, BACKEND)
    platform = MotoPlatform(db, BACKEND)
    leak = platform.terminated_leak()
    guarded = platform.terminated_leak(protect=True)
    platform.age_ledger()
    issued = platform.ledger.issue_ref(owner_name="retried")
    first, _ = platform.launch(issued.provider_ref, data_volume=False)
    kept, _ = platform.launch(issued.provider_ref, data_volume=False)
    platform.ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=kept, region=platform.region,
                                      status=OwnerStatus.BUSY)

    # when a delete run goes through them
    run = cli(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes", "--json")
    assert run.returncode == 0, run.stderr
    cycle_id = json.loads(run.stdout)["cycle_id"]

    # then the deleted orphan is explained by its owner's termination and the re-read
    [deleted] = explain_json(db, leak.instance_id)["cycles"]
    assert (deleted["cycle_id"], deleted["mode"]) == (cycle_id, "delete")
    assert (deleted["verdict"], deleted["reason"], deleted["action"]) == ("orphan", "owner_terminated", "deleted")
    owner = deleted["evidence"]["owner"]
    assert (owner["id"], owner["status"], owner["backend_id"], owner["primary_id"]) == (
        leak.owner_id, "terminated", BACKEND, leak.instance_id)
    assert owner["times"]["terminated_at"]["within_margin"] is False
    assert owner["times"]["terminated_at"]["seconds_before_listed_at"] > 3000
    assert deleted["delete"]["state"] == "done" and leak.instance_id in deleted["delete"]["result"]["deleted"]
    assert "same ref, no protect tag" in deleted["delete"]["found"]
    assert platform.instance_state(leak.instance_id) in ("shutting-down", "terminated")

    # and the kept VM of the retry leak is tracked (a manual run records it), its first VM an orphan
    by_ref = explain_json(db, issued.provider_ref)["cycles"]
    assert {c["group"]["primary_id"]: (c["verdict"], c["reason"], c["action"]) for c in by_ref} == {
        kept: ("tracked", "tracked", "none"), first: ("orphan", "primary_mismatch", "deleted")}
    assert platform.instance_state(kept) == "running"

    # and the protected VM names its protect tag, in words
    human = cli(db, "explain", "--backend", BACKEND, guarded.instance_id)
    assert human.returncode == 0, human.stderr
    assert "verdict   protected (protect_tag)" in human.stdout
    assert f"orphan-cleanup-protect on {guarded.instance_id}" in human.stdout
    assert platform.instance_state(guarded.instance_id) == "running"


def test_explain_exits_1_when_nothing_is_recorded_and_2_for_an_unknown_backend(emptied_db):
    add_backend(emptied_db, BACKEND)

    nothing = cli(emptied_db, "explain", "--backend", BACKEND, "i-0123456789abcdef0", "--json")
    unknown = cli(emptied_db, "explain", "--backend", "nope", "i-0123456789abcdef0")

    assert (nothing.returncode, nothing.stdout) == (1, "") and "Traceback" not in nothing.stderr
    assert nothing.stderr.startswith("orphan-cleanup: nothing recorded for 'i-0123456789abcdef0'")
    assert f"no cycle of {BACKEND} has finished a listing yet" in nothing.stderr
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr.startswith("orphan-cleanup: error: unknown backend 'nope'")


def test_explain_of_an_untagged_vm_after_a_manual_run_says_it_has_no_ref_tag(emptied_db):
    # given a VM someone launched by hand, without the ref tag, and a manual run of the backend
    db = emptied_db
    add_backend(db, BACKEND)
    platform = MotoPlatform(db, BACKEND)
    platform.tracked()
    untagged = platform.ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    run = cli(db, "run", "--backend", BACKEND)
    assert run.returncode == 0, run.stderr

    proc = cli(db, "explain", "--backend", BACKEND, untagged)

    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert "never listed: the latest manual run" in proc.stderr
    assert "a resource without a 'provider_ref' tag is never listed" in proc.stderr
    assert "recorded by manual runs only" not in proc.stderr and "Traceback" not in proc.stderr
