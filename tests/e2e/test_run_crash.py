"""A manual run that is interrupted, killed, frozen or cannot reach its account.

The CLI runs as a subprocess (`python -m orphan_cleanup`) against a real Postgres
and the fake Compute REST server, whose delay injection keeps a listing (or a
delete) in flight while the test signals the process. A manual run's lease is
short (ORPHAN_CLEANUP_LEASE_SECONDS) and renewed by its heartbeat: a live run
keeps its backend, a killed one frees it within one lease, and a run that lost
its lease applies nothing afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, gcp_labels
from orphan_cleanup.ledger.db import Database
from tests.support.gcp_fake import FakeCompute

BACKEND = "gcp-main"
PROJECT = "test-project"
ZONE, REGION = "us-central1-a", "us-central1"
LEASE = 2
LISTING = "/aggregated/instances"


def environment(db: Database, gcp: FakeCompute, lease: int = LEASE) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_GCP_ENDPOINT": gcp.url,
           "ORPHAN_CLEANUP_MARGIN_SECONDS": "0", "ORPHAN_CLEANUP_LEASE_SECONDS": str(lease), "NO_COLOR": "1"}
    env.pop("ORPHAN_CLEANUP_MODE", None)
    return env


def _interruptible() -> None:
    # In the child: Ctrl-C as at a shell prompt, even when the suite itself runs with SIGINT
    # ignored (a background job of a non-interactive shell passes SIG_IGN on to its children).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(db: Database, gcp: FakeCompute, *args: str, lease: int = LEASE) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "orphan_cleanup", "run", "--backend", BACKEND, *args],
                            env=environment(db, gcp, lease), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible)


def run(db: Database, gcp: FakeCompute, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", "run", "--backend", BACKEND, *args],
                          env=environment(db, gcp), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def poll(what: str, check: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def sql(db: Database, statement: str, **params: Any) -> list[list[Any]]:
    with db.connection() as conn:
        return conn.run(statement, **params)


def listing_started(db: Database) -> str:
    """The running cycle's id once it is listing (its listing time is stamped)."""
    rows = sql(db, "SELECT id FROM cycles WHERE listed_at IS NOT NULL AND outcome IS NULL")
    return rows[0][0] if rows else ""


def lease_expired(db: Database) -> bool:
    return bool(sql(db, "SELECT lease_expires_at <= oc_clock() FROM cleanup WHERE backend_id = :b", b=BACKEND)[0][0])


def lease_end(db: Database) -> Any:
    return sql(db, "SELECT lease_expires_at FROM cleanup WHERE backend_id = :b", b=BACKEND)[0][0]


def backend_free(db: Database) -> bool:
    return sql(db, "SELECT lease_owner FROM cleanup WHERE backend_id = :b", b=BACKEND) == [[None]]


def cycle(db: Database, cycle_id: str) -> tuple[str | None, str | None]:
    return tuple(sql(db, "SELECT outcome, error FROM cycles WHERE id = :c", c=cycle_id)[0])  # type: ignore[return-value]


@pytest.fixture
def leak(db: Database, gcp: FakeCompute) -> dict[str, Any]:
    """A backend with one orphan VM: its owner is terminated, the VM still runs."""
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions) VALUES (:i, 'gcp', :a, :r)",
                 i=BACKEND, a=PROJECT, r=[REGION])
    ledger = LedgerClient(db)
    issued = ledger.issue_ref(owner_name="leaked")
    vm = gcp.add_instance("leaked-vm", zone=ZONE, labels=gcp_labels(issued.provider_ref))
    ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=vm["id"], region=REGION,
                             status=OwnerStatus.BUSY)
    ledger.mark_terminated(issued.owner_id)
    return vm


@pytest.fixture
def arrived(gcp: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], bool]:
    """``arrived(method, path_part)``: whether such a request reached the fake (it records
    a call only once it has answered, after any injected delay)."""
    seen: list[tuple[str, str]] = []
    handle = gcp.handle

    def observed(method: str, path: str, query: dict[str, str], body: bytes = b"") -> Any:
        seen.append((method, path))
        return handle(method, path, query, body)

    monkeypatch.setattr(gcp, "handle", observed)
    return lambda method, part: any(m == method and part in p for m, p in list(seen))


