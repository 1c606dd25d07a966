"""`orphan-cleanup demo` on a terminal (README.md, "See it work"): the narrative and its tables
only; the cycles' log lines (a WARNING per protected group, the stuck-pending ERROR) go to a
file the demo names, or with --verbose to the terminal; and the demo says that the
stuck-pending ERROR is expected. Its stdout and stderr are a real pseudo-terminal
(`os.openpty`), as when a new user types the command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

LOG_LINE = re.compile(r"^(WARNING|ERROR) ", re.M)
STUCK = "pending owner's resources look stuck"


def on_a_terminal(*args: str, cwd: Path) -> str:
    """Runs the demo with stdout and stderr on a pty; returns the screen."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "FORCE_COLOR") and not k.startswith("AWS_")}
    env["NO_COLOR"] = "1"
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "orphan_cleanup", "demo", *args], env=env, cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=5)
    os.close(master)
    text = screen.decode(errors="replace").replace("\r\n", "\n")
    assert code == 0, text
    return text


def test_on_a_terminal_the_log_lines_go_to_a_named_file_and_the_stuck_line_is_said_to_be_expected(tmp_path):
    screen = on_a_terminal(cwd=tmp_path)

    assert "self-check: ok" in screen
    assert not LOG_LINE.search(screen), LOG_LINE.findall(screen)
    assert all(len(line) < 200 for line in screen.splitlines()), max(screen.splitlines(), key=len)
    named = re.search(r"log lines .* in (\S+\.log)", screen)
    assert named, screen
    log = Path(named[1]).read_text()
    try:
        assert STUCK in log and "WARNING protected resource group" in log, log
        assert re.search(rf"{STUCK}.*expected", screen) or re.search(rf"expected.*{STUCK}", screen), screen
    finally:
        Path(named[1]).unlink()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a second whole demo on a pty (~22 s); the default run keeps the terminal case
def test_verbose_shows_the_log_lines_on_the_terminal(tmp_path):
    screen = on_a_terminal("--verbose", cwd=tmp_path)

    assert "self-check: ok" in screen
    assert re.search(rf"^ERROR {STUCK}", screen, re.M), screen
    assert re.search(rf"{STUCK}.*expected", screen) or re.search(rf"expected.*{STUCK}", screen), screen
    assert ".log" not in screen
