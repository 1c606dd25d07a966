"""``report --html FILE``: one self-contained page (no network: no script, font, image or
style from anywhere else) with the report's figures, its two breakdowns, the reason legend
and a stacked-bar chart per day and reason, drawn here as inline SVG: the orphans alive each
day and, with a price table, what they cost that day. Every value is escaped
(``html.escape``): reasons and backend ids are text the platform wrote. Written atomically
(a temporary file beside it, then a rename)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from orphan_cleanup.cli.report_figures import Priced, duration, hours_text, legend, money
from orphan_cleanup.ledger.leaks import Hours

#: Bar colors, one per reason in the order the legend lists them (then again).
PALETTE = ("#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_W, _H, _LEFT, _BOTTOM, _TOP = 760, 220, 56, 28, 12

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}
td.n{text-align:right}.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.4em;vertical-align:middle}
svg text{font-size:11px;fill:#555}"""


def _cells(values: Sequence[str], tag: str = "td") -> str:
    return "".join(f'<{tag}{" class=n" if tag == "td" and i else ""}>{escape(v)}</{tag}>'
                   for i, v in enumerate(values))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    body = "".join(f"<tr>{_cells(r)}</tr>" for r in rows)
    return f"<table><tr>{_cells(headers, 'th')}</tr>{body}</table>"


def chart(title: str, chart_id: str, days: Sequence[datetime], reasons: Sequence[str],
          values: dict[tuple[datetime, str], float], fmt: Callable[[float], str]) -> str:
    """A stacked bar per day, one ``<rect>`` per day and reason with a value above 0 (its
    ``<title>`` the day, the reason and the value); the reasons stacked in ``reasons``' order."""
    plot_w, plot_h = _W - _LEFT - 8, _H - _TOP - _BOTTOM
    top = max((sum(values.get((d, r), 0.0) for r in reasons) for d in days), default=0.0) or 1.0
    slot = plot_w / max(len(days), 1)
    bar = max(slot * 0.8, 1.0)
    parts = [f'<svg id="{escape(chart_id)}" width="{_W}" height="{_H}"'
             f' viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">',
             f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_W - 8}" y2="{_TOP + plot_h}" stroke="#999"/>',
             f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" stroke="#999"/>',
             f'<text x="{_LEFT - 4}" y="{_TOP + 8}" text-anchor="end">{escape(fmt(top))}</text>',
             f'<text x="{_LEFT - 4}" y="{_TOP + plot_h}" text-anchor="end">0</text>']
    every = max(1, len(days) // 8)
    for i, day in enumerate(days):
        x = _LEFT + i * slot + (slot - bar) / 2
        y = float(_TOP + plot_h)
        for j, reason in enumerate(reasons):
            v = values.get((day, reason), 0.0)
            if v <= 0:
                continue
            h = v / top * plot_h
            y -= h
            tip = f"{day:%Y-%m-%d} {reason}: {fmt(v)}"
            parts.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{bar:.2f}" height="{h:.2f}"'
                         f' fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(tip)}</title></rect>')
        if i % every == 0:
            parts.append(f'<text x="{x + bar / 2:.2f}" y="{_H - 10}" text-anchor="middle">'
                         f'{escape(f"{day:%m-%d}")}</text>')
    parts.append("</svg>")
    return "".join(parts)


def page(doc: dict[str, Any], days: Sequence[Hours], priced: Priced, *, backend: str | None,
         since_text: str) -> str:
    """The whole page, as text."""
    reasons = [r["reason"] for r in doc["by_reason"]]
    for h in days:  # a reason alive on a day of the chart is always in by_reason; kept safe regardless
        if h.reason not in reasons:
            reasons.append(h.reason)
    day_list = sorted({h.day for h in days if h.day is not None})
    alive: dict[tuple[datetime, str], float] = {}
    by_cell: dict[tuple[datetime, str], list[Hours]] = {}
    for h in days:
        assert h.day is not None
        alive[(h.day, h.reason)] = alive.get((h.day, h.reason), 0.0) + h.orphans
        by_cell.setdefault((h.day, h.reason), []).append(h)
    scope = f"backend {backend}" if backend else "every backend"
    title = f"orphan-cleanup report: {scope}, {since_text}"
    d, x = doc["time_to_detect_seconds"], doc["time_to_delete_seconds"]
    figures = [("period", f"{doc['since'][:16].replace('T', ' ')} to {doc['until'][:16].replace('T', ' ')} UTC"),
               ("orphans found", str(doc["orphans_found"])), ("orphans deleted", str(doc["orphans_deleted"])),
               ("orphans open now", str(doc["orphans_open"])), ("orphan-hours", hours_text(doc["orphan_hours"])),
               ("estimated cost", "no price table (settings.prices)" if doc["cost"] is None else money(doc["cost"])),
               ("time to detect (p50, p90)", f"{duration(d['p50'])}, {duration(d['p90'])}"),
               ("time to delete (p50, p90)", f"{duration(x['p50'])}, {duration(x['p90'])}")]
    swatches = "".join(f'<li><span class="swatch" style="background:{PALETTE[i % len(PALETTE)]}"></span>'
                       f"<b>{escape(r)}</b>: {escape(cause)}</li>" for i, (r, cause) in enumerate(legend(reasons)))
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>{escape(title)}</h1>",
             _table(["figure", "value"], figures),
             "<h2>Orphans alive per day, by reason</h2>",
             chart("orphans alive per day", "orphans-chart", day_list, reasons, alive, lambda v: f"{v:g}")]
    if doc["cost"] is not None:
        cost = {cell: priced.cost(hs) or 0.0 for cell, hs in by_cell.items()}
        parts += ["<h2>Cost accrued per day, by reason</h2>",
                  chart("cost per day", "cost-chart", day_list, reasons, cost, money)]
    parts += [f"<ul>{swatches}</ul>",
              "<h2>By reason</h2>",
              _table(["reason", "orphans", "orphan-hours", "cost"],
                     [[r["reason"], str(r["count"]), hours_text(r["orphan_hours"]), money(r["cost"])]
                      for r in doc["by_reason"]]),
              "<h2>By backend</h2>",
              _table(["backend", "orphans", "orphan-hours", "cost"],
                     [[r["backend"], str(r["count"]), hours_text(r["orphan_hours"]), money(r["cost"])]
                      for r in doc["by_backend"]]),
              "<p>Days are UTC. An orphan's hours run from when it became one (its owner's end, else its"
              " creation) to its deletion, or now; costs are the listed size at the backends' own prices.</p>",
              "</body></html>\n"]
    return "".join(parts)


def write_page(path: str, doc: dict[str, Any], days: Sequence[Hours], priced: Priced, *,
               backend: str | None, since_text: str) -> None:
    """Write the page to ``path`` atomically: a reader sees the old file or the whole new one."""
    target = Path(path)
    text = page(doc, days, priced, backend=backend, since_text=since_text)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
