"""Upgrade in one step (docs/DEPLOY.md, "Upgrade"; docs/DATABASE.md, "4. Roles"), on a real
Postgres: a database of the previous release (migrations 0001..0013, the function roles
granted by that release's roles.sql, kept in tests/support/previous_release) is upgraded by
`orphan-cleanup migrate` alone, run as a subprocess with the owner role's DATABASE_URL. Then
each function runs a delete cycle on its own role, each role is refused every write its
function does not make (docs/SAFETY.md rule 19), and the grants are exactly those this
release's roles.sql gives. A migrate that cannot grant them applies nothing and names, in one
line, the command to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orphan_cleanup.cycle.runner import delete_all
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.migrate import available_migrations, migrate
from orphan_cleanup.ledger.store import LedgerStore
from tests.integration.test_db_function_roles import NOBODY, REFUSED, _open_delete_cycle
from tests.integration.test_db_roles import PLATFORM_DDL, PSQL, Ledger, _drop, _new_ledger, denied, ok

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")
ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_ROLES_SQL = ROOT / "tests" / "support" / "previous_release" / "roles.sql"
PREVIOUS_RELEASE = 13  # its last migration
ROLES_SQL_COMMAND = 'psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f infra/postgres/roles.sql'


def _variables(ledger: Ledger) -> dict[str, str]:
    return dict(platform_role=ledger.platform, c1_owner=ledger.platform, revoke_public="on")


def _previous_release(pg_server) -> Ledger:
    """A database as the previous release left it: its roles.sql, its migrate, its roles.sql."""
    ledger = _new_ledger(pg_server)
    ledger.admin_run(*PLATFORM_DDL, role=ledger.platform)
    ok(ledger.roles_sql(PREVIOUS_ROLES_SQL, **_variables(ledger)))
    migrate(ledger.db(ledger.owner), through=PREVIOUS_RELEASE)
    ok(ledger.roles_sql(PREVIOUS_ROLES_SQL, **_variables(ledger)))
    return ledger


def _cli(ledger: Ledger, *args: str, admin: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "ORPHAN_CLEANUP_"))}
    env["DATABASE_URL"] = (ledger.admin if admin else ledger.info(ledger.owner)).url()
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def _role_flags(ledger: Ledger) -> list[str]:
    """The role names as roles.sql was given them (-v lister_role=... and so on)."""
    flags = ["--owner-role", ledger.owner, "--runtime-role", ledger.runtime, "--definer-role", ledger.definer]
    for fn, role in ledger.functions.items():
        flags += [f"--{fn}-role", role]
    return flags


def _applied(ledger: Ledger) -> list[int]:
    with ledger.db(ledger.owner).connection() as conn:
        return [r[0] for r in conn.run("SELECT version FROM schema_migrations ORDER BY 1")]


# Every privilege on the schema's tables, columns, sequences and functions, and each function's
# owner and settings: (object, grantee, privilege, grantor, grantable). The platform's writer is
# roles.sql's alone (-v platform_role, docs/DATABASE.md "The platform's writer"): left out.
_GRANTS = """
SELECT c.relname, '', g.grantee::regrole::text, g.privilege_type, g.grantor::regrole::text, g.is_grantable
  FROM pg_class c, aclexplode(c.relacl) g WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT c.relname, a.attname, g.grantee::regrole::text, g.privilege_type, g.grantor::regrole::text, g.is_grantable
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid, aclexplode(a.attacl) g
 WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT p.oid::regprocedure::text, '', g.grantee::regrole::text, g.privilege_type, g.grantor::regrole::text,
       g.is_grantable
  FROM pg_proc p, aclexplode(p.proacl) g WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT p.oid::regprocedure::text, 'owner', pg_get_userbyid(p.proowner), p.prosecdef::text,
       coalesce(p.proconfig::text, ''), false
  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
