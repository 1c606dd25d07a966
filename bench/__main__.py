"""``python -m bench``: run the benchmarks, print their tables, write JSON.

    python -m bench                      # everything (~19 min on 2 cores; platform alone ~6)
    python -m bench --quick              # smaller sizes, fewer repetitions (~6 min on 2 cores)
    python -m bench --only fleet,platform,memory          # the database's load at fleet scale (~9 min)
    python -m bench --only fleet,platform,memory --quick  # the same, smaller (~2.5 min)
    python -m bench --only classifier,idle --json out.json

Each figure is measured in the same run as its baseline; compare ratios, not
absolute times, across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCHES = ("classifier", "listing", "scale", "idle", "tick", "profile", "imports", "peers", "throttling", "report",
           "platform", "fleet", "memory")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="fast subset (~3 min): no 1M-ref ledger, no 100k-group scale run, smaller "
                   "classifier, tick, peers and throttling runs")
    p.add_argument("--only", default=",".join(BENCHES),
                   help=f"comma-separated subset of {','.join(BENCHES)} (default: all)")
    p.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write results (default {DEFAULT_JSON})")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="peers: also draw the fleet-size plot there (docs/performance.png); never by default")
    args = p.parse_args(argv)
    args.only = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = sorted(set(args.only) - set(BENCHES))
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {','.join(BENCHES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.common import PgServer, Table

    started = time.perf_counter()
    server: PgServer | None = None

    def pg() -> PgServer:
        nonlocal server
        if server is None:
            server = PgServer()
        return server

    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:], "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "benchmarks": {},
    }
    for name in BENCHES:
        if name not in args.only:
            continue
        print(f"-- running {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        tables: list[Table] = _run(name, args.quick, pg, args.plot)
        elapsed = time.perf_counter() - t0
        for t in tables:
            print(t.render(), flush=True)
            print(flush=True)
        results["benchmarks"][name] = {"seconds": round(elapsed, 1), "tables": [t.as_json() for t in tables]}
    results["seconds"] = round(time.perf_counter() - started, 1)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"total {results['seconds']:.0f} s; results written to {out}", flush=True)
    return 0


def _run(name: str, quick: bool, pg: Any, plot: str | None = None) -> list[Any]:
    if name == "classifier":
        from bench import classifier

        cfg = classifier.Config()
        if quick:
            # The 10k and 100k ledgers of the figure, its 10k-group batch and the queue-message one;
            # the 1,000-group batch, the 1M-ref ledger and the floor by join shape only in the full run.
            cfg.ledgers = (10_000, 100_000)
            cfg.batch_sizes = (10_000,)
            cfg.reps = {10_000: 3}
            cfg.floor_variants = False  # the floor-by-shape table too
        return classifier.run(pg(), cfg)
    if name == "listing":
        from bench import listing

        return listing.run(quick=quick)
    if name == "scale":
        from bench import scale

        return scale.run(pg(), quick=quick)
    if name == "idle":
        from bench import idle

        return idle.run(pg())
    if name == "tick":
        from bench import tick

        if quick:  # the 10,000-backend figure at 2,000: the statement count does not change with it
            return tick.run(pg(), sizes=(1, 20), scale_backends=2_000)
        return tick.run(pg(), sizes=(1, 5, 20, 50))
    if name == "profile":
        from bench import profile

        return profile.run(pg(), quick=quick)
    if name == "imports":
        from bench import imports

        return imports.run(runs=3 if quick else 5)
    if name == "peers":
        from bench import peers

        return peers.run(quick=quick, plot=plot)
    if name == "throttling":
        from bench import throttling

        return throttling.run(pg(), quick=quick)
    if name == "report":
        from bench import report

        return report.run(pg(), quick=quick)
    if name == "platform":
        from bench import platform as platform_writes  # not the stdlib module main() reads

        return platform_writes.run(pg(), quick=quick)
    if name == "fleet":
        from bench import fleet

        return fleet.run(pg(), quick=quick)
    if name == "memory":
        from bench import memory

        return memory.run(pg(), quick=quick)
    raise AssertionError(name)


if __name__ == "__main__":
    sys.exit(main())
