"""`orphan-cleanup run --mode delete` on a terminal: the plan first, then the question.

The CLI runs as a user runs it (`python -m orphan_cleanup`, real Postgres, the moto
server) with its stdin and stdout on a real pseudo-terminal (`os.openpty`: isatty is
true, nothing is mocked) and stderr on a pipe. The test reads the terminal's master
side as the user's screen and types into it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import termios
import threading
import time
from typing import Any

import pytest

from orphan_cleanup.ledger.db import Database
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-prod"
MARGIN = 0  # the owners' history is moved an hour back; moto stamps creation times in whole seconds, before listing
QUESTION = f"Type the backend id ({BACKEND})"

pytestmark = pytest.mark.usefixtures("moto_reset")


def environment(db: Database) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
           "NO_COLOR": "1"}
    env.pop("ORPHAN_CLEANUP_MODE", None)
    return env


def _controlling_terminal() -> None:
    # In the child, after setsid: stdin (the pty) becomes its controlling terminal, so that
    # Ctrl-C typed on the terminal is a SIGINT to it, as in a shell; and SIGINT is not ignored
    # even when the suite runs with it ignored (a background job of a non-interactive shell).
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """The CLI with stdin and stdout on a pseudo-terminal (its controlling terminal),
    stderr on a pipe."""

    def __init__(self, db: Database, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "orphan_cleanup", *args],
                                     env={**environment(db), **(env or {})}, stdin=slave, stdout=slave,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_controlling_terminal)
        os.close(slave)
        self.master = master
        self._screen, self._stderr = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._read, args=(master, self._screen), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr.fileno(), self._stderr),
                                          daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(fd: int, into: bytearray) -> None:
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's last user closed it
                return
            if not chunk:
                return
            into.extend(chunk)

    @property
    def screen(self) -> str:
        return self._screen.decode(errors="replace").replace("\r\n", "\n")

    @property
    def stderr(self) -> str:
        return self._stderr.decode(errors="replace")

    def expect(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.screen}\n{self.stderr}"
            assert time.monotonic() < deadline, f"no {text!r} on the terminal:\n{self.screen}\n{self.stderr}"
            time.sleep(0.02)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait(self, timeout: float = 30) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        for reader in self._readers:
            reader.join(timeout=5)
        os.close(self.master)
        assert "Traceback" not in self.stderr, self.stderr
        return code


def add_backend(db: Database) -> None:
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " VALUES (:i, 'aws', '123456789012', '{us-east-1}', '{}')", i=BACKEND)


@pytest.fixture
def platform(db: Database) -> MotoPlatform:
    add_backend(db)
    return MotoPlatform(db, BACKEND)


def settle(platform: MotoPlatform) -> None:
    platform.age_ledger()


def cycle_row(db: Database) -> dict[str, Any]:
    with db.connection() as conn:
        outcome, clean_at = conn.run("SELECT c.outcome, cl.clean_at FROM cycles c JOIN cleanup cl"
                                     " ON cl.backend_id = c.backend_id ORDER BY c.started_at DESC LIMIT 1")[0]
    return {"outcome": outcome, "clean_at": clean_at}


def plan_rows(screen: str) -> list[str]:
    """The plan's table rows (between its header and the question)."""
    head, _, _ = screen.partition(QUESTION)
    _, _, table = head.partition("plan: delete ")
    return [line for line in table.splitlines()[2:] if line.strip()]


@pytest.mark.parametrize("answer", ["aws-pro\n", "\x04"], ids=["wrong-id", "end-of-input"])
def test_the_plan_is_shown_and_anything_but_the_backend_id_deletes_nothing(db, platform, answer):
    leak = platform.terminated_leak()
    tracked = platform.tracked()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete")
    term.expect(QUESTION)
    rows = plan_rows(term.screen)
    term.type(answer)
    code = term.wait()

    assert len(rows) == 1, term.screen
    assert rows[0].split()[:2] == [leak.ref, "us-east-1"] and leak.instance_id in rows[0]
    assert leak.owner_id in rows[0] and "owner_terminated" in rows[0]
    assert re.search(r"owner terminated 1h ago; created \d+s ago", rows[0]), rows[0]
    assert tracked.instance_id not in term.screen.partition(QUESTION)[0]
    assert code == 0, term.stderr
    assert "nothing deleted" in term.screen and "nothing deleted" in term.stderr
    assert "deleted group" not in term.stderr
    assert platform.instance_state(leak.instance_id) == "running"
    assert platform.instance_state(tracked.instance_id) == "running"
    assert cycle_row(db) == {"outcome": "unsettled", "clean_at": None}  # declined: clean_at does not move


