"""No tracebacks (README, "Running it by hand"): a reader that closes the pipe early
(`orphan-cleanup explain ... | head -5`), an environment variable set to the empty string,
settings values of any shape. Commands run as a user runs them: `python -m orphan_cleanup`
in a subprocess against the tests' real Postgres; the recorded cycle is a real manual run
of the pipeline on the in-memory cloud."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, db_now, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

BACKEND = "aws-prod"


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


def environment(db: Database, **env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORPHAN_CLEANUP_")}
    environ.update(DATABASE_URL=db.info.url(), NO_COLOR="1", ORPHAN_CLEANUP_DATA_DIR="/nonexistent/never-used", **env)
    return environ


def recorded_leak(db: Database) -> str:
    """A manual run recorded a terminated owner's VM; returns the VM's id."""
    add_backend(db, BACKEND)
    cloud = MemoryCloud()
    at = db_now(db) - timedelta(hours=2)
    ref = make_ref()
    iid = cloud.create(ResourceKind.INSTANCE, "us-east-1", {"provider_ref": ref}, created_at=at)
    add_instance(db, ref=ref, status="terminated", backend_id=BACKEND, primary_id=iid, region="us-east-1",
                 issued_at=at, created_at=at, provisioned_at=at, terminated_at=at)
    pipeline = Pipeline(settings=Settings.explicit(confirm_seconds=0),
                        db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    run_cycle(pipeline, BACKEND)
    return iid


def with_closed_stdout(db: Database, *args: str) -> tuple[int, str]:
    """The command with its stdout a pipe whose reader is gone before it writes (`| head -0`)."""
    proc = subprocess.Popen([sys.executable, "-m", "orphan_cleanup", *args], env=environment(db),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader goes away at once: the first write meets a closed pipe
    stderr = proc.stderr.read()
    return proc.wait(timeout=120), stderr


def test_a_closed_pipe_drops_the_output_quietly_and_keeps_the_commands_exit_code(db):
    iid = recorded_leak(db)

    for args, code in [(["explain", "--backend", BACKEND, iid], 0),
                       (["explain", "--backend", BACKEND, iid, "--json"], 0), (["status"], 0),
                       (["backend", "list", "--json"], 0), (["backend", "show", BACKEND], 0),
                       (["--help"], 0), (["explain", "--backend", BACKEND, "i-never"], 1)]:
        got, stderr = with_closed_stdout(db, *args)
        assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr, (
            args, stderr)
        assert got == code, (args, got, stderr)


def test_head_reads_the_first_lines_and_nothing_complains(db):
    iid = recorded_leak(db)

    proc = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -2', "-", sys.executable, "-m",
                           "orphan_cleanup", "explain", "--backend", BACKEND, iid], env=environment(db),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, (proc.stdout, proc.stderr)
    assert proc.stderr == ""


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "ORPHAN_CLEANUP_GCP_ENDPOINT", "SENTRY_DSN",
                                      "ORPHAN_CLEANUP_MODE", "ORPHAN_CLEANUP_MARGIN_SECONDS", "DATABASE_URL"])
def test_a_variable_set_to_the_empty_string_counts_as_unset(monkeypatch, variable):
    monkeypatch.delenv(variable, raising=False)
    unset = Settings()
    monkeypatch.setenv(variable, "")
    assert Settings() == unset


def test_status_with_empty_variables_is_the_same_as_without(db):
    add_backend(db, BACKEND)
    plain = subprocess.run([sys.executable, "-m", "orphan_cleanup", "status", "--json"], env=environment(db),
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    empty = subprocess.run([sys.executable, "-m", "orphan_cleanup", "status", "--json"],
                           env=environment(db, AWS_ENDPOINT_URL="", ORPHAN_CLEANUP_GCP_ENDPOINT="",
                                           ORPHAN_CLEANUP_MODE="", SENTRY_DSN=""),
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert (empty.returncode, empty.stderr) == (0, "") and json.loads(empty.stdout) == json.loads(plain.stdout)
