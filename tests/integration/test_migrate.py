"""Migrations: idempotent, safe concurrently, and the C1 ledger exactly as documented."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from orphan_cleanup.core.errors import ConfigError, SchemaNotMigrated
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.migrate import available_migrations, migrate, pending_migrations, require_current_schema

ALL = [name for _, name, _ in available_migrations()]


def schema(db: Database) -> dict[str, list]:
    """Everything a migration could change, in a comparable form."""
    with db.connection() as conn:
        return {
            "columns": conn.run(
                "SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"),
            "constraints": conn.run(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"),
            "indexes": conn.run("SELECT tablename, indexname, indexdef FROM pg_indexes"
                                " WHERE schemaname = 'public' ORDER BY 1, 2"),
            "triggers": conn.run("SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger"
                                 " WHERE NOT tgisinternal ORDER BY 1, 2"),
            "functions": conn.run("SELECT proname, md5(prosrc) FROM pg_proc"
                                  " WHERE pronamespace = 'public'::regnamespace ORDER BY 1"),
        }


def versions(db: Database) -> list[int]:
    with db.connection() as conn:
        return [r[0] for r in conn.run("SELECT version FROM schema_migrations ORDER BY version")]


def test_migrate_twice_gives_the_same_schema(empty_db):
    # given an empty database migrated once
    assert migrate(empty_db) == ALL
    first = schema(empty_db)
    assert first["columns"], "the first migration created nothing"
    # when migrated again
    assert migrate(empty_db) == []
    # then nothing changed
    assert schema(empty_db) == first
    assert versions(empty_db) == sorted(v for v, _, _ in available_migrations())


def test_migrate_concurrently_from_two_threads(empty_db):
    # given two migrators starting at the same moment on an empty database
    barrier = threading.Barrier(2)
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = migrate(empty_db)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # then both succeed, and each migration was applied exactly once
    assert errors == []
    assert sorted(results[0] + results[1]) == sorted(ALL)
    assert versions(empty_db) == sorted(v for v, _, _ in available_migrations())


# C1: (data_type, udt_name, nullable) of each documented column.
C1 = {
    "backends": {
        "id": ("text", "text"), "provider": ("text", "text"), "account": ("text", "text"),
        "regions": ("ARRAY", "_text"), "settings": ("jsonb", "jsonb"), "mode": ("text", "text"),
    },
    "provider_refs": {
        "provider_ref": ("text", "text"), "owner_type": ("text", "text"), "owner_id": ("text", "text"),
        "owner_name": ("text", "text"), "issued_at": ("timestamp with time zone", "timestamptz"),
    },
    "instances": {
        "id": ("text", "text"), "name": ("text", "text"), "provider_ref": ("text", "text"),
        "status": ("text", "text"), "backend_id": ("text", "text"), "primary_id": ("text", "text"),
        "region": ("text", "text"), "created_at": ("timestamp with time zone", "timestamptz"),
        "provisioned_at": ("timestamp with time zone", "timestamptz"),
        "terminated_at": ("timestamp with time zone", "timestamptz"),
        "deleted_at": ("timestamp with time zone", "timestamptz"),
    },
}
NULLABLE = {("backends", "mode"), ("instances", "backend_id"), ("instances", "primary_id"),
            ("instances", "region"), ("instances", "provisioned_at"), ("instances", "terminated_at"),
            ("instances", "deleted_at")}


def columns(db: Database, table: str) -> dict[str, tuple[str, str, str, str | None]]:
    with db.connection() as conn:
        rows = conn.run("SELECT column_name, data_type, udt_name, is_nullable, column_default"
                        " FROM information_schema.columns WHERE table_schema = 'public' AND table_name = :t",
                        t=table)
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


def key_columns(db: Database, table: str, kind: str) -> list[str]:
    with db.connection() as conn:
        rows = conn.run(
            "SELECT k.column_name FROM information_schema.table_constraints c"
            " JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name)"
            " WHERE c.table_schema = 'public' AND c.table_name = :t AND c.constraint_type = :k"
            " ORDER BY k.column_name", t=table, k=kind)
    return [r[0] for r in rows]


def test_c1_tables_and_columns_exist_as_documented(db):
    for table, expected in C1.items():
        found = columns(db, table)
        # every contract column, with its documented type
        assert {c: found[c][:2] for c in expected if c in found} == expected, table
        # the nullable ones really accept NULL
        for c in expected:
            if (table, c) in NULLABLE:
                assert found[c][2] == "YES", (table, c)
        # any extra column has a default, so contract-only INSERTs work
        for c, (_, _, _nullable, default) in found.items():
            if c not in expected:
                assert default is not None, f"{table}.{c} is an extra column without a default"


def test_c1_keys(db):
    assert key_columns(db, "backends", "PRIMARY KEY") == ["id"]
    assert key_columns(db, "provider_refs", "PRIMARY KEY") == ["provider_ref"]
    assert key_columns(db, "instances", "PRIMARY KEY") == ["id"]
    assert key_columns(db, "instances", "UNIQUE") == ["provider_ref"]
    assert key_columns(db, "instances", "FOREIGN KEY") == ["provider_ref"]
    with db.connection() as conn:
        target = conn.run(
            "SELECT ccu.table_name, ccu.column_name FROM information_schema.table_constraints c"
            " JOIN information_schema.constraint_column_usage ccu USING (constraint_schema, constraint_name)"
            " WHERE c.table_name = 'instances' AND c.constraint_type = 'FOREIGN KEY'")
    assert target == [["provider_refs", "provider_ref"]]


def test_plain_insert_of_only_c1_columns_works(db):
    # given a platform writing the ledger with plain SQL, contract columns only
    t = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    with db.transaction() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " VALUES ('aws-prod', 'aws', '123456789012', '{us-east-1,eu-west-1}', '{\"role_arn\": \"r\"}', NULL)")
        conn.run("INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)"
                 " VALUES ('abcdef123456', 'instance', 'inst-1', 'train-1', :t)", t=t)
        conn.run("INSERT INTO instances (id, name, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at, terminated_at, deleted_at)"
                 " VALUES ('inst-1', 'train-1', 'abcdef123456', 'busy', 'aws-prod', 'i-0abc', 'us-east-1',"
                 " :t, :t, NULL, NULL)", t=t)
        # and the smallest inserts the contract allows
        conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                 " VALUES ('gcp-main', 'gcp', 'my-project', '{us-central1}', '{}')")
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id) VALUES ('zyxwvu987654', 'inst-2')")
        conn.run("INSERT INTO instances (id, provider_ref, status) VALUES ('inst-2', 'zyxwvu987654', 'pending')")
    # then the rows read back as written, with defaults elsewhere
    with db.connection() as conn:
        assert conn.run("SELECT id, provider, account, regions, mode FROM backends ORDER BY id") == [
            ["aws-prod", "aws", "123456789012", ["us-east-1", "eu-west-1"], None],
            ["gcp-main", "gcp", "my-project", ["us-central1"], None]]
        assert conn.run("SELECT owner_type, issued_at IS NOT NULL FROM provider_refs"
                        " WHERE provider_ref = 'zyxwvu987654'") == [["instance", True]]
        assert conn.run("SELECT status, backend_id, primary_id, provisioned_at FROM instances WHERE id = 'inst-1'") \
            == [["busy", "aws-prod", "i-0abc", t]]


def test_existing_c1_tables_missing_contract_columns_stop_migrate_before_anything(empty_db):
    # given a platform's own provider_refs table, one contract column short, and no other table
    with empty_db.transaction() as conn:
        conn.run("CREATE TABLE provider_refs (provider_ref text PRIMARY KEY, owner_id text, owner_name text,"
                 " issued_at timestamptz)")
    # when migrated, then the missing column is named and nothing was created
    with pytest.raises(ConfigError, match=r"^provider_refs\.owner_type missing: "):
        migrate(empty_db)
    with empty_db.connection() as conn:
        assert conn.run("SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == [["provider_refs"]]
    # and once the column exists, migrate proceeds (the tables it lacks are created)
    with empty_db.transaction() as conn:
        conn.run("ALTER TABLE provider_refs ADD COLUMN owner_type text NOT NULL DEFAULT 'instance'")
    assert migrate(empty_db) == ALL


def test_the_read_only_schema_check(empty_db):
    # nothing applied: every migration is pending, and the check refuses (without creating anything)
    assert pending_migrations(empty_db) == ALL
    with pytest.raises(SchemaNotMigrated):
        require_current_schema(empty_db)
    with empty_db.connection() as conn:
        assert conn.run("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [[0]]
    # all applied: nothing pending
    migrate(empty_db)
    assert pending_migrations(empty_db) == []
    require_current_schema(empty_db)
    # one missing (a database older than this version): refused again
    with empty_db.connection() as conn:
        conn.run("DELETE FROM schema_migrations WHERE name = :n", n=ALL[-1])
    assert pending_migrations(empty_db) == [ALL[-1]]
    with pytest.raises(SchemaNotMigrated):
        require_current_schema(empty_db)
