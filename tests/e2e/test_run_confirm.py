"""`orphan-cleanup run --mode delete`: consent before deletion (README, "Running it by hand").

On a terminal: the plan first, then the question. The CLI runs as a user runs it
(`python -m orphan_cleanup`, real Postgres, the moto server) with its stdin and stderr
on a real pseudo-terminal (`os.openpty`: isatty is true, nothing is mocked) and its
stdout on the same terminal or on a pipe (`run ... | tee log`). The test reads the
terminal's master side as the user's screen and types into it. Without a terminal,
a deleting run needs --yes and exits 2 before listing without it.
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
           "NO_COLOR": "1", "ORPHAN_CLEANUP_MAX_MODE": "delete"}  # a row may say delete (SAFETY.md rule 8)
    env.pop("ORPHAN_CLEANUP_MODE", None)
    return env


def _controlling_terminal() -> None:
    # In the child, after setsid: stdin (the pty) becomes its controlling terminal, so that
    # Ctrl-C typed on the terminal is a SIGINT to it, as in a shell; and SIGINT is not ignored
    # even when the suite runs with it ignored (a background job of a non-interactive shell).
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """The CLI with stdin and stderr on a pseudo-terminal (its controlling terminal), and
    stdout there too, or on a pipe (``stdout_piped``: ``run ... | tee log``)."""

    def __init__(self, db: Database, *args: str, env: dict[str, str] | None = None,
                 stdout_piped: bool = False) -> None:
        master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "orphan_cleanup", *args],
                                     env={**environment(db), **(env or {})}, stdin=slave,
                                     stdout=subprocess.PIPE if stdout_piped else slave, stderr=slave,
                                     start_new_session=True, preexec_fn=_controlling_terminal)
        os.close(slave)
        self.master = master
        self._screen, self._stdout = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._read, args=(master, self._screen), daemon=True)]
        if stdout_piped:
            self._readers.append(threading.Thread(target=self._read, args=(self.proc.stdout.fileno(), self._stdout),
                                                  daemon=True))
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
    def stdout(self) -> str:
        """What went to the pipe (``stdout_piped``)."""
        return self._stdout.decode(errors="replace")

    def expect(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.screen}"
            assert time.monotonic() < deadline, f"no {text!r} on the terminal:\n{self.screen}"
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
        assert "Traceback" not in self.screen, self.screen
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


def cycle_count(db: Database) -> int:
    with db.connection() as conn:
        return int(conn.run("SELECT count(*) FROM cycles")[0][0])


def no_terminal(db: Database, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as cron or ``ssh host cmd`` runs it: stdin, stdout and stderr are no terminal."""
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env={**environment(db), **env},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


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
    assert code == 0, term.screen
    assert "nothing deleted: the plan was not confirmed" in term.screen
    assert "deleted group" not in term.screen
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

    assert code == 0, term.screen
    assert f"deleted group 1/1: ref {leak.ref} us-east-1 {leak.instance_id}" in term.screen
    assert platform.instance_state(leak.instance_id) == "terminated"
    assert platform.instance_state(tracked.instance_id) == "running"
    assert cycle_row(db)["outcome"] == "clean"


@pytest.mark.parametrize("output", [[], ["--json"]], ids=["table", "json"])
def test_with_stdout_piped_the_run_still_asks_on_the_terminal_and_deletes_only_after_the_answer(db, platform, output):
    # `orphan-cleanup run --backend aws-prod --mode delete | tee log`, typed in a shell
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", *output, stdout_piped=True)
    term.expect(QUESTION)
    # the plan is on the terminal, not in the pipe, and nothing is deleted while the question waits
    assert len(plan_rows(term.screen)) == 1 and leak.instance_id in plan_rows(term.screen)[0], term.screen
    time.sleep(0.5)
    assert platform.instance_state(leak.instance_id) == "running"
    assert term.proc.poll() is None
    term.type(f"{BACKEND}\n")
    code = term.wait()

    assert code == 0, term.screen
    assert QUESTION not in term.stdout and "plan: delete" not in term.stdout
    assert platform.instance_state(leak.instance_id) == "terminated"
    if output:  # --json is an output format: one document in the pipe, after the same question
        doc = json.loads(term.stdout)
        assert [(g["primary_id"], g["action"]) for g in doc["groups"]] == [(leak.instance_id, "deleted")]
    else:
        assert re.search(rf"^{leak.ref}\s+us-east-1\s+{leak.instance_id}\s.*orphan\s+owner_terminated\s+deleted",
                         term.stdout, re.M), term.stdout


def test_yes_on_a_terminal_deletes_without_asking(db, platform):
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes")
    code = term.wait()

    assert code == 0, term.screen
    assert QUESTION not in term.screen and "plan: delete" not in term.screen
    assert f"deleted group 1/1: ref {leak.ref}" in term.screen
    assert platform.instance_state(leak.instance_id) == "terminated"


def test_a_plan_the_blast_radius_cap_blocks_asks_nothing(db, platform):
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", env={"ORPHAN_CLEANUP_MAX_DELETES": "0"})
    code = term.wait()

    assert code == 0, term.screen
    assert QUESTION not in term.screen
    assert "blast-radius cap: deleted nothing" in term.screen and "nothing to confirm" in term.screen
    assert platform.instance_state(leak.instance_id) == "running"


