"""Connection reuse across transactions (keep_idle) and recovery when the server drops it."""

import pytest

from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.ledger.db import Database


def backend_pid(db: Database) -> int:
    with db.transaction() as conn:
        return conn.run("SELECT pg_backend_pid()")[0][0]


def test_transactions_reuse_one_connection_per_thread(db):
    pooled = Database(db.info, keep_idle=True)
    assert backend_pid(pooled) == backend_pid(pooled)
    plain = Database(db.info)
    assert backend_pid(plain) != backend_pid(plain)


def test_a_connection_dropped_while_idle_is_replaced(db):
    pooled = Database(db.info, keep_idle=True)
    first = backend_pid(pooled)
    with db.connection() as admin:
        admin.run("SELECT pg_terminate_backend(:p)", p=first)

    assert backend_pid(pooled) != first  # the next transaction works on a fresh connection


def test_a_failed_transaction_does_not_keep_its_connection(db):
    pooled = Database(db.info, keep_idle=True)
    first = backend_pid(pooled)
    try:
        with pooled.transaction() as conn:
            conn.run("SELECT 1/0")
    except Exception:  # noqa: BLE001 - the failure itself is not under test
        pass
    assert backend_pid(pooled) != first
    pooled.close()


def test_a_socket_that_times_out_mid_statement_is_a_database_error_not_a_traceback(db):
    # pg8000 lets the socket's own TimeoutError through; the CLI and the functions catch DatabaseError
    pooled = Database(db.info, keep_idle=True)
    for use in (pooled.transaction, pooled.connection):
        with pytest.raises(DatabaseError, match="timed out"):
            with use() as conn:
                conn._usock.settimeout(0.2)  # the socket timeout every connection has, made short
                conn.run("SELECT pg_sleep(3)")
        assert backend_pid(pooled) > 0  # and the next use works on a fresh connection
