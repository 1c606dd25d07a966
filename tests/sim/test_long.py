"""The long simulation (marked slow: ``python -m pytest -m slow tests/sim``).

The same as ``python -m tests.sim --seeds 200 --steps 50``, plus a check that
every kind of fault was actually injected somewhere in the run (a fault
injector that silently stopped firing would make the run meaningless).
"""

from __future__ import annotations

import pytest

from orphan_cleanup.ledger.db import ConnInfo
from tests.sim.run import run_many, table
from tests.sim.world import BASE_RATES

#: Kinds that fire only in some seeds' configurations (still expected over 200 seeds).
SEEDS, STEPS = 200, 50


@pytest.mark.slow
def test_a_long_simulation_keeps_every_invariant_under_every_fault(sim_db: ConnInfo) -> None:
    summary = run_many(sim_db, range(1000, 1000 + SEEDS), STEPS)

    assert not summary.violations, "\n\n".join(map(str, summary.violations[:3])) + "\n\n" + table(summary)
    missing = set(BASE_RATES) - set(summary.faults)
    assert not missing, f"fault kinds never injected: {sorted(missing)}\n{table(summary)}"
    assert summary.outcomes["converged"] > SEEDS // 2
    assert summary.work["shared_listings"] > SEEDS // 4, table(summary)
