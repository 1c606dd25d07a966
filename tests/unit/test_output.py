"""Human output: color only on a terminal (NO_COLOR / FORCE_COLOR honoured),
columns aligned on the visible width."""

from __future__ import annotations

import io

from orphan_cleanup.cli.output import print_table, use_color, verdict_style


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_piped_output_is_plain(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    out = io.StringIO()
    print_table(["vm", "verdict"], [["a", verdict_style("orphan", out)]], stream=out)
    assert out.getvalue() == "vm  verdict\na   orphan\n"


def test_terminal_gets_color_aligned_on_visible_width(monkeypatch):
    for var in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(var, raising=False)
    out = Tty()
    print_table(["verdict", "x"], [[verdict_style("orphan", out), "1"], ["tracked", "2"]], stream=out, indent=2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  \033[1mverdict  x\033[0m"
    assert lines[1] == "  \033[31morphan\033[0m   1"
    assert lines[2] == "  tracked  2"


def test_no_color_and_force_color(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "")
    assert not use_color(Tty())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert use_color(io.StringIO())


def test_default_stream_is_the_current_stdout(capsys, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    print_table(["a"], [])
    assert capsys.readouterr().out == "a\n(none)\n"


def test_human_time_is_second_precision_with_a_relative_hint():
    from datetime import datetime, timezone

    from orphan_cleanup.cli.output import human_time

    now = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert human_time("2024-05-01T11:57:00.123+00:00", now) == "2024-05-01 11:57:00Z (3m ago)"
    assert human_time(datetime(2024, 5, 1, 14, 0, tzinfo=timezone.utc), now) == "2024-05-01 14:00:00Z (in 2h)"
    assert human_time(None, now) == "never" and human_time(None, now, never="-") == "-"
