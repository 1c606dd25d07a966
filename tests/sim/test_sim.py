"""The simulation in the default test run: a few seeds, a few seconds.

The long run is ``python -m tests.sim --seeds 1000 --steps 50`` (tests/sim/README.md)
and, marked slow, ``test_long.py``.
"""

from __future__ import annotations

from orphan_cleanup.ledger.db import ConnInfo
from tests.sim.engine import SimEnv, run_seed
from tests.sim.run import run_many, table

SEEDS = range(0, 8)
STEPS = 40


def test_a_short_simulation_keeps_every_invariant(sim_db: ConnInfo) -> None:
    # given a platform crashing at every point of the ledger protocol, a faulty
    # provider, faulty queues and a flaky database, for a few seeds
    summary = run_many(sim_db, SEEDS, STEPS)

    # then no invariant broke, and the run did real work under real faults
    assert not summary.violations, "\n\n".join(map(str, summary.violations[:3])) + "\n\n" + table(summary)
    assert summary.cycles > 20 and summary.deleted > 10
    assert sum(summary.faults.values()) > 50
    assert {"S1-S3", "C1", "F1", "I2", "J1", "L1", "K1", "P1", "V1", "W1"} <= set(summary.checks)
    # through both schedulers: the tick with its listing jobs, some of them shared by several
    # backends' cycles, and direct invokes of one backend's lister
    work = summary.work
    assert work["ticks"] > 0 and work["listing_jobs"] > 0 and work["direct_lister_runs"] > 0
    assert work["shared_listings"] > 0 and work["cycles_fed_by_shared_listing"] > 0


def test_a_seed_replays_exactly(sim_env: SimEnv) -> None:
    # given the same seed run twice
    first = run_seed(sim_env, 3, 30)
    second = run_seed(sim_env, 3, 30)

    # then everything it did is the same (a violation's seed is enough to replay it)
    assert (first.steps, first.cycles, first.deleted, first.outcome) == \
        (second.steps, second.cycles, second.deleted, second.outcome)
    assert first.faults == second.faults and first.checks == second.checks
