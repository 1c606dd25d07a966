"""The fleet benchmark runs a tiny fleet and keeps its promises.

Behaviour only (orphans found, statements counted, connections within the caps);
timings are the benchmark's business, never a test's.
"""

from __future__ import annotations

import pytest

from bench import fleet
from bench.common import PgServer

TINY = (fleet.Size(accounts=1, backends_per_account=2, regions=3, vms_per_account=100),
        fleet.Size(accounts=2, backends_per_account=2, regions=3, vms_per_account=100))


@pytest.mark.slow  # a bench run (a few seconds): kept out of the default run for its time
@pytest.mark.parametrize("mode", fleet.MODES)
def test_tiny_fleet_finds_every_leak_within_the_connection_caps(pg_server, mode):
    # given two tiny fleets (2 and 4 backends, 2% of their VMs leaked) at the deployed caps
    cfg = fleet.Config(sizes=TINY)
    delete = mode == "delete"
    # when the fleet benchmark runs its cycle(s) in that mode, and the join floor
    tables = fleet.run(PgServer(pg_server), cfg=cfg, modes=(mode,))
    # then every leaked VM was found as an orphan, and nothing else
    times, statements, cpu, growth, top = tables
    assert [r["backends"] for r in statements.rows] == [2, 4]
    assert [r["orphans"] for r in statements.rows] == [s.leaked for s in TINY] == [2, 4]
    # in delete mode each leaked VM's instance and root volume were deleted; in report mode nothing
    assert [r["deleted"] for r in statements.rows] == ([4, 8] if delete else [0, 0])
    # and the statements were counted, and never more connections open at once than the caps + 2
    assert all(r["stmts/backend"] > 0 and r["listing stmts/backend"] > 0 and r["classify stmts/backend"] > 0
               for r in statements.rows)
    assert all(0 < r["peak connections"] <= cfg.caps + fleet.GOAL_CONNECTIONS_OVER_CAPS for r in statements.rows)
    assert all((r["delete stmts/backend"] > 0) == delete for r in statements.rows)
    assert len(times.rows) == len(cpu.rows) == 2 and growth.rows and top.rows


def test_sizes_model_two_percent_leaks_and_one_listing_per_backend():
    full = fleet.Config().sizes
    assert [s.backends for s in full] == [100, 1_000]
    assert [s.leaked for s in full] == [s.vms // 50 for s in full]
    assert [s.backends for s in fleet.Config.quick().sizes] == [10, 100]
