"""Run many seeds and summarize them in a table (``python -m tests.sim``)."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.ledger.embedded import ensure_database, start_embedded
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.ledger.url import ConnInfo, parse_database_url
from tests.sim.engine import SeedResult, SimEnv, run_seed
from tests.sim.invariants import Violation


@dataclass
class Summary:
    seeds: int = 0
    steps: int = 0
    faults: Counter = field(default_factory=Counter)
    checks: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    crashes: Counter = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    cycles: int = 0
    deleted: int = 0
    work: Counter = field(default_factory=Counter)
    wall: float = 0.0

    def add(self, r: SeedResult) -> None:
        self.seeds += 1
        self.steps += r.steps
        self.faults.update(r.faults)
        self.checks.update(r.checks)
        self.outcomes[r.outcome] += 1
        self.crashes.update(r.crashes)
        self.violations.extend(r.violations)
        self.cycles += r.cycles
        self.deleted += r.deleted
        self.work.update(r.work)


@contextmanager
def sim_database() -> Iterator[ConnInfo]:
    """A new database for the run: on the server of ``DATABASE_URL`` when set
    (never the database it names), else on an embedded Postgres in a temp dir."""
    url = os.environ.get("DATABASE_URL")
    if url:
        server = parse_database_url(url)
    else:
        runtime = tempfile.mkdtemp(prefix="oc-sim-xdg-")
        os.chmod(runtime, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = runtime
        server = start_embedded(tempfile.mkdtemp(prefix="oc-sim-pg-"), cleanup="delete")
    name = f"oc_sim_{uuid.uuid4().hex[:10]}"
    info = ensure_database(server, name)
    migrate(Database(info))
    try:
        yield info
    finally:
        admin = connect(server.with_database("postgres"))
        try:
            admin.run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            admin.close()


def run_many(info: ConnInfo, seeds: Iterable[int], steps: int, *, mutation: Any = None,
             stop_on_violation: bool = False, progress: Callable[[SeedResult], None] | None = None,
             **kw: Any) -> Summary:
    summary = Summary()
    started = time.monotonic()
    env = SimEnv.open(info)
    try:
        with (mutation.applied(env) if mutation is not None else nullcontext(kw)) as extra:
            for seed in seeds:
                result = run_seed(env, seed, steps, **{**kw, **(extra or {})})
                summary.add(result)
                if progress is not None:
                    progress(result)
                if stop_on_violation and result.violations:
                    break
    finally:
        env.close()
    summary.wall = time.monotonic() - started
    return summary


def table(s: Summary) -> str:
    lines = [
        "orphan-cleanup simulation",
        f"  seeds                {s.seeds}",
        f"  steps                {s.steps}",
        f"  cycles started       {s.cycles}",
        f"  resources deleted    {s.deleted}",
        f"  lister runs          {s.work['direct_lister_runs']} direct, {s.work['ticks']} ticks,"
        f" {s.work['listing_jobs']} listing jobs",
        f"  shared listings      {s.work['shared_listings']} (feeding {s.work['cycles_fed_by_shared_listing']}"
        " cycles)",
        f"  wall time            {s.wall:.1f} s",
        "",
        f"  faults injected      {sum(s.faults.values())}",
    ]
    lines += [f"    {k:<26}{v:>8}" for k, v in sorted(s.faults.items())]
    lines += ["", f"  invariant checks     {sum(s.checks.values())}"]
    lines += [f"    {k:<26}{v:>8}" for k, v in sorted(s.checks.items())]
    lines += ["", "  end of run (L1)"]
    lines += [f"    {k:<26}{v:>8}" for k, v in sorted(s.outcomes.items())]
    if s.crashes:
        lines += ["", "  function crashes (redelivered)"]
        lines += [f"    {k:<40}{v:>8}" for k, v in sorted(s.crashes.items())]
    lines += ["", f"  violations           {len(s.violations)}"]
    by_kind = Counter(v.invariant for v in s.violations)
    lines += [f"    {k:<26}{v:>8}" for k, v in sorted(by_kind.items())]
    return "\n".join(lines)
