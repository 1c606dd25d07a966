"""Every grant, from pg_catalog, against what the code writes (docs/DATABASE.md, "One role per
function"; docs/SAFETY.md rule 19), on a real Postgres set up as DATABASE.md says: roles.sql,
``migrate`` as the owner, roles.sql again.

``ALLOWED`` declares, per role, each table's writes its code makes (the statements of
``ledger/locked.py``, ``ledger/session.py``, ``ledger/store.py``, ``ledger/journal.py``,
``ledger/queries.py`` and ``oc_apply_batch``, by the function whose path runs them; the
runtime role is their union, as a manual ``run`` is all three). The catalog's grants must be
exactly that, and every other write (each table, each column, each role: INSERT, UPDATE,
DELETE, TRUNCATE), generated from the catalog, is tried and must be refused. PostgreSQL checks
privileges before it executes, so each write touches no row (``WHERE false``), in a savepoint.
"""

from __future__ import annotations

from typing import Any

import pg8000.native
import pytest

from orphan_cleanup.ledger.db import connect, sqlstate
from tests.integration.test_db_function_roles import ledger  # noqa: F401 - the module's ledger fixture
from tests.integration.test_db_roles import PSQL, Ledger

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")

ALL = "*"  # a table-level grant: every column
Grants = dict[str, dict[str, Any]]  # table -> {privilege: ALL | frozenset of columns | True}

# STEP 7 (``LockedCycle.finish``) and a lease that expired (``LeaseUnit.expire``) or ends.
_FINISH_CLEANUP = frozenset({"clean_at", "clean_mode", "last_processed_at", "next_due_at", "retry_delay_seconds",
                             "last_outcome", "last_error", "lease_owner", "lease_expires_at"})
_JOURNAL_ROW = frozenset({"backend_id", "cycle_id", "scope", "region", "provider_ref", "group_key", "phase",
                          "intent_id", "call", "target", "blast", "outcome", "error"})

LISTER: Grants = {
    # enrol (tick, STEP 1), the lease taken (fence) and released, a backend marked idle
    "cleanup": {"INSERT": ALL, "UPDATE": _FINISH_CLEANUP | {"fence"}},
    # the cycle started; its listing time, region counts, a failed listing, an expired lease
    "cycles": {"INSERT": ALL, "UPDATE": frozenset({"listed_at", "region_groups", "failures", "failed", "error",
                                                   "outcome", "finished_at"})},
    "region_listings": {"INSERT": ALL, "UPDATE": frozenset({"suspect_groups", "suspect_at"})},
    "events": {"INSERT": ALL},
}
CLASSIFIER: Grants = {
    "cleanup": {"UPDATE": _FINISH_CLEANUP},
    # oc_apply_batch's progress, the blast-radius cap, the delete requests dispatched, STEP 7
    "cycles": {"UPDATE": frozenset({"applied_batches", "groups_listed", "unsettled", "expected_batches", "failures",
                                    "dispatched", "blocked_reason", "open_deletes", "planned_deletes", "outcome",
                                    # a retired coverage's cycle found its backend's owners (rule 24)
                                    "finished_at", "origin_seen"})},
    "cycle_batches": {"INSERT": ALL},
    # the action; a marked group's time to go (rule 23)
    "cycle_groups": {"INSERT": ALL, "UPDATE": frozenset({"action", "delete_after"})},
    # oc_apply_batch's upsert, and STEP 7 closing the orphans not seen again
    "orphans": {"INSERT": ALL, "UPDATE": frozenset({"last_seen", "resources", "verdict", "reason", "times_reported",
                                                    "last_cycle_id", "state", "orphan_since", "size",
                                                    "deleted_at"})},
    # a delete cycle's marks (rule 23): kept, started over, ended
    "orphan_marks": {"INSERT": ALL, "UPDATE": frozenset({"reason", "member_ids", "marked_at", "cycle_id"}),
                     "DELETE": True},
    "delete_requests": {"INSERT": ALL},
    "events": {"INSERT": ALL},
}
DELETER: Grants = {
    "cleanup": {"UPDATE": _FINISH_CLEANUP},
    # a deletion recorded (``LockedCycle.record_delete``), STEP 7
    "cycles": {"UPDATE": frozenset({"open_deletes", "unsettled", "failed", "tripped_regions", "error", "outcome",
                                    "finished_at"})},
    "cycle_groups": {"UPDATE": frozenset({"action", "error", "updated_at", "evidence", "verdict", "reason"})},
    "orphans": {"UPDATE": frozenset({"state", "last_error", "verdict", "reason", "deleted_at"})},
    "delete_requests": {"UPDATE": frozenset({"state", "attempts", "result", "updated_at"})},
    "delete_gates": {"INSERT": ALL, "UPDATE": frozenset({"holder", "expires_at"}), "DELETE": True},
    "events": {"INSERT": ALL},
    "provider_journal": {"INSERT": _JOURNAL_ROW},
}


def _union(*roles: Grants) -> Grants:
    out: Grants = {}
    for grants in roles:
        for table, privileges in grants.items():
            mine = out.setdefault(table, {})
            for privilege, columns in privileges.items():
                before = mine.get(privilege)
                if before is None or columns in (ALL, True):
                    mine[privilege] = columns
                elif before not in (ALL, True):
                    mine[privilege] = before | columns
    return out


