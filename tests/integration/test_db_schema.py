"""A schema of its own for the ledger (dstack's case), on a real Postgres: the platform's
own ``backends`` and ``instances`` tables, with other columns, live in ``public``; roles.sql
with ``-v schema=orphan_cleanup`` makes the ledger's schema; every URL of the product
says ``options=-csearch_path%3Dorphan_cleanup`` (libpq's form).

Then ``migrate`` creates everything in ``orphan_cleanup`` and leaves the platform's tables
exactly as they were (columns, indexes, triggers, constraints); the platform writes the
ledger beside its own row in one transaction; the runtime role runs whole cycles there;
the CLI reaches the same tables; and every connection, kept idle and reused included,
keeps the search_path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from orphan_cleanup.cli import app as cli
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.migrate import available_migrations, first_schema, migrate
from orphan_cleanup.ledger.url import ConnInfo, parse_database_url
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_db_roles import PSQL, Ledger, _drop, _new_ledger, ok
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.pg import fresh_database
from tests.support.platform import Platform, add_backend

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")

SCHEMA = "orphan_cleanup"
OPTIONS = f"-csearch_path={SCHEMA}"
# dstack-like tables of the platform: same names as C1, other columns (uuid ids, projects, JSON).
DSTACK_DDL = [
    "CREATE TABLE public.backends (id uuid PRIMARY KEY, project_id uuid NOT NULL, type text NOT NULL,"
    " config text NOT NULL, auth text NOT NULL)",
    "CREATE TABLE public.instances (id uuid PRIMARY KEY, project_id uuid NOT NULL, name text NOT NULL,"
    " status text NOT NULL, backend_id uuid REFERENCES public.backends, job_provisioning_data text,"
    " created_at timestamptz NOT NULL DEFAULT now(), deleted boolean NOT NULL DEFAULT false)",
    "CREATE INDEX ix_instances_project ON public.instances (project_id)",
]
# What migrate could have changed in public: every column, index, trigger and constraint there.
PUBLIC_SHAPE = (
    "SELECT 'column', c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)"
    " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped"
    " UNION ALL SELECT 'index', indexname FROM pg_indexes WHERE schemaname = 'public'"
    " UNION ALL SELECT 'trigger', t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
    " UNION ALL SELECT 'constraint', conname FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace"
    " WHERE n.nspname = 'public'"
    " UNION ALL SELECT 'function', proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    " WHERE n.nspname = 'public'"
    " ORDER BY 1, 2")


def in_schema(info: ConnInfo) -> ConnInfo:
    """The role's URL with the ledger's search_path, as an operator writes it."""
    url = replace(info, options=OPTIONS).url()
    assert "options=-csearch_path%3Dorphan_cleanup" in url
    return parse_database_url(url)


def shape(db: Database) -> list[list[str]]:
    with db.connection() as conn:
        return conn.run(PUBLIC_SHAPE)


@pytest.fixture(scope="module")
def dstack(pg_server: ConnInfo) -> Iterator[tuple[Ledger, list[list[str]]]]:
    """The platform's tables first, then roles.sql (schema orphan_cleanup), migrate as the
    owner role through the options URL, roles.sql again. Yields the ledger and the shape
    of public before migrate."""
    ledger = _new_ledger(pg_server)
    try:
        ledger.admin_run(*DSTACK_DDL, role=ledger.platform)
        before = shape(Database(ledger.admin))
        vars_ = dict(schema=SCHEMA, platform_role=ledger.platform, revoke_public="on")
        ok(ledger.roles_sql(**vars_))
        assert migrate(Database(in_schema(ledger.info(ledger.owner)))) == [n for _, n, _ in available_migrations()]
        ok(ledger.roles_sql(**vars_))
        yield ledger, before
    finally:
        _drop(ledger)


def test_migrate_creates_the_ledger_in_its_schema_and_leaves_the_platforms_tables_alone(dstack):
    ledger, before = dstack
    admin = Database(ledger.admin)
    assert shape(admin) == before
    with admin.connection() as conn:
        owner = conn.run("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = :s", s=SCHEMA)[0][0]
        # (coverages() names its tables with the schema instead: a pin would stop the planner
        # from inlining it, migration 0020)
        pinned = conn.run("SELECT count(*), count(*) FILTER (WHERE proconfig @> ARRAY[CAST(:c AS text)])"
                          " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = :s"
                          " AND (p.proname <> 'coverages' OR p.prosrc NOT LIKE :q)",
                          s=SCHEMA, c=f"search_path={SCHEMA}, pg_temp", q=f"%FROM {SCHEMA}.backends b%")[0]
    assert owner == ledger.owner
    for table in ("backends", "provider_refs", "instances", "ledger_activity", "cleanup", "cycles", "orphans",
                  "schema_migrations"):
        assert _exists(admin, SCHEMA, table), table
        assert _exists(admin, "public", table) == (table in ("backends", "instances")), table
    assert pinned[0] > 0 and pinned[0] == pinned[1]  # every product function resolves its own schema
    # a second migrate applies nothing and still touches nothing in public
    assert migrate(Database(in_schema(ledger.info(ledger.owner)))) == []
    assert shape(admin) == before


def _exists(db: Database, schema: str, table: str) -> bool:
    with db.connection() as conn:
        return bool(conn.run("SELECT to_regclass(format('%I.%I', CAST(:s AS text), CAST(:t AS text))) IS NOT NULL",
                             s=schema, t=table)[0][0])


def test_the_platform_writes_the_ledger_beside_its_own_row_in_one_transaction(dstack):
    ledger, _ = dstack
    add_backend(Database(in_schema(ledger.info(ledger.owner))), "dstack-aws")
    # given the platform's own connection: its search_path is public, as dstack's is
    platform = Database(ledger.info(ledger.platform))
    with platform.transaction() as conn:
        conn.run("INSERT INTO backends (id, project_id, type, config, auth) VALUES"
                 " ('00000000-0000-0000-0000-0000000000b1', gen_random_uuid(), 'aws', '{}', '{}')")
        conn.run("INSERT INTO instances (id, project_id, name, status, backend_id) VALUES"
                 " ('00000000-0000-0000-0000-0000000000a1', gen_random_uuid(), 'train-7', 'pending',"
                 " '00000000-0000-0000-0000-0000000000b1')")
        # the ledger's rows, schema-qualified, in the same transaction (README: the protocol)
        conn.run("INSERT INTO orphan_cleanup.provider_refs (provider_ref, owner_id, owner_name)"
                 " VALUES ('k3j9x0a8b7c6', '00000000-0000-0000-0000-0000000000a1', 'train-7')")
        conn.run("INSERT INTO orphan_cleanup.instances (id, name, provider_ref, status, backend_id)"
                 " VALUES ('00000000-0000-0000-0000-0000000000a1', 'train-7', 'k3j9x0a8b7c6', 'pending',"
                 " 'dstack-aws')")
    # then the triggers logged the activity in the ledger's schema, for the ledger's backend:
    # they read orphan_cleanup.backends, not the platform's public.backends
    with Database(ledger.admin).connection() as conn:
        logged = conn.run("SELECT count(*), array_agg(DISTINCT backend_id) FROM orphan_cleanup.ledger_activity"
                          " WHERE backend_id IS NOT NULL")[0]
        platform_rows = conn.run("SELECT count(*) FROM public.instances")[0][0]
    assert logged[0] >= 1 and logged[1] == ["dstack-aws"] and platform_rows == 1
    # and LedgerClient over the options URL writes the same tables
    client = LedgerClient(Database(in_schema(ledger.info(ledger.platform))))
    issued = client.issue_ref(owner_name="train-8")
    assert _count(ledger, f"SELECT count(*) FROM orphan_cleanup.instances WHERE id = '{issued.owner_id}'") == 1


def _count(ledger: Ledger, sql: str) -> int:
    with Database(ledger.admin).connection() as conn:
        return int(conn.run(sql)[0][0])


def test_the_runtime_role_runs_cycles_in_the_schema(dstack):
    ledger, before = dstack
    cloud = MemoryCloud()
    add_backend(Database(in_schema(ledger.info(ledger.owner))))
    platform = Platform(Database(in_schema(ledger.info(ledger.platform))), cloud)
    _, _, tracked = platform.tracked()
    _, _, leaked = platform.terminated_leak()
    settings = Settings.explicit(confirm_seconds=0, database_url=in_schema(ledger.info(ledger.runtime)).url())
    pipeline = bootstrap.build_pipeline(settings, listing_queue=InProcessQueue(), delete_queue=InProcessQueue(),
                                        provider_for=lambda b: MemoryProvider(b, cloud))
    report = run_cycle(pipeline, "mem", mode="delete")
    assert report.outcome == "clean"
    assert {g.primary_id: g.action for g in report.groups} == {tracked: "none", leaked: "deleted"}
    assert cloud.exists(tracked) and not cloud.exists(leaked)
    # the pipeline's kept connection is reused, and keeps the schema even after RESET ALL
    with pipeline.db.connection() as conn:
        pid = conn.run("SELECT pg_backend_pid()")[0][0]
        conn.run("RESET ALL")
    with pipeline.db.connection() as conn:
        assert conn.run("SELECT pg_backend_pid(), current_schema()")[0] == [pid, SCHEMA]
    pipeline.db.close()
    assert shape(Database(ledger.admin)) == before


def test_the_cli_uses_the_schema_of_the_url(dstack, monkeypatch, capsys):
    ledger, before = dstack
    monkeypatch.setenv("DATABASE_URL", in_schema(ledger.info(ledger.owner)).url())
    assert cli.main(["backend", "add", "cli-aws", "--provider", "aws", "--account", "123456789012",
                     "--regions", "us-east-1"]) == 0
    assert cli.main(["status", "--json"]) == 0
    assert '"cli-aws"' in capsys.readouterr().out
    assert _count(ledger, "SELECT count(*) FROM orphan_cleanup.backends WHERE id = 'cli-aws'") == 1
    assert shape(Database(ledger.admin)) == before


def test_migrate_refuses_a_search_path_whose_first_schema_is_missing(pg_server):
    # given a database with the platform's clashing tables and no orphan_cleanup schema
    db = fresh_database(pg_server, None)
    with db.connection() as conn:
        for sql in DSTACK_DDL:
            conn.run(sql)
    before = shape(db)
    # when migrate runs with a search_path naming it first (public would be next)
    target = Database(replace(db.info, options=f"-csearch_path={SCHEMA},public"))
    with pytest.raises(ConfigError) as err:
        migrate(target)
    # then nothing is created, in public least of all
    assert "'orphan_cleanup'" in str(err.value) and "does not exist" in str(err.value)
    assert "\n" not in str(err.value)
    assert shape(db) == before


@pytest.mark.parametrize("search_path, user_schema, expected", [
    ('"$user", public', False, "public"),
    ('"$user", public', True, "alice"),
    ("orphan_cleanup", False, "orphan_cleanup"),
    ("Orphan_Cleanup, public", False, "orphan_cleanup"),
    ('"My Schema", public', False, "My Schema"),
    ("pg_temp, ledger", False, "ledger"),
    ("", False, None),
])
def test_first_schema_reads_search_path_as_postgres_does(search_path, user_schema, expected):
    assert first_schema(search_path, "alice", user_schema) == expected
