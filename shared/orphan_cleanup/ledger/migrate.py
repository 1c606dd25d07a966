"""Versioned schema migrations, safe to run twice and from two processes at once."""

from __future__ import annotations

from importlib import resources

from orphan_cleanup.ledger.db import Database

# Any constant works: it names this product's migration lock among advisory locks.
MIGRATION_LOCK_KEY = 0x6F7270686E  # "orphn"


def available_migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of the packaged migrations, in order."""
    folder = resources.files("orphan_cleanup.ledger") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def migrate(db: Database) -> list[str]:
    """Apply the migrations not applied yet, each in its own transaction under an
    advisory lock, and return the names applied by this call."""
    applied_now: list[str] = []
    with db.transaction() as conn:
        conn.run("SELECT pg_advisory_xact_lock(:k)", k=MIGRATION_LOCK_KEY)
        conn.run(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.run("SELECT version FROM schema_migrations")}
        for version, name, sql in available_migrations():
            if version in done:
                continue
            conn.run(sql)
            conn.run("INSERT INTO schema_migrations (version, name) VALUES (:v, :n)", v=version, n=name)
            applied_now.append(name)
    return applied_now