@pytest.mark.parametrize(("args", "mode", "env", "why"), [
    (["--mode", "delete"], None, {}, "--mode delete"),
    (["--mode", "delete", "--json"], None, {}, "--mode delete"),
    ([], "delete", {}, f"backend {BACKEND}'s mode is delete"),
    ([], None, {"ORPHAN_CLEANUP_MODE": "delete"}, "ORPHAN_CLEANUP_MODE=delete"),
], ids=["flag", "json-is-no-consent", "backend-mode", "global-mode"])
def test_without_a_terminal_a_deleting_run_without_yes_lists_nothing_deletes_nothing_and_exits_2(
        db, platform, args, mode, env, why):
    leak = platform.terminated_leak()
    settle(platform)
    if mode:
        with db.transaction() as conn:
            conn.run("UPDATE backends SET mode = :m WHERE id = :i", m=mode, i=BACKEND)

    proc = no_terminal(db, "run", "--backend", BACKEND, *args, **env)

    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--yes" in lines[0] and why in lines[0] and "Traceback" not in proc.stderr, lines
    assert "listing" not in proc.stderr
    assert cycle_count(db) == 0  # exited before listing: no cycle started
    assert platform.instance_state(leak.instance_id) == "running"


def test_without_a_terminal_yes_deletes_and_a_report_run_needs_no_consent(db, platform):
    leak = platform.terminated_leak()
    settle(platform)

    report = no_terminal(db, "run", "--backend", BACKEND)
    assert report.returncode == 0, report.stderr
    assert platform.instance_state(leak.instance_id) == "running"

    proc = no_terminal(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes")

    assert proc.returncode == 0, proc.stderr
    assert QUESTION not in proc.stdout + proc.stderr and "plan: delete" not in proc.stdout + proc.stderr
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

    assert code == 0, term.screen
    assert re.search(rf"skipped group \d/2: ref {back.ref} us-east-1 {back.instance_id}: it changed", term.screen)
    assert re.search(rf"deleted group \d/2: ref {gone.ref} us-east-1 {gone.instance_id}", term.screen)
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

    assert code == 130, term.screen
    assert "interrupted at the confirmation: nothing deleted" in term.screen
    assert platform.instance_state(leak.instance_id) == "running"
    assert cycle_row(db) == {"outcome": "unsettled", "clean_at": None}
    with db.connection() as conn:  # the backend is free at once: a new run is not refused as busy
        assert conn.run("SELECT lease_owner FROM cleanup WHERE backend_id = :b", b=BACKEND) == [[None]]


def test_an_unanswered_question_times_out_deletes_nothing_exits_2_and_frees_the_backend(db, platform):
    # README.md, "Consent before deletion": an abandoned prompt must not hold the backend's lease
    # (the heartbeat would renew it for as long as the question waits).
    leak = platform.terminated_leak()
    settle(platform)

    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", "--confirm-timeout", "2")
    term.expect(QUESTION)
    asked = time.monotonic()
    code = term.wait(timeout=30)

    assert code == 2, term.screen
    assert time.monotonic() - asked < 20, term.screen
    assert "no answer within 2s: nothing deleted" in term.screen, term.screen
    assert "deleted group" not in term.screen
    assert platform.instance_state(leak.instance_id) == "running"
    assert cycle_row(db) == {"outcome": "unsettled", "clean_at": None}
    with db.connection() as conn:
        assert conn.run("SELECT lease_owner FROM cleanup WHERE backend_id = :b", b=BACKEND) == [[None]]
    again = no_terminal(db, "run", "--backend", BACKEND)  # another run of the backend starts at once
    assert again.returncode == 0, again.stderr
    assert platform.instance_state(leak.instance_id) == "running"


def test_the_question_waits_ten_minutes_by_default_and_the_flag_is_documented():
    from orphan_cleanup.cli.app import build_parser

    args = build_parser().parse_args(["run", "--backend", BACKEND])
    assert args.confirm_timeout == 600
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["run", "--backend", BACKEND, "--confirm-timeout", bad])
        assert exit_.value.code == 2
    help_ = subprocess.run([sys.executable, "-m", "orphan_cleanup", "run", "--help"], capture_output=True,
                           text=True, timeout=60).stdout
    assert "--confirm-timeout" in help_ and "10 minutes" in help_
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    assert "--confirm-timeout" in readme


def test_a_run_honours_the_confirmation_window_its_plan_shows_what_is_marked_and_when_it_goes(db, platform):
    """Mark, then sweep (docs/SAFETY.md rule 23) in a manual run: the first run finds the leak
    and marks it (nothing to confirm); a run past the window plans its deletion, and shows the
    leak found since as marked, with its time; the answer deletes only the planned one."""
    window = {"ORPHAN_CLEANUP_CONFIRM_SECONDS": "3"}
    first = platform.terminated_leak()
    settle(platform)
    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", env=window)
    assert term.wait() == 0, term.screen
    assert QUESTION not in term.screen
    assert "1 orphan group(s) marked, not deleted by this run: the first goes after" in term.screen
    assert re.search(rf"{first.instance_id}.*orphan\s+owner_terminated\s+marked\s+deleted after ", term.screen)
    assert platform.instance_state(first.instance_id) == "running"
    assert cycle_row(db)["outcome"] == "unsettled"

    time.sleep(3.2)
    second = platform.terminated_leak()
    settle(platform)
    term = Terminal(db, "run", "--backend", BACKEND, "--mode", "delete", env=window)
    term.expect(QUESTION)
    [row] = plan_rows(term.screen.partition("1 orphan group(s) marked")[0])
    assert first.instance_id in row
    assert re.search(rf"{second.ref}\s+us-east-1\s+.*{second.instance_id}.*owner_terminated\s+\S+ \S+Z \(in ",
                     term.screen)
    term.type(f"{BACKEND}\n")
    assert term.wait() == 0, term.screen
    assert platform.instance_state(first.instance_id) == "terminated"
    assert platform.instance_state(second.instance_id) == "running"