# The runtime role: the three functions at once, and a manual run's heartbeat (``extend_lease``:
# the lease, the cycle's deadline, the delete gate).
RUNTIME: Grants = _union(LISTER, CLASSIFIER, DELETER, {"cycles": {"UPDATE": frozenset({"deadline"})}})
ALLOWED: dict[str, Grants] = {"lister": LISTER, "classifier": CLASSIFIER, "deleter": DELETER, "runtime": RUNTIME}
# nextval() of the sequences behind the ids of the rows each role inserts
SEQUENCES = {"lister": {"events_id_seq"}, "classifier": {"events_id_seq"},
             "deleter": {"events_id_seq", "provider_journal_id_seq"},
             "runtime": {"events_id_seq", "provider_journal_id_seq"}}
WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")


def _roles(of: Ledger) -> dict[str, str]:
    return {"runtime": of.runtime, **of.functions}


def _columns(conn: pg8000.native.Connection) -> dict[str, list[str]]:
    """Every table of the ledger's schema (the product's, the C1 tables, the logs) and its columns."""
    rows = conn.run("SELECT c.relname, a.attname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
                    " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')"
                    " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY c.relname, a.attnum")
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def _catalog_grants(conn: pg8000.native.Connection, role: str) -> Grants:
    """What pg_catalog grants ``role`` on the tables (table-level: ALL; column-level: the columns)."""
    out: Grants = {}
    for table, privilege in conn.run(
            "SELECT c.relname, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a"
            " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')"
            " AND a.grantee = to_regrole(:r)", r=role):
        out.setdefault(table, {})[privilege] = True if privilege in ("DELETE", "TRUNCATE") else ALL
    for table, privilege, column in conn.run(
            "SELECT c.relname, a.privilege_type, att.attname FROM pg_class c"
            " JOIN pg_attribute att ON att.attrelid = c.oid AND att.attnum > 0 AND NOT att.attisdropped,"
            " aclexplode(att.attacl) a"
            " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')"
            " AND a.grantee = to_regrole(:r)", r=role):
        mine = out.setdefault(table, {})
        if mine.get(privilege) != ALL:
            mine[privilege] = mine.get(privilege, frozenset()) | {column}
    return out


def test_the_catalog_grants_each_role_exactly_the_declared_writes(ledger):  # noqa: F811 - the fixture
    with connect(ledger.admin) as conn:
        tables = _columns(conn)
        for name, role in _roles(ledger).items():
            # every role reads every table, and writes only what ALLOWED declares
            expected = {t: {"SELECT": ALL, **ALLOWED[name].get(t, {})} for t in tables}
            actual = _catalog_grants(conn, role)
            assert {t: actual.get(t, {}) for t in tables} == expected, name
            assert set(actual) <= set(tables), name
            sequences = {r[0] for r in conn.run(
                "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'"
                " AND (has_sequence_privilege(:r, c.oid, 'USAGE') OR has_sequence_privilege(:r, c.oid, 'UPDATE'))",
                r=role)}
            assert sequences == SEQUENCES[name], name
        # and PUBLIC writes nothing (the roles are NOINHERIT, but PUBLIC's grants reach every role)
        public = conn.run("SELECT c.relname, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a"
                          " WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = 0"
                          " AND a.privilege_type <> 'SELECT'")
        public += conn.run("SELECT c.relname, att.attname FROM pg_class c JOIN pg_attribute att"
                           " ON att.attrelid = c.oid, aclexplode(att.attacl) a"
                           " WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = 0")
        assert public == []


def _writes(table: str, columns: list[str], allowed: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the writes of ``table`` to try that must be refused, those that must be allowed),
    generated from its columns: one INSERT and one UPDATE per column, DELETE, TRUNCATE."""
    refused, permitted = [], []
    for privilege, sql in (("INSERT", "INSERT INTO {t} ({c}) SELECT NULL WHERE false"),
                           ("UPDATE", "UPDATE {t} SET {c} = {c} WHERE false")):
        given = allowed.get(privilege, frozenset())
        for column in columns:
            (permitted if given == ALL or column in given else refused).append(sql.format(t=table, c=column))
    (permitted if allowed.get("DELETE") else refused).append(f"DELETE FROM {table} WHERE false")
    refused.append(f"TRUNCATE {table}")  # nobody truncates
    return refused, permitted


def test_every_write_a_roles_code_never_makes_is_refused(ledger):  # noqa: F811 - the fixture
    with connect(ledger.admin) as conn:
        tables = _columns(conn)
    wrong: list[str] = []
    tried = 0
    for name, role in _roles(ledger).items():
        conn = connect(ledger.info(role))
        try:
            conn.run("BEGIN")
            for table, columns in tables.items():
                refused, permitted = _writes(table, columns, ALLOWED[name].get(table, {}))
                for sql, must_refuse in [(s, True) for s in refused] + [(s, False) for s in permitted]:
                    tried += 1
                    conn.run("SAVEPOINT attempt")
                    try:
                        conn.run(sql)
                        state = None
                    except pg8000.native.DatabaseError as e:
                        state = sqlstate(e)
                    conn.run("ROLLBACK TO SAVEPOINT attempt")
                    if must_refuse and state != "42501":
                        wrong.append(f"{name}: {sql}: {'allowed' if state is None else state}, not permission denied")
                    elif not must_refuse and state is not None:
                        wrong.append(f"{name}: {sql}: refused ({state}) but its code makes it")
                if conn.run("SELECT has_table_privilege(current_user, :t, 'TRIGGER')"
                            " OR has_any_column_privilege(current_user, :t, 'REFERENCES')", t=table)[0][0]:
                    wrong.append(f"{name}: REFERENCES or TRIGGER on {table}")
            conn.run("ROLLBACK")
        finally:
            conn.close()
    assert tried > 4 * 150  # generated from the catalog: every table, column and role
    assert wrong == [], "\n".join(wrong)
