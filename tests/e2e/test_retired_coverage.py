"""Coverage never shrinks silently (docs/SAFETY.md rule 24), as a user meets it: the CLI in a
subprocess (`python -m orphan_cleanup`) on a real Postgres and the moto server, the GCP case on
the fake Compute server with the real client. A backends row deleted or moved by the
platform's plain SQL leaves a retired coverage: its leaks are still reported (deleted only
when its last mode and the stack's ceiling both said delete), `status` says why it stays, it
retires itself after a clean cycle that found nothing of it, and an operator can drop it."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.gcp.provider import build_gcp_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend, add_ref, db_now
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-old"
ACCOUNT, OTHER_ACCOUNT = "123456789012", "210987654321"
OTHER_ROLE = f"arn:aws:iam::{OTHER_ACCOUNT}:role/x"
MARGIN = 1


def cli(db: Database, *args: str, stdin: Any = subprocess.DEVNULL, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
               "NO_COLOR": "1", "ORPHAN_CLEANUP_MAX_MODE": "delete", **env}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=stdin)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def run_json(db: Database, backend: str, *extra: str, **env: str) -> tuple[int, dict[str, Any]]:
    proc = cli(db, "run", "--backend", backend, "--json", *extra, **env)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_instance(doc: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {g["primary_id"]: (g["verdict"], g["reason"], g["action"]) for g in doc["groups"] if g["primary_id"]}


def sql(db: Database, statement: str, **params: Any) -> list[list[Any]]:
    with db.connection() as conn:
        return conn.run(statement, **params)


def coverages(db: Database) -> list[list[Any]]:
    return sql(db, "SELECT id, backend_id, account, regions, mode, why FROM retired_coverages ORDER BY id")


def status(db: Database, **env: str) -> list[dict[str, Any]]:
    proc = cli(db, "status", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def settle(platform: MotoPlatform) -> None:
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)  # moto stamps creation times now (whole seconds)


def insert_backend(db: Database, mode: str | None, settings: dict[str, Any] | None = None,
                   account: str = ACCOUNT) -> None:
    sql(db, "INSERT INTO backends (id, provider, account, regions, settings, mode)"
            " VALUES (:i, 'aws', :a, '{us-east-1}', CAST(:s AS jsonb), :m)",
        i=BACKEND, a=account, s=json.dumps(settings or {}), m=mode)


@pytest.fixture
def platform(emptied_db: Database, moto_reset: None) -> MotoPlatform:
    return MotoPlatform(emptied_db, BACKEND)


def test_a_backend_row_deleted_with_plain_sql_still_reports_its_leak(emptied_db, platform):
    # Given: a backend with a tracked VM and a leaked one (termination gave up), and a
    # platform that deletes the backends row with plain SQL (a user removed the account)
    db = emptied_db
    insert_backend(db, mode=None)
    tracked, leaked = platform.tracked(), platform.terminated_leak()
    settle(platform)
    sql(db, "DELETE FROM backends WHERE id = :b", b=BACKEND)

    # Then: what it covered is a retired coverage, report-only, with its event
    [[cov, origin, account, regions, mode, why]] = coverages(db)
    assert (origin, account, regions, mode, why) == (BACKEND, ACCOUNT, ["us-east-1"], None, "removed")
    assert cov.startswith(f"{BACKEND}~")
    [[kind, message]] = sql(db, "SELECT kind, message FROM events WHERE backend_id = :c", c=cov)
    assert kind == "coverage_retained" and "stays listed" in message

    # When: the operator runs the removed backend's id (its one retired coverage), under a
    # delete ceiling (its last mode was the stack's, not delete)
    code, doc = run_json(db, BACKEND, "--yes")

    # Then: the leak is reported, never deleted; the tracked VM's owner still names the removed
    # backend and is judged against the coverage's account: tracked
    assert code == 0 and doc["backend"] == cov and doc["mode"] == "report"
    assert by_instance(doc)[leaked.instance_id] == ("orphan", "owner_terminated", "reported")
    assert by_instance(doc)[tracked.instance_id][0] == "tracked"
    assert platform.instance_state(leaked.instance_id) == "running"
    # and `status` lists it under the backend it came from, with why it stays
    [row] = status(db)
    assert (row["backend"], row["retired"], row["coverage"], row["open_orphans"]) == (BACKEND, True, cov, 1)
    human = cli(db, "status").stdout
    assert (f"{cov}: retired from {BACKEND} (aws {ACCOUNT}, us-east-1): 1 open orphan; it stays until two clean"
            f" cycles in a row there find nothing of {BACKEND}") in human
    # and a delete run of it is refused in one line, before anything is listed
    proc = cli(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes")
    assert proc.returncode == 2 and "report-only" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_under_a_delete_ceiling_and_last_mode_delete_the_coverage_deletes_its_leak(emptied_db, platform):
    db = emptied_db
    insert_backend(db, mode="delete")
    tracked, leaked = platform.tracked(), platform.terminated_leak()
    settle(platform)
    sql(db, "DELETE FROM backends WHERE id = :b", b=BACKEND)
    [[cov, *_, mode, _why]] = coverages(db)
    assert mode == "delete"

    # Under a report ceiling the same coverage only reports
    code, doc = run_json(db, BACKEND, ORPHAN_CLEANUP_MAX_MODE="report")
    assert code == 0 and doc["mode"] == "report"
    assert by_instance(doc)[leaked.instance_id] == ("orphan", "owner_terminated", "reported")
    assert platform.instance_state(leaked.instance_id) == "running"

    # Under a delete ceiling it deletes the leak (with consent), never the tracked VM
    code, doc = run_json(db, cov, "--yes")
    assert code == 0 and doc["mode"] == "delete"
    assert by_instance(doc)[leaked.instance_id] == ("orphan", "owner_terminated", "deleted")
    assert platform.instance_state(leaked.instance_id) in ("shutting-down", "terminated")
    assert platform.instance_state(tracked.instance_id) == "running"
    # The tracked VM's owner names the removed backend: its coverage stays
    assert [c[0] for c in coverages(db)] == [cov]


def test_an_account_changed_by_update_is_still_listed_under_its_old_settings(emptied_db, platform):
    # Given: a backend on moto's default account with a leak; the platform moves the row to
    # another account (a role there) with plain SQL
    db = emptied_db
    insert_backend(db, mode=None)
    leaked = platform.terminated_leak()
    settle(platform)
    sql(db, "UPDATE backends SET account = :a, settings = CAST(:s AS jsonb) WHERE id = :b",
        a=OTHER_ACCOUNT, s=json.dumps({"role_arn": OTHER_ROLE}), b=BACKEND)
    [[cov, origin, account, regions, mode, why]] = coverages(db)
    assert (origin, account, regions, mode, why) == (BACKEND, ACCOUNT, ["us-east-1"], None, "moved")

    # When: the backend (now the other account) and its retired coverage (the old one) run
    code, live = run_json(db, BACKEND)
    assert code == 0 and leaked.instance_id not in by_instance(live)
    code, old = run_json(db, cov)

    # Then: the old account is still listed: its leak is reported
    assert code == 0 and by_instance(old)[leaked.instance_id] == ("orphan", "owner_terminated", "reported")
    assert {(r["backend"], r["retired"]) for r in status(db)} == {(BACKEND, False), (BACKEND, True)}


def test_a_clean_cycle_that_finds_nothing_of_it_retires_the_coverage(emptied_db, platform):
    db = emptied_db
    insert_backend(db, mode="delete")
    tracked = platform.tracked(data_volume=False)  # its root volume goes with it
    settle(platform)
    sql(db, "DELETE FROM backends WHERE id = :b", b=BACKEND)
    [[cov, *_]] = coverages(db)

    # A clean cycle that finds a VM whose owner names the removed backend: it stays
    code, doc = run_json(db, cov, "--yes")
    assert code == 0 and doc["outcome"] == "clean", doc
    assert by_instance(doc)[tracked.instance_id][0] == "tracked"
    assert [c[0] for c in coverages(db)] == [cov]

    # The platform ends that VM and records it; the next clean cycle finds nothing of it, and
    # the one after confirms it
    platform.ec2.terminate_instances(InstanceIds=[tracked.instance_id])
    platform.ledger.mark_terminated(tracked.owner_id)
    code, doc = run_json(db, cov, "--yes")
    assert code == 0 and doc["outcome"] == "clean", json.dumps(doc)
    assert [c[0] for c in coverages(db)] == [cov]
    code, doc = run_json(db, cov, "--yes")
    assert code == 0 and doc["outcome"] == "clean", json.dumps(doc)
    assert coverages(db) == []
    [[message]] = sql(db, "SELECT message FROM events WHERE backend_id = :c AND kind = 'coverage_retired'", c=cov)
    assert f"retired coverage {cov} of backend {BACKEND}" in message and "two clean cycles in a row" in message
    assert status(db) == []
    assert sql(db, "SELECT count(*) FROM cleanup WHERE backend_id = :c", c=cov) == [[0]]
    proc = cli(db, "run", "--backend", BACKEND)
    assert proc.returncode == 2 and "unknown backend" in proc.stderr


def test_credentials_that_no_longer_reach_it_fail_its_cycles_visibly(emptied_db, platform):
    # Given: a backend of another account whose row goes; the stack's credentials reach
    # moto's default account only, so its retired coverage's identity check fails
    db = emptied_db
    insert_backend(db, mode=None, account=OTHER_ACCOUNT)
    add_ref(db)  # the ledger has issued refs: the tick enrolls it
    sql(db, "DELETE FROM backends WHERE id = :b", b=BACKEND)
    [[cov, *_]] = coverages(db)

    code, doc = run_json(db, cov)

    assert code == 1 and doc["outcome"] == "failed"
    [row] = status(db)
    assert row["retired"] and row["last_outcome"] == "failed" and row["failing_since"] is not None
    assert row["stale_seconds"] is not None  # the staleness alarm counts it
    human = cli(db, "status").stdout
    line = next(x for x in human.splitlines() if x.startswith(f"{cov}: retired from {BACKEND}"))
    assert ", cycles failing since " in line and OTHER_ACCOUNT in line
    assert f"orphan-cleanup backend forget-coverage {cov}" in line


def test_forget_coverage_needs_consent_and_leaves_an_event(emptied_db):
    db = emptied_db
    insert_backend(db, mode=None)
    sql(db, "DELETE FROM backends WHERE id = :b", b=BACKEND)
    [[cov, *_]] = coverages(db)

    # Without a terminal and without --yes: exit 2, one line, nothing changed
    proc = cli(db, "backend", "forget-coverage", BACKEND)
    assert proc.returncode == 2 and "--yes" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert [c[0] for c in coverages(db)] == [cov]
    # An unknown one: exit 2
    assert cli(db, "backend", "forget-coverage", "nope~1", "--yes").returncode == 2

    # On a terminal, a wrong answer drops nothing; the coverage's id drops it
    assert forget_on_a_terminal(db, cov, answer="no") == 0
    assert [c[0] for c in coverages(db)] == [cov]
    assert forget_on_a_terminal(db, cov, answer=cov) == 0
    assert coverages(db) == []
    [[message]] = sql(db, "SELECT message FROM events WHERE backend_id = :c AND kind = 'coverage_forgotten'", c=cov)
    assert cov in message and BACKEND in message


def forget_on_a_terminal(db: Database, cov: str, *, answer: str) -> int:
    """`backend forget-coverage COV` with its stdin on a real pseudo-terminal; types ``answer``
    once the question is asked. Returns the exit code."""
    primary, secondary = pty.openpty()
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orphan_cleanup", "backend", "forget-coverage", cov],
                            env=environ, stdin=secondary, stdout=subprocess.PIPE, stderr=secondary, text=True)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 60
    while b"Type " not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1)
        if ready:
            seen += os.read(primary, 4096)
    assert b"Type " in seen, seen
    os.write(primary, answer.encode() + b"\n")
    code = proc.wait(timeout=60)
    os.close(primary)
    assert proc.stdout is not None
    proc.stdout.close()
    return code


# ---- GCP, on the fake Compute server ----------------------------------------------------

def test_gcp_a_removed_backends_leaked_vm_is_still_reported(gcp: FakeCompute, emptied_db: Database) -> None:
    db = emptied_db
    add_backend(db, "gcp-old", provider="gcp", account=gcp.project, regions=("us-central1",), mode="delete")
    ref = add_ref(db, issued_at=db_now(db) - timedelta(hours=1))  # the owner row hard-deleted
    gcp.add_instance("leaked-vm", zone="us-central1-a", labels={"provider_ref": ref})
    sql(db, "DELETE FROM backends WHERE id = 'gcp-old'")
    [[cov, origin, account, regions, mode, why]] = coverages(db)
    assert (origin, account, regions, mode, why) == ("gcp-old", gcp.project, ["us-central1"], "delete", "removed")
    pipeline = Pipeline(settings=Settings.explicit(margin_seconds=0, max_mode="report"), db=db,
                        provider_for=lambda b: build_gcp_provider(b, endpoint=gcp.url, timeout=5),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())

    report = run_cycle(pipeline, cov)

    [group] = report.c3()["groups"]
    assert (group["provider_ref"], group["verdict"], group["reason"], group["action"]) == \
        (ref, "orphan", "owner_deleted", "reported")
    assert report.c3()["mode"] == "report"