def slow(gcp: FakeCompute, seconds: float, method: str, path: str = "") -> Callable[[], None]:
    """The next matching request answers after ``seconds``. Returns a wait for that
    answer: a test calls it before it ends, so that a request still sleeping in the fake
    cannot act on the next test's state."""
    gcp.add_fault(method=method, path_contains=path, status=None, delay=seconds, times=1)
    seen = gcp.count(method, path)
    return lambda: poll("the slow call to end", lambda: gcp.count(method, path) > seen, timeout=seconds + 5)


def interrupt(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """Ctrl-C (SIGINT); returns how long the run took to exit, and its stderr."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=10)
    return time.monotonic() - sent, stderr


def test_ctrl_c_while_listing_exits_at_once_and_the_backend_runs_again_right_away(db, gcp, leak, arrived):
    answered = slow(gcp, 3, "GET", LISTING)  # the listing call hangs
    proc = start(db, gcp, "--mode", "delete", "--yes")
    poll("the listing call", lambda: arrived("GET", LISTING))
    cycle_id = listing_started(db)

    took, stderr = interrupt(proc)

    assert took < 5 and gcp.count("GET", LISTING) == 0  # it did not wait for the call in flight
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert f"orphan-cleanup: interrupted: cycle {cycle_id} failed; nothing deleted" in stderr
    assert cycle(db, cycle_id) == ("failed", "interrupted")
    again = run(db, gcp, "--mode", "report", "--json")
    assert again.returncode == 0, again.stderr  # not busy: the interrupted run released its lease
    assert json.loads(again.stdout)["groups"][0]["verdict"] == "orphan"
    answered()
    assert gcp.count("DELETE") == 0


def test_ctrl_c_while_deleting_says_what_was_left_undone(db, gcp, leak, arrived):
    answered = slow(gcp, 3, "DELETE")  # the delete call hangs
    proc = start(db, gcp, "--mode", "delete", "--yes")
    poll("the delete call", lambda: arrived("DELETE", "/instances/"))
    assert sql(db, "SELECT count(*) FROM delete_gates")[0][0] == 1

    took, stderr = interrupt(proc)

    assert took < 5 and gcp.count("DELETE") == 0
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "interrupted: cycle" in stderr and "failed; 1 of 1 planned deletes not done" in stderr
    assert sql(db, "SELECT count(*) FROM delete_gates")[0][0] == 0  # the gate was released
    assert backend_free(db)  # a new run is not refused as busy
    answered()


def test_a_live_run_renews_its_lease_and_a_killed_one_frees_the_backend_within_it(db, gcp, leak, arrived):
    lease = 4  # longer than a CLI start under load: the refusal right after the kill must see it
    answered = slow(gcp, 6, "GET", LISTING)
    proc = start(db, gcp, "--mode", "report", lease=lease)
    poll("the listing call", lambda: arrived("GET", LISTING))
    cycle_id = listing_started(db)
    first = lease_end(db)
    poll("a renewal by the heartbeat", lambda: lease_end(db) > first, timeout=lease)

    proc.kill()  # kill -9, mid-listing, right after a renewal
    proc.communicate(timeout=10)

    refused = run(db, gcp, "--mode", "report")
    assert refused.returncode == 3, refused.stderr  # right away: the lease still holds
    assert "another cycle of this backend is running" in refused.stderr
    poll("the lease to expire", lambda: lease_expired(db), timeout=lease + 3)
    after = run(db, gcp, "--mode", "report", "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["outcome"] == "clean"
    assert cycle(db, cycle_id)[0] == "failed"
    answered()


def test_a_frozen_run_whose_lease_was_taken_over_applies_nothing(db, gcp, leak, arrived):
    slow(gcp, 1, "GET", LISTING)
    frozen = start(db, gcp, "--mode", "delete", "--yes")
    poll("the listing call", lambda: arrived("GET", LISTING))
    old = listing_started(db)
    frozen.send_signal(signal.SIGSTOP)  # its listing in flight, its heartbeat stopped with it
    try:
        poll("the lease to expire", lambda: lease_expired(db), timeout=LEASE + 3)
        taken = run(db, gcp, "--mode", "report", "--json")
        assert taken.returncode == 0, taken.stderr
        assert json.loads(taken.stdout)["groups"][0]["verdict"] == "orphan"  # a delete would delete it
    finally:
        frozen.send_signal(signal.SIGCONT)
    _, stderr = frozen.communicate(timeout=30)

    assert frozen.returncode == 1, stderr  # its cycle was failed when the lease was taken over
    assert cycle(db, old)[0] == "failed"
    assert gcp.count("DELETE") == 0 and gcp.get("instances", ZONE, "leaked-vm") is not None
    assert sql(db, "SELECT count(*) FROM delete_requests")[0][0] == 0
    assert sql(db, "SELECT count(*) FROM cycle_groups WHERE cycle_id = :c", c=old)[0][0] == 0


@pytest.mark.parametrize(("settings", "code", "why"), [
    ("{}", 1, "identity_check_failed: AccessDenied: sts:GetCallerIdentity in us-east-1: no usable AWS credentials"),
    ('{"role_arn": "arn:aws:iam::123456789012:role/cleanup"}', 1, "identity_check_failed"),
    ('{"role_arn": "not-an-arn"}', 2, "'not-an-arn' is not an IAM role ARN"),
], ids=["no-credentials", "role-without-credentials", "malformed-role-arn"])
def test_a_run_without_working_credentials_exits_non_zero_in_one_line(db, settings, code, why):
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " VALUES ('aws-none', 'aws', '123456789012', '{us-east-1}', CAST(:s AS jsonb))", s=settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no keys, no endpoint, no profile
    env.update(DATABASE_URL=db.info.url(), AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_CONFIG_FILE="/nonexistent", AWS_EC2_METADATA_DISABLED="true", NO_COLOR="1")

    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", "run", "--backend", "aws-none"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orphan-cleanup: error:")]
    assert len(errors) == 1 and why in errors[0], proc.stderr


def test_the_heartbeat_renews_only_a_live_cycle_and_only_a_gate_its_holder_still_holds(db):
    """The renewal the heartbeat runs, in-process on the real ledger (no provider involved)."""
    from datetime import timedelta

    from orphan_cleanup.core import policy
    from orphan_cleanup.core.settings import Settings
    from orphan_cleanup.cycle import cycle_state
    from orphan_cleanup.ledger.locked import GateHold
    from orphan_cleanup.ledger.store import LedgerStore

    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions) VALUES (:i, 'gcp', :a, :r)",
                 i=BACKEND, a=PROJECT, r=[REGION])
    store = LedgerStore(db)
    with store.session() as session:
        backend = session.backend(BACKEND)
    limits = policy.limits_for(Settings.explicit(cycle_deadline_seconds=LEASE), backend)
    old = cycle_state.start_cycle(store, BACKEND, "delete", limits, manual=True).cycle
    assert old is not None
    gate = GateHold(backend.scope, "abcdefabcdef", "holder-1", 600)
    assert store.acquire_gate(gate.scope, gate.ref, gate.holder, 60)

    def gate_left() -> float | None:
        rows = sql(db, "SELECT extract(epoch FROM expires_at - now()) FROM delete_gates")
        return float(rows[0][0]) if rows else None

    assert cycle_state.renew_lease(store, old.id, 300, gate=gate)
    assert 290 < (lease_end(db) - sql(db, "SELECT oc_clock()")[0][0]).total_seconds() <= 300
    assert 590 < (gate_left() or 0) <= 600  # renewed with the lease
    store.release_gate(gate.scope, gate.ref, gate.holder)
    assert cycle_state.renew_lease(store, old.id, 300, gate=gate)
    assert gate_left() is None  # a released gate is not taken again

    later = sql(db, "SELECT oc_clock()")[0][0] + timedelta(seconds=301)  # the old lease has run out by then
    new = cycle_state.start_cycle(store, BACKEND, "report", limits, manual=True, now=later).cycle
    assert new is not None and new.fence == old.fence + 1
    taken = lease_end(db)

    assert not cycle_state.renew_lease(store, old.id, 300)  # fenced: the old cycle renews nothing
    assert lease_end(db) == taken
    assert cycle(db, old.id) == ("failed", "cycle did not complete before its deadline")