"""


def _grants(ledger: Ledger) -> set[tuple]:
    with ledger.db(ledger.owner).connection() as conn:
        rows = {tuple(r) for r in conn.run(_GRANTS)}
    return {r for r in rows if ledger.platform not in (r[2], r[4])}


@pytest.fixture(scope="module")
def upgraded(pg_server) -> Iterator[tuple[Ledger, subprocess.CompletedProcess[str]]]:
    ledger = _previous_release(pg_server)
    try:
        assert _applied(ledger)[-1] == PREVIOUS_RELEASE
        # when the operator runs DEPLOY.md's upgrade: migrate, and nothing else on the database
        yield ledger, _cli(ledger, "migrate", *_role_flags(ledger))
    finally:
        _drop(ledger)


def test_migrate_applies_the_new_migrations_and_grants_the_roles_in_one_line(upgraded):
    ledger, done = upgraded
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    [line] = done.stdout.splitlines()
    newer = [name for version, name, _ in available_migrations() if version > PREVIOUS_RELEASE]
    assert newer and all(name in line for name in newer), line
    assert all(role in line for role in (ledger.runtime, *ledger.functions.values())), line
    assert _applied(ledger) == [version for version, _, _ in available_migrations()]


def test_after_the_upgrade_each_function_runs_a_delete_cycle_on_its_own_role(upgraded):
    ledger, _ = upgraded
    s = _open_delete_cycle(ledger, "mem-upgraded")
    assert list(delete_all(s["pipelines"]["deleter"], [s["other"]]))
    assert LedgerStore(ledger.db(ledger.owner)).cycle_report(s["cycle"]).outcome == "clean"
    for p in s["pipelines"].values():
        p.db.close()


@pytest.mark.parametrize("fn, sql", [(fn, sql) for fn, sqls in REFUSED.items() for sql in sqls]
                         + [(fn, sql) for fn in REFUSED for sql in NOBODY])
def test_after_the_upgrade_each_role_is_refused_what_its_function_does_not_write(upgraded, fn, sql):
    # the previous release granted the deleter whole-table UPDATEs and the classifier orphan_resources
    ledger, _ = upgraded
    denied(Database(ledger.info(ledger.functions[fn])), sql)


def test_the_grants_after_migrate_are_those_of_this_releases_roles_sql(upgraded):
    ledger, _ = upgraded
    after_migrate = _grants(ledger)
    ok(ledger.roles_sql(**_variables(ledger)))
    assert after_migrate == _grants(ledger)


def test_migrate_that_cannot_grant_applies_nothing_and_names_the_command(pg_server):
    ledger = _previous_release(pg_server)
    try:
        # given another role than the owner (the admin: the tables it created would be its own)
        done = _cli(ledger, "migrate", *_role_flags(ledger), admin=True)
        assert done.returncode == 2, done.stdout
        [line] = done.stderr.splitlines()
        assert f"connected as {ledger.admin.user}, not as the owner role {ledger.owner}" in line, line
        assert ROLES_SQL_COMMAND in line and "nothing was applied" in line, line
        # or roles.sql's own default names, which this database's roles.sql did not use
        done = _cli(ledger, "migrate")
        assert done.returncode == 2, done.stdout
        assert done.stdout == ""
        [line] = done.stderr.splitlines()
        assert ROLES_SQL_COMMAND in line and "--skip-grants" in line and "nothing was applied" in line, line
        assert _applied(ledger)[-1] == PREVIOUS_RELEASE
        # the way the line names: migrate without grants, then roles.sql
        done = _cli(ledger, "migrate", "--skip-grants")
        assert done.returncode == 0, done.stderr
        assert _applied(ledger) == [version for version, _, _ in available_migrations()]
        ok(ledger.roles_sql(**_variables(ledger)))
        denied(Database(ledger.info(ledger.functions["deleter"])), "UPDATE cycle_groups SET provider_ref = 'x'")
    finally:
        _drop(ledger)


def test_a_first_install_migrate_grants_too_and_hands_the_definer_its_functions(pg_server):
    # docs/DATABASE.md, "4. Roles": roles.sql, then migrate as the owner role; the SECURITY
    # DEFINER functions migrate creates change hands to the definer, which keeps no CREATE
    ledger = _new_ledger(pg_server)
    try:
        ledger.admin_run(*PLATFORM_DDL, role=ledger.platform)
        ok(ledger.roles_sql(**_variables(ledger)))
        done = _cli(ledger, "migrate", *_role_flags(ledger))
        assert done.returncode == 0, done.stderr
        assert ledger.functions["deleter"] in done.stdout
        with ledger.db(ledger.owner).connection() as conn:
            assert conn.run("SELECT p.proname, pg_get_userbyid(p.proowner), p.prosecdef FROM pg_proc p"
                            " WHERE p.proname IN ('oc_record_orphan_resources', 'orphan_cleanup_region_baseline')"
                            " ORDER BY 1") == [["oc_record_orphan_resources", ledger.definer, True],
                                               ["orphan_cleanup_region_baseline", ledger.definer, True]]
            assert conn.run("SELECT has_schema_privilege(:r, 'public', 'CREATE')", r=ledger.definer) == [[False]]
        after_migrate = _grants(ledger)
        # roles.sql's second run adds only the platform's writer (-v platform_role)
        ok(ledger.roles_sql(**_variables(ledger)))
        assert after_migrate == _grants(ledger)
    finally:
        _drop(ledger)
