"""The Performance plot: listing calls and wall time against fleet size.

Drawn by ``python -m bench --only peers --plot docs/performance.png`` from the
sweep it just measured, or again from a results file without measuring::

    python -m bench.plot bench/results/latest.json docs/performance.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

LISTERS = (("product", "orphan-cleanup", "o-"), ("naive", "naive (aws-nuke style)", "s--"),
           ("custodian", "Cloud Custodian", "^:"))


def plot_sweep(rows: list[dict[str, Any]], path: Path) -> None:
    """Three panels from the sweep table's rows: API calls, wall time and reply data per
    listing (moto returns most kinds in one page, so the bytes show what filtering saves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (calls, wall, data) = plt.subplots(1, 3, figsize=(14, 4.2), constrained_layout=True)
    for key, label, style in LISTERS:
        mine = sorted((r for r in rows if r.get("lister") == key and r.get("wall ms") is not None),
                      key=lambda r: r["fleet resources"])
        if not mine:
            continue
        sizes = [r["fleet resources"] for r in mine]
        calls.plot(sizes, [r.get("median calls", r["calls"]) for r in mine], style, label=label)
        wall.plot(sizes, [r["wall ms"] for r in mine], style, label=label)
        data.plot(sizes, [r["reply KB"] for r in mine], style, label=label)
    for ax, ylabel in ((calls, "API calls per listing (median)"), (wall, "wall time per listing, ms (median)"),
                       (data, "reply data per listing, KB")):
        ax.set_xscale("log")
        ax.set_xlabel("resources in the account (moto, 20% tagged)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    calls.set_ylim(bottom=0)
    wall.set_yscale("log")
    data.set_yscale("log")
    calls.legend(loc="lower right")
    calls.set_title("calls (counted at a proxy in front of moto)")
    wall.set_title("wall time, same run, interleaved")
    data.set_title("reply bytes (at the proxy)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = json.loads(Path(argv[0]).read_text())
    tables = results["benchmarks"]["peers"]["tables"]
    sweep = next(t for t in tables if t["title"].startswith("Listing cost against fleet size"))
    plot_sweep(sweep["rows"], Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
