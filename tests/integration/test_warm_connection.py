"""Warm functions keep one database connection across invocations (issue #17 item 4).

``Database(keep_idle=True)`` (what ``bootstrap`` opens for the functions and the CLI)
keeps one idle connection per thread for ``connection()`` (the hot paths' sessions)
and ``transaction()``. Connections are counted on the server (``pg_stat_activity``:
pid and start time of the sessions bearing this test's ``application_name``) and at
pg8000's door (its ``Connection`` class, wrapped by the test)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pg8000.native
import pytest

from functions.aws import classifier
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.entrypoints import aws
from orphan_cleanup.ledger.db import Database
from tests.integration.test_db_tls import BINDIR, tls_server  # noqa: F401 - the TLS server fixture
from tests.support.sqs_harness import DeployedQueues, context


def sessions(admin: Database, app: str) -> list[tuple[int, datetime]]:
    """(pid, backend start) of every server session named ``app``, other than the admin's own."""
    with admin.connection() as conn:
        return [tuple(r) for r in conn.run(  # type: ignore[misc]
            "SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = :a"
            " AND pid <> pg_backend_pid() ORDER BY pid", a=app)]


def sqs_event(body: str) -> dict[str, object]:
    """One SQS record as Lambda delivers it."""
    mid = str(uuid.uuid4())
    return {"Records": [{
        "messageId": mid, "receiptHandle": f"rh-{mid}", "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000", "SenderId": "AIDAEXAMPLE",
                       "ApproximateFirstReceiveTimestamp": "1700000000000"},
        "messageAttributes": {}, "md5OfBody": "0" * 32, "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:warm-listing", "awsRegion": "us-east-1"}]}


def pid(db: Database) -> int:
    with db.connection() as conn:
        return conn.run("SELECT pg_backend_pid()")[0][0]


@pytest.fixture
def pg8000_connects(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every pg8000 connection opened in this test (pg8000's class wrapped, our code untouched)."""
    opened: list[int] = []
    real = pg8000.native.Connection.__init__

    def counted(self: pg8000.native.Connection, *a: object, **kw: object) -> None:
        opened.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(pg8000.native.Connection, "__init__", counted)
    return opened


def test_sessions_reuse_one_connection_per_thread(db):
    pooled = Database(db.info, keep_idle=True)
    first = pid(pooled)
    with pooled.transaction() as conn:  # sessions and transactions share the idle connection
        assert conn.run("SELECT pg_backend_pid()")[0][0] == first
    assert pid(pooled) == first
    pooled.close()
    plain = Database(db.info)
    assert pid(plain) != pid(plain)


def test_a_session_dropped_while_idle_is_replaced_before_anything_runs(db):
    pooled = Database(db.info, keep_idle=True)
    first = pid(pooled)
    with db.connection() as admin:
        admin.run("SELECT pg_terminate_backend(:p, 5000)", p=first)  # waits until the backend is gone
    # no statement of the next session fails: the dead connection is seen before use
    assert pid(pooled) != first
    pooled.close()


def test_a_session_that_raised_or_left_a_transaction_open_is_not_kept(db):
    pooled = Database(db.info, keep_idle=True)
    first = pid(pooled)
    with pytest.raises(pg8000.native.DatabaseError), pooled.connection() as conn:
        conn.run("SELECT 1/0")
    second = pid(pooled)
    assert second != first
    with pooled.connection() as conn:
        conn.run("BEGIN")  # left open: the next user must not inherit it
    assert pid(pooled) != second
    pooled.close()


def test_the_warm_classifier_function_makes_one_connection_across_invocations(db, monkeypatch, moto_reset,
                                                                                pg8000_connects):
    # given the deployed classifier's wiring, its database named by an application_name of its own
    app = f"oc-warm-{uuid.uuid4().hex[:8]}"
    DeployedQueues(db, monkeypatch, "warm")
    monkeypatch.setenv("DATABASE_URL", db.info.url() + ("&" if "?" in db.info.url() else "?")
                       + f"application_name={app}")
    aws.common._pipeline.cache_clear()
    now = datetime.now(UTC)
    try:
        # when the Lambda handler is invoked twice (batches of cycles the ledger does not know:
        # one statement each, the record succeeds)
        for seq in range(2):
            body = ListingBatch(cycle_id=f"no-such-cycle-{seq}", backend="b", seq=seq,
                                listed_at=now).model_dump_json()
            assert classifier.handler(sqs_event(body), context("classifier")) == {"batchItemFailures": []}
            if seq == 0:
                after_first = sessions(db, app)
        # then one server session served both, and pg8000 opened one connection
        assert len(after_first) == 1
        assert sessions(db, app) == after_first
        assert len(pg8000_connects) == 1 + 1 + 1  # the function's, and the two reads of pg_stat_activity
    finally:
        aws.pipeline().db.close()
        aws.common._pipeline.cache_clear()


@pytest.mark.skipif(BINDIR is None, reason="needs a PostgreSQL server built with OpenSSL (see test_db_tls)")
def test_over_tls_a_warm_database_keeps_one_session_and_one_handshake(tls_server, pg8000_connects):  # noqa: F811
    """One TLS handshake for many uses: the same TLS session (pid) serves sessions and
    transactions; pg8000 opened (and so shook hands) once."""
    server = tls_server
    warm = Database.from_url(server.url(sslmode="verify-full", sslrootcert=str(server.ca)), keep_idle=True)
    seen = set()
    for _ in range(3):
        with warm.connection() as conn:
            seen.add(tuple(conn.run("SELECT pid, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")[0]))
        with warm.transaction() as conn:
            seen.add(tuple(conn.run("SELECT pid, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")[0]))
    warm.close()
    assert len(seen) == 1 and next(iter(seen))[1] is True
    assert len(pg8000_connects) == 1