def test_typing_the_backend_id_deletes_exactly_the_planned_group(db, platform):
    leak = platform.terminated_leak()
    tracked = platform.tracked()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete")
    term.expect(QUESTION)
    term.type(f"{BACKEND}\n")
    code = term.wait()

    assert code == 0, term.stderr
    assert f"deleted group 1/1: ref {leak.ref} us-east-1 {leak.instance_id}" in term.stderr
    assert platform.instance_state(leak.instance_id) == "terminated"
    assert platform.instance_state(tracked.instance_id) == "running"
    assert cycle_row(db)["outcome"] == "clean"


@pytest.mark.parametrize("flag", ["--yes", "--json"])
def test_yes_or_json_on_a_terminal_deletes_without_asking(db, platform, flag):
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", flag)
    code = term.wait()

    assert code == 0, term.stderr
    assert QUESTION not in term.screen and "plan: delete" not in term.screen
    if flag == "--json":  # one document on the terminal; no progress on the (piped) stderr
        assert json.loads(term.screen)["groups"][0]["action"] == "deleted"
    else:
        assert f"deleted group 1/1: ref {leak.ref}" in term.stderr
    assert platform.instance_state(leak.instance_id) == "terminated"


def test_a_plan_the_blast_radius_cap_blocks_asks_nothing(db, platform):
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", env={"ORPHAN_CLEANUP_MAX_DELETES": "0"})
    code = term.wait()

    assert code == 0, term.stderr
    assert QUESTION not in term.screen
    assert "blast-radius cap: deleted nothing" in term.stderr and "nothing to confirm" in term.stderr
    assert "blast-radius cap: deleted nothing" in term.screen
    assert platform.instance_state(leak.instance_id) == "running"


def test_without_a_terminal_the_run_deletes_without_asking(db, platform):
    leak = platform.terminated_leak()
    settle(platform)

    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", "run", "--backend", BACKEND, "--mode", "delete"],
                          env=environment(db), stdin=subprocess.PIPE, capture_output=True, text=True, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert QUESTION not in proc.stdout and "plan: delete" not in proc.stdout
    assert f"deleted group 1/1: ref {leak.ref} us-east-1 {leak.instance_id}" in proc.stderr
    assert platform.instance_state(leak.instance_id) == "terminated"


def test_a_group_whose_owner_is_tracked_again_while_the_question_waits_is_skipped_and_said(db, platform):
    back = platform.terminated_leak()
    gone = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete")
    term.expect(QUESTION)
    assert len(plan_rows(term.screen)) == 2, term.screen
    with db.transaction() as conn:  # the platform brings the owner back while the operator reads the plan
        conn.run("UPDATE instances SET status = 'busy', terminated_at = NULL WHERE id = :i", i=back.owner_id)
    term.type(f"{BACKEND}\n")
    code = term.wait()

    assert code == 0, term.stderr
    assert re.search(rf"skipped group \d/2: ref {back.ref} us-east-1 {back.instance_id}: it changed", term.stderr)
    assert re.search(rf"deleted group \d/2: ref {gone.ref} us-east-1 {gone.instance_id}", term.stderr)
    assert platform.instance_state(back.instance_id) == "running"
    assert platform.instance_state(gone.instance_id) == "terminated"
    assert cycle_row(db)["outcome"] == "unsettled"


def test_ctrl_c_at_the_question_deletes_nothing_and_frees_the_backend(db, platform):
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete")
    term.expect(QUESTION)
    term.type("\x03")  # Ctrl-C: the terminal sends SIGINT
    code = term.wait(timeout=5)

    assert code == 130, term.stderr
    assert "interrupted at the confirmation: nothing deleted" in term.stderr
    assert platform.instance_state(leak.instance_id) == "running"
    assert cycle_row(db) == {"outcome": "unsettled", "clean_at": None}
    with db.connection() as conn:  # the backend is free at once: a new run is not refused as busy
        assert conn.run("SELECT lease_owner FROM cleanup WHERE backend_id = :b", b=BACKEND) == [[None]]
