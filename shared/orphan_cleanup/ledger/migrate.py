"""Versioned schema migrations, safe to run twice and from two processes at once;
and the read-only check that a database is migrated (``require_current_schema``)."""

from __future__ import annotations

from importlib import resources

from pg8000.exceptions import DatabaseError as PgDatabaseError

from orphan_cleanup.core.errors import ConfigError, SchemaNotMigrated
from orphan_cleanup.ledger import grants
from orphan_cleanup.ledger.db import Database, sqlstate
from orphan_cleanup.ledger.grants import RoleNames

# Any constant works: it names this product's migration lock among advisory locks.
MIGRATION_LOCK_KEY = 0x6F7270686E  # "orphn"

# README contract C1: the columns a platform's own ledger tables must have (extra ones are fine).
C1_COLUMNS: dict[str, tuple[str, ...]] = {
    "backends": ("id", "provider", "account", "regions", "settings", "mode"),
    "provider_refs": ("provider_ref", "owner_type", "owner_id", "owner_name", "issued_at"),
    "instances": ("id", "name", "provider_ref", "status", "backend_id", "primary_id", "region", "created_at",
                  "provisioned_at", "terminated_at", "deleted_at"),
    "volumes": ("id", "name", "provider_ref", "status", "backend_id", "primary_id", "region", "created_at",
                "provisioned_at", "deleted_at"),
}

# The columns of the C1 tables that exist in the schema migrations create tables in
# (``CREATE TABLE IF NOT EXISTS`` looks only there). pg_catalog, not
# information_schema: the latter hides columns the current role has no privilege on.
_EXISTING_C1 = (
    "SELECT c.relname, a.attname FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()"
    " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
    " WHERE c.relname = ANY(CAST(:t AS text[]))")


# The schema search_path names first (a "$user" entry counts only when that schema exists,
# as PostgreSQL resolves it), and the one the session actually creates in. They differ when
# the first schema does not exist: then current_schema() is a later one (often public),
# and migrate must not create the ledger there, beside a platform's same-named tables.
_SCHEMAS = (
    "SELECT current_schema(), current_setting('search_path'), current_user,"
    " to_regnamespace(quote_ident(current_user)) IS NOT NULL")

# The product's functions (triggers on the C1 tables included) resolve their tables by the
# search_path of whoever runs them; a platform writing orphan_cleanup.instances from
# search_path=public would otherwise make a trigger read public.backends, the platform's
# own table. Each function is pinned to the schema it lives in.
_UNPINNED_FUNCTIONS = (
    "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    " WHERE n.nspname = current_schema() AND (p.proname LIKE 'oc\\_%' OR p.proname LIKE 'orphan\\_cleanup\\_%')"
    " AND NOT coalesce(p.proconfig @> ARRAY[format('search_path=%I, pg_temp', current_schema())], false)")


def first_schema(search_path: str, user: str, user_schema_exists: bool) -> str | None:
    """The schema ``search_path`` puts first, as PostgreSQL reads it: entries are
    comma-separated, maybe double-quoted; ``$user`` is the session user's schema, skipped
    when it does not exist; ``pg_temp``/``pg_catalog`` are never where tables go."""
    for raw in search_path.split(","):
        entry = raw.strip()
        if entry.startswith('"') and entry.endswith('"') and len(entry) >= 2:
            entry = entry[1:-1].replace('""', '"')
        elif entry != "$user":
            entry = entry.lower()
        if entry == "$user":
            if user_schema_exists:
                return user
            continue
        if entry and entry not in ("pg_temp", "pg_catalog"):
            return entry
    return None


