"""Human output: plain tables when piped, with color on a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

COLORS = {"orphan": "31", "protected": "33", "skipped": "35", "tracked": "32", "ignored": "90"}


def use_color(stream=sys.stdout) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def verdict_style(verdict: str, stream=sys.stdout) -> str:
    if use_color(stream) and verdict in COLORS:
        return f"\033[{COLORS[verdict]}m{verdict}\033[0m"
    return verdict


def _visible_len(s: str) -> int:
    import re

    return len(re.sub(r"\033\[[0-9;]*m", "", s))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], stream=sys.stdout) -> None:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], _visible_len(str(cell)))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c) + " " * (w - _visible_len(str(c))) for c, w in zip(cells, widths)).rstrip()

    head = line(headers)
    print(f"\033[1m{head}\033[0m" if use_color(stream) else head, file=stream)
    for row in rows:
        print(line(row), file=stream)
    if not rows:
        print("(none)", file=stream)
