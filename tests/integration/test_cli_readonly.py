"""Read-only commands never run DDL; only `migrate` (and the embedded quick start) changes
a schema; expected failures are one readable line; `--version`; `psql` (issue #14).

Every command runs as a user runs it: `python -m orphan_cleanup` in a subprocess, against
the tests' real Postgres, with roles created here (one with only CONNECT and SELECT, one
that must authenticate with a password).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import pytest

from orphan_cleanup.cli.psql import find_psql, psql_environment, run_psql
from orphan_cleanup.core.errors import SchemaNotMigrated
from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.ledger.migrate import available_migrations, migrate
from orphan_cleanup.ledger.url import ConnInfo

NOT_MIGRATED = "orphan-cleanup: error: " + SchemaNotMigrated.MESSAGE
READ_ONLY_COMMANDS = [["status"], ["status", "--json"], ["backend", "list"], ["backend", "list", "--json"],
                      ["backend", "show", "aws-prod"], ["orphans"], ["orphans", "--json"], ["events"],
                      ["events", "--json"], ["report"], ["report", "--json"]]


def cli(url: str | None, *args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ORPHAN_CLEANUP_", "PG")) and k != "DATABASE_URL"}
    env.update(NO_COLOR="1", ORPHAN_CLEANUP_DATA_DIR=str(data_dir or "/nonexistent/never-used"))
    if url is not None:
        env["DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("orphan-cleanup: error: ")
    return lines[0]


def relations(admin: ConnInfo, database: str) -> int:
    conn = connect(admin.with_database(database))
    try:
        return int(conn.run("SELECT count(*) FROM pg_class")[0][0])
    finally:
        conn.close()


def product_tables(db: Database) -> list[str]:
    with db.connection() as conn:
        return [r[0] for r in conn.run(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename = ANY(CAST(:t AS text[]))",
            t=["schema_migrations", "cleanup", "cycles", "orphans", "events", "ledger_activity"])]


def admin_sql(admin: ConnInfo, database: str, *statements: str) -> None:
    conn = connect(admin.with_database(database))
    try:
        for statement in statements:
            conn.run(statement)
    finally:
        conn.close()


class Reader:
    """A login role granted nothing but what a reader needs: CONNECT and SELECT, per database."""

    def __init__(self, admin: ConnInfo) -> None:
        self.admin, self.role, self.databases = admin, f"oc_ro_{uuid.uuid4().hex[:8]}", []
        admin_sql(admin, "postgres", f"CREATE ROLE {self.role} LOGIN")

    def grant(self, database: str) -> None:
        self.databases.append(database)
        admin_sql(self.admin, database, f'GRANT CONNECT ON DATABASE "{database}" TO {self.role}',
                  f"GRANT USAGE ON SCHEMA public TO {self.role}",
                  f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {self.role}")

    def drop(self) -> None:
        for database in self.databases:
            admin_sql(self.admin, database, f"DROP OWNED BY {self.role}")
        admin_sql(self.admin, "postgres", f"DROP ROLE {self.role}")


@pytest.fixture
def reader(pg_server: ConnInfo) -> Iterator[Reader]:
    r = Reader(pg_server)
    yield r
    r.drop()


# -- read-only commands run no DDL ---------------------------------------------------------------


def test_status_as_a_select_only_role_reads_a_migrated_database(db, reader):
    # given a migrated database with a backend, and a role that may only connect and select
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions) VALUES"
                 " ('aws-prod', 'aws', '123456789012', '{us-east-1}')")
    reader.grant(db.info.database)
    url = replace(db.info, user=reader.role).url()

    # when that role asks for the status, the backends and one backend, then it gets them
    proc = cli(url, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["backend"] for r in json.loads(proc.stdout)] == ["aws-prod"]
    for args in (["status"], ["backend", "list"], ["backend", "show", "aws-prod"]):
        proc = cli(url, *args)
        assert proc.returncode == 0 and "aws-prod" in proc.stdout, proc.stderr
    for args in (["orphans", "--json"], ["events", "--json"]):
        proc = cli(url, *args)
        assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stderr
    proc = cli(url, "report", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["orphans_found"] == 0, proc.stderr


def test_status_as_a_select_only_role_on_an_empty_database_says_migrate(pg_server, empty_db, reader):
    reader.grant(empty_db.info.database)
    before = relations(pg_server, empty_db.info.database)

    proc = cli(replace(empty_db.info, user=reader.role).url(), "status")

    assert proc.returncode == 2 and proc.stdout == ""
    assert one_error_line(proc) == NOT_MIGRATED
    assert relations(pg_server, empty_db.info.database) == before


@pytest.mark.parametrize("args", READ_ONLY_COMMANDS, ids=" ".join)
def test_read_only_commands_create_nothing_even_as_a_superuser(pg_server, empty_db, args):
    # a superuser could create every table: the commands must not
    before = relations(pg_server, empty_db.info.database)

    proc = cli(empty_db.info.url(), *args)

    assert proc.returncode == 2 and proc.stdout == ""
    assert one_error_line(proc) == NOT_MIGRATED
    assert relations(pg_server, empty_db.info.database) == before


def test_a_database_older_than_this_version_is_not_migrated_by_readers(db):
    # given a database without this version's last migration
    last = max(v for v, _, _ in available_migrations())
    with db.connection() as conn:
        conn.run("DELETE FROM schema_migrations WHERE version = :v", v=last)

    for args in (["status"], ["backend", "list", "--json"]):
        proc = cli(db.info.url(), *args)
        assert proc.returncode == 2 and one_error_line(proc) == NOT_MIGRATED
    with db.connection() as conn:
        assert conn.run("SELECT count(*) FROM schema_migrations WHERE version = :v", v=last) == [[0]]


@pytest.mark.parametrize("args", [["backend", "add", "aws-prod", "--provider", "aws", "--account", "123456789012",
                                   "--regions", "us-east-1"], ["run", "--backend", "aws-prod"],
                                  ["backend", "update", "aws-prod", "--mode", "delete"],
                                  ["backend", "remove", "aws-prod"]], ids=lambda a: " ".join(a[:2]))
def test_writers_on_a_database_url_leave_the_schema_to_migrate(pg_server, empty_db, args):
    # a DATABASE_URL is the platform's database: schema changes are `migrate`'s, run on purpose
    before = relations(pg_server, empty_db.info.database)

    proc = cli(empty_db.info.url(), *args)

    assert proc.returncode == 2 and one_error_line(proc) == NOT_MIGRATED
    assert relations(pg_server, empty_db.info.database) == before


def test_the_embedded_quick_start_migrates_on_the_first_write(tmp_path):
    # given no DATABASE_URL: the CLI's own embedded Postgres in its data dir
    proc = cli(None, "status", data_dir=tmp_path)
    assert proc.returncode == 2 and NOT_MIGRATED in proc.stderr  # a reader does not migrate, even there

    # when a backend is added, the embedded database is migrated first
    proc = cli(None, "backend", "add", "aws-prod", "--provider", "aws", "--account", "123456789012",
               "--regions", "us-east-1", data_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr

    # then the readers work
    proc = cli(None, "status", "--json", data_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["backend"] for r in json.loads(proc.stdout)] == ["aws-prod"]


# -- migrate checks the platform's own C1 tables first -------------------------------------------


def test_migrate_names_every_missing_c1_column_and_applies_nothing(empty_db):
    # given C1 tables a platform created itself, two contract columns short
    with empty_db.transaction() as conn:
        conn.run("CREATE TABLE backends (id text PRIMARY KEY, provider text, account text, settings jsonb,"
                 " mode text)")
        conn.run("CREATE TABLE provider_refs (provider_ref text PRIMARY KEY, owner_type text, owner_id text,"
                 " owner_name text, issued_at timestamptz)")
        conn.run("CREATE TABLE instances (id text PRIMARY KEY, name text, provider_ref text, status text,"
                 " backend_id text, region text, created_at timestamptz, provisioned_at timestamptz,"
                 " terminated_at timestamptz, deleted_at timestamptz)")

    proc = cli(empty_db.info.url(), "migrate")

    assert proc.returncode == 2 and proc.stdout == ""
    line = one_error_line(proc)
    assert "backends.regions, instances.primary_id missing" in line and "Nothing was applied" in line
    assert product_tables(empty_db) == []


# -- expected failures are one line ----------------------------------------------------------------


@pytest.fixture
def password_role(pg_server: ConnInfo) -> Iterator[tuple[str, str]]:
    """A role that must give its password (scram), whatever the server's default rule (the
    embedded server trusts local connections): our lines go first in its pg_hba.conf."""
    admin = connect(pg_server.with_database("postgres"))
    try:
        hba = Path(admin.run("SHOW hba_file")[0][0])
        if not os.access(hba, os.W_OK):
            pytest.skip("the test server's pg_hba.conf is not writable here")
        role, password = f"oc_pw_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
        admin.run(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
        original = hba.read_text()
        hba.write_text(f"local all {role} scram-sha-256\nhost all {role} 127.0.0.1/32 scram-sha-256\n"
                       f"host all {role} ::1/128 scram-sha-256\n" + original)
        admin.run("SELECT pg_reload_conf()")
        try:
            _wait_until_refused(replace(pg_server, user=role, password="wrong"))
            yield role, password
        finally:
            hba.write_text(original)
            admin.run("SELECT pg_reload_conf()")
            admin.run(f"DROP ROLE {role}")
    finally:
        admin.close()


def _wait_until_refused(info: ConnInfo) -> None:
    from orphan_cleanup.core.errors import DatabaseError

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            connect(info.with_database("postgres")).close()
        except DatabaseError:
            return
        time.sleep(0.05)
    raise AssertionError("pg_hba.conf reload did not take effect")


def test_a_wrong_password_is_the_servers_sqlstate_and_message(db, password_role):
    role, password = password_role
    proc = cli(replace(db.info, user=role, password="not-" + password).url(), "status")

    assert proc.returncode == 2 and proc.stdout == ""
    line = one_error_line(proc)
    assert f'28P01 password authentication failed for user "{role}"' in line
    assert "'C'" not in line and "{" not in line  # never pg8000's raw dict
    # and with the right password the same command works
    assert cli(replace(db.info, user=role, password=password).url(), "status").returncode == 0


@pytest.mark.parametrize("url, says", [
    ("postgresql://cleanup@127.0.0.1:1/platform?sslmode=disable", "127.0.0.1:1/platform: connection refused"),
    ("postgresql://cleanup@nonexistent.invalid:5432/platform?sslmode=disable",
     "nonexistent.invalid:5432/platform: DNS failure"),
], ids=["closed port", "unresolvable host"])
@pytest.mark.parametrize("args", [["status"], ["migrate"], ["backend", "list"]], ids=" ".join)
def test_an_unreachable_database_is_one_line_saying_why(url, says, args):
    proc = cli(url, *args)

    assert proc.returncode == 2 and proc.stdout == ""
    line = one_error_line(proc)
    assert line.startswith("orphan-cleanup: error: cannot connect to the database at ") and says in line
    assert "Can't create a connection" not in line  # pg8000's wording is not the user's


def test_a_timeout_is_said_as_such():
    # a server that accepts and never answers: the connection's own timeout, then one line
    import socket

    from orphan_cleanup.cli.output import database_error_line
    from orphan_cleanup.core.errors import DatabaseError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host, port = silent.getsockname()
        with pytest.raises(DatabaseError) as err:
            from orphan_cleanup.ledger.db import connect as db_connect

            db_connect(ConnInfo(host=host, port=port, sslmode="disable"), timeout=0.3)
    assert database_error_line(err.value, f"{host}:{port}/postgres") == \
        f"cannot connect to the database at {host}:{port}/postgres: timed out (no answer from the server)"


# -- --version and psql ------------------------------------------------------------------------------


def test_version_is_the_installed_packages():
    proc = cli(None, "--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"orphan-cleanup {version('orphan-cleanup')}\n", "")
    assert version("orphan-cleanup") == "0.1.0"


def test_psql_runs_on_the_configured_database_with_arguments_after_the_dashes(db):
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions) VALUES"
                 " ('aws-prod', 'aws', '123456789012', '{us-east-1}')")

    proc = cli(db.info.url(), "psql", "--", "-At", "-c", "select id || '/' || current_database() from backends")

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"aws-prod/{db.info.database}"


def test_psql_exits_with_psqls_status(db):
    proc = cli(db.info.url(), "psql", "--", "-v", "ON_ERROR_STOP=1", "-c", "select * from no_such_table")
    assert proc.returncode != 0 and "no_such_table" in proc.stderr


@pytest.mark.skipif(shutil.which("psql") is None, reason="no psql on PATH")
def test_the_systems_psql_gets_the_password_from_the_environment_only(db, password_role, capfd):
    # given a role that must authenticate, and the machine's psql (not the embedded package's)
    role, password = password_role
    info = replace(db.info, user=role, password=password)
    system_psql = shutil.which("psql")
    assert system_psql is not None

    # when psql runs through our environment
    code = run_psql(info, ["-At", "-c", "select current_user"], psql=system_psql)

    # then it authenticated, with the password in PGPASSWORD and nowhere on its command line
    out, err = capfd.readouterr()
    assert (code, out.strip()) == (0, role), err
    env = psql_environment(info, {"PGPASSWORD": "someone else's", "PGHOST": "elsewhere", "HOME": "/root"})
    assert env["PGPASSWORD"] == password and env["PGUSER"] == role and env["HOME"] == "/root"
    assert env["PGHOST"] == (str(Path(info.unix_sock).parent) if info.unix_sock else info.host)


def test_no_psql_is_one_line(db, monkeypatch):
    import orphan_cleanup.cli.psql as psql_module
    from orphan_cleanup.core.errors import ConfigError

    monkeypatch.setattr(psql_module, "find_psql", lambda: None)
    with pytest.raises(ConfigError, match="psql not found: install the PostgreSQL client"):
        psql_module.run_psql(db.info, [])
    assert find_psql() is not None  # and here there is one (the embedded package's, or the system's)


def test_migrate_then_status_works(empty_db):
    # the way out of the message: migrate (the owner's step), then the readers work
    assert cli(empty_db.info.url(), "status").returncode == 2
    proc = cli(empty_db.info.url(), "migrate")
    assert proc.returncode == 0 and "applied" in proc.stdout
    assert migrate(empty_db) == []
    assert cli(empty_db.info.url(), "status").returncode == 0
