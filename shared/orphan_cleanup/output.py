"""Human output: plain tables when piped, with color on a terminal.

Color follows the usual conventions: only when the stream is a terminal, never
with ``NO_COLOR`` set (any value) or ``TERM=dumb``; ``FORCE_COLOR`` (non-empty)
turns it on even when piped. Streams default to the *current* ``sys.stdout``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

COLORS = {"orphan": "31", "protected": "33", "skipped": "35", "tracked": "32", "ignored": "90",
          "clean": "32", "unsettled": "33", "failed": "31"}
_ANSI = re.compile(r"\033\[[0-9;]*m")


def use_color(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def verdict_style(verdict: str, stream: TextIO | None = None) -> str:
    """A verdict or outcome word, colored when ``stream`` shows color."""
    if verdict in COLORS and use_color(stream):
        return f"\033[{COLORS[verdict]}m{verdict}\033[0m"
    return verdict


def _visible_len(s: str) -> int:
    return len(_ANSI.sub("", s))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], stream: TextIO | None = None,
                indent: int = 0) -> None:
    """Left-aligned columns two spaces apart; a bold header on a terminal;
    ``(none)`` when there are no rows."""
    stream = stream or sys.stdout
    pad = " " * indent
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], _visible_len(str(cell)))

    def line(cells: Sequence[str]) -> str:
        padded = (str(c) + " " * (w - _visible_len(str(c))) for c, w in zip(cells, widths, strict=False))
        return (pad + "  ".join(padded)).rstrip()

    head = line(headers)
    print(f"{pad}\033[1m{head[indent:]}\033[0m" if use_color(stream) else head, file=stream)
    for row in rows:
        print(line(row), file=stream)
    if not rows:
        print(f"{pad}(none)", file=stream)


def human_time(value: str | datetime | None, now: datetime | None = None, *, never: str = "never") -> str:
    """``2024-05-01 12:00:05Z (3m ago)`` / ``(in 14m)``: second precision and
    a relative hint; ``never`` for a missing value."""
    if value is None:
        return never
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    delta = round(((now or datetime.now(UTC)) - when).total_seconds())
    return f"{when:%Y-%m-%d %H:%M:%S}Z ({_span(delta)} ago)" if delta >= 0 else \
        f"{when:%Y-%m-%d %H:%M:%S}Z (in {_span(-delta)})"


def _span(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
