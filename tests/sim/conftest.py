"""Fixtures of the simulation tests: one migrated database for the session,
put on the simulated clock, shared by every seed (tables are emptied between seeds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orphan_cleanup.ledger.db import ConnInfo
from tests.sim.engine import SimEnv
from tests.support.pg import fresh_database


@pytest.fixture(scope="session")
def sim_db(pg_server: ConnInfo, pg_template: str) -> ConnInfo:
    return fresh_database(pg_server, pg_template).info


@pytest.fixture
def sim_env(sim_db: ConnInfo) -> Iterator[SimEnv]:
    env = SimEnv.open(sim_db)
    try:
        yield env
    finally:
        env.close()
