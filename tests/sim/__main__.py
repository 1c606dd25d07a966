"""``python -m tests.sim --seeds N --steps M``: run the simulation and print a table.

Exit status 0 when no invariant was violated, 1 otherwise (the first
violations are printed with their seed and the last events before them).
"""

from __future__ import annotations

import argparse
import sys

from tests.sim.engine import SeedResult
from tests.sim.mutations import MUTATIONS
from tests.sim.run import run_many, sim_database, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="number of seeds (default 20)")
    parser.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--steps", type=int, default=50, help="steps per seed before the settle phase")
    parser.add_argument("--mutation", choices=sorted(MUTATIONS), help="disable one safety rule (expect violations)")
    parser.add_argument("--stop-on-violation", action="store_true")
    parser.add_argument("--ignore", default="", help="comma-separated invariants not to check (diagnostics)")
    parser.add_argument("--show", type=int, default=3, help="violations to print in full (default 3)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per seed on stderr")
    args = parser.parse_args(argv)

    def progress(r: SeedResult) -> None:
        if args.verbose or r.violations:
            mark = f"{len(r.violations)} VIOLATION(S) {sorted({v.invariant for v in r.violations})}" \
                if r.violations else r.outcome
            print(f"seed {r.seed}: {r.steps} steps, {r.cycles} cycles, {r.deleted} deleted,"
                  f" {r.work['shared_listings']} shared listings, {mark}",
                  file=sys.stderr, flush=True)

    mutation = MUTATIONS[args.mutation] if args.mutation else None
    with sim_database() as info:
        summary = run_many(info, range(args.start, args.start + args.seeds), args.steps, mutation=mutation,
                           stop_on_violation=args.stop_on_violation, progress=progress,
                           ignore=frozenset(filter(None, args.ignore.split(","))))
    for v in summary.violations[:args.show]:
        print(v, end="\n\n")
    print(table(summary))
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
