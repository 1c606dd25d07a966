"""Real Postgres for tests: one server per session (embedded unless DATABASE_URL
is set), a migrated template database, and a fresh database per test."""

from __future__ import annotations

import itertools
import os
import tempfile
import uuid

import pytest

from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.ledger.embedded import ensure_database, start_embedded
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.ledger.url import ConnInfo, parse_database_url

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> ConnInfo:
    url = os.environ.get("DATABASE_URL")
    if url:
        return parse_database_url(url)
    runtime = tempfile.mkdtemp(prefix="oc-xdg-")
    os.chmod(runtime, 0o700)
    os.environ["XDG_RUNTIME_DIR"] = runtime
    data = tempfile.mkdtemp(prefix="oc-pg-")
    return start_embedded(data, cleanup="delete")


@pytest.fixture(scope="session")
def pg_template(pg_server: ConnInfo) -> str:
    name = f"oc_tmpl_{uuid.uuid4().hex[:8]}"
    info = ensure_database(pg_server, name)
    template = Database(info)
    migrate(template)
    template.close()  # a template must have no open session to be copied
    return name


def fresh_database(server: ConnInfo, template: str | None) -> Database:
    name = f"oc_t_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    admin = connect(server.with_database("postgres"))
    try:
        if template:
            admin.run(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        else:
            admin.run(f'CREATE DATABASE "{name}"')
    finally:
        admin.close()
    return Database(server.with_database(name))


@pytest.fixture
def db(pg_server: ConnInfo, pg_template: str) -> Database:
    """A migrated database of its own for one test."""
    return fresh_database(pg_server, pg_template)


@pytest.fixture
def empty_db(pg_server: ConnInfo) -> Database:
    """A database with no schema (for migration tests)."""
    return fresh_database(pg_server, None)


@pytest.fixture(scope="module")
def module_db(pg_server: ConnInfo, pg_template: str) -> Database:
    """One migrated database shared by a test module (cheaper than one per test)."""
    return fresh_database(pg_server, pg_template)


@pytest.fixture
def emptied_db(module_db: Database) -> Database:
    """The module's database, emptied before the test."""
    from tests.support.ledger_helpers import reset

    reset(module_db)
    return module_db