def available_migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of the packaged migrations, in order."""
    folder = resources.files("orphan_cleanup.ledger") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def missing_c1_columns(found: dict[str, set[str]]) -> list[str]:
    """``table.column`` of every C1 column missing from the C1 tables in ``found``
    (table -> its columns; a table not in ``found`` does not exist yet: migrations create it)."""
    return [f"{table}.{column}" for table, columns in C1_COLUMNS.items() if table in found
            for column in columns if column not in found[table]]


def migrate(db: Database, *, through: int | None = None) -> list[str]:
    """Apply the migrations not applied yet (up to version ``through``, when given), each in
    its own transaction under an advisory lock, and return the names applied by this call.

    First, under the lock: C1 tables the platform created itself must have every
    contract column, or nothing is applied and a ``ConfigError`` names each missing one
    (a migration would otherwise fail half-way on the first one it touches)."""
    return migrate_and_grant(db, None, through=through)[0]


def migrate_and_grant(db: Database, roles: RoleNames | None, *,
                      through: int | None = None) -> tuple[list[str], tuple[str, ...]]:
    """``migrate``, then, in the same transaction, roles.sql's grants for ``roles`` (ledger/
    grants.py): the migrations applied and the roles granted. No role of roles.sql in the
    database: no grants (the embedded database). Roles that exist but that this connection
    cannot grant (not the owner role's, other names, a grant refused) while migrations are
    pending: nothing is applied, and the ``ConfigError`` names the command to run instead
    (docs/DATABASE.md, "4. Roles": a table a migration adds is born read-only for every role)."""
    applied_now: list[str] = []
    granted: tuple[str, ...] = ()
    with db.transaction() as conn:
        conn.run("SELECT pg_advisory_xact_lock(:k)", k=MIGRATION_LOCK_KEY)
        current, search_path, user, user_schema = conn.run(_SCHEMAS)[0]
        wanted = first_schema(search_path, user, user_schema)
        if current is None or (wanted is not None and current != wanted):
            raise ConfigError(f"schema {wanted or search_path!r}, the first of search_path ({search_path}), does"
                              " not exist: create it (infra/postgres/roles.sql -v schema=NAME does), then migrate"
                              " again. Nothing was applied")
        found: dict[str, set[str]] = {}
        for table, column in conn.run(_EXISTING_C1, t=list(C1_COLUMNS)):
            found.setdefault(table, set()).update([column] if column else [])
        missing = missing_c1_columns(found)
        if missing:
            raise ConfigError(f"{', '.join(missing)} missing: the existing ledger tables lack these contract columns"
                              " (README, \"The ledger (contract C1)\"); add them, then migrate again."
                              " Nothing was applied")
        conn.run(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.run("SELECT version FROM schema_migrations")}
        pending = [(version, name, sql) for version, name, sql in available_migrations()
                   if version not in done and (through is None or version <= through)]
        grant, why = grants.blocker(conn, roles) if roles is not None else (False, None)
        if why is not None and pending:
            raise grants.refusal(len(pending), why)
        for version, name, sql in pending:
            conn.run(sql)
            conn.run("INSERT INTO schema_migrations (version, name) VALUES (:v, :n)", v=version, n=name)
            applied_now.append(name)
        for (function,) in conn.run(_UNPINNED_FUNCTIONS):
            # SAFETY.md rule 9: a trigger that read another schema's table could miss activity.
            conn.run(f"ALTER FUNCTION {function} SET search_path = {_ident(current)}, pg_temp")
        if grant and roles is not None:
            try:
                grants.apply(conn, roles, current)
            except PgDatabaseError as exc:
                if sqlstate(exc) != "42501" or not pending:
                    raise
                raise grants.refusal(len(pending), _message(exc)) from None
            granted = (roles.runtime, roles.lister, roles.classifier, roles.deleter)
    return applied_now, granted


def _message(exc: Exception) -> str:
    args = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    return str(args.get("M", exc))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pending_migrations(db: Database) -> list[str]:
    """The packaged migrations this database lacks (all of them when it has none).
    Read-only: two SELECTs in a read-only transaction, no DDL, no lock; works for a
    role with only SELECT (its connection is kept for the command's next transaction)."""
    with db.transaction() as conn:
        conn.run("SET TRANSACTION READ ONLY")
        if conn.run("SELECT to_regclass('schema_migrations') IS NULL")[0][0]:
            done: set[int] = set()
        else:
            done = {row[0] for row in conn.run("SELECT version FROM schema_migrations")}
    return [name for version, name, _ in available_migrations() if version not in done]


def require_current_schema(db: Database) -> None:
    """``SchemaNotMigrated`` unless every packaged migration is applied: the check of
    every command that must not run DDL (``status``, ``backend list|show``, ``explain``)."""
    if pending_migrations(db):
        raise SchemaNotMigrated()
