"""Fixtures of the provider contract suite: one driver per cloud (``clouds.py``), on a
real Postgres ledger (the module's database, emptied before each test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orphan_cleanup.ledger.db import Database
from tests.contract.clouds import AwsDriver, Driver, GcpDriver, RecordingProxy


@pytest.fixture
def driver(request: pytest.FixtureRequest, cloud: str, emptied_db: Database) -> Iterator[Driver]:
    """The driver of ``cloud`` (a test parameter), its cloud emptied for this test; only the
    cloud a test runs on is started."""
    if cloud == "aws":
        moto_url = request.getfixturevalue("moto_reset")
        proxy = RecordingProxy(moto_url)
        with proxy:
            yield AwsDriver(emptied_db, moto_url, proxy)
    else:
        yield GcpDriver(emptied_db, request.getfixturevalue("gcp"))
