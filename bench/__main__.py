"""``python -m bench``: run the benchmarks, print their tables, write JSON.

    python -m bench                      # everything (~10 min on 2 cores)
    python -m bench --quick              # no 1M-ref ledger, no 100k-group scale run
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCHES = ("classifier", "listing", "scale", "idle", "tick", "profile", "imports")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fast subset: no 1M-ref ledger, no 100k-group scale run")
    p.add_argument("--only", default=",".join(BENCHES),
                   help=f"comma-separated subset of {','.join(BENCHES)} (default: all)")
    p.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write results (default {DEFAULT_JSON})")
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
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:], "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "benchmarks": {},
    }
    for name in BENCHES:
        if name not in args.only:
            continue
        print(f"-- running {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        tables: list[Table] = _run(name, args.quick, pg)
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


def _run(name: str, quick: bool, pg: Any) -> list[Any]:
    if name == "classifier":
        from bench import classifier

        cfg = classifier.Config()
        if quick:
            cfg.ledgers = (10_000, 100_000)
            cfg.reps = {1_000: 7, 10_000: 3}
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

        return tick.run(pg(), sizes=(1, 5, 20) if quick else (1, 5, 20, 50))
    if name == "profile":
        from bench import profile

        return profile.run(pg(), quick=quick)
    if name == "imports":
        from bench import imports

        return imports.run(runs=3 if quick else 5)
    raise AssertionError(name)


if __name__ == "__main__":
    sys.exit(main())
