"""Errors say their true cause and name what works (README.md, "Running it by hand": one
line, no traceback; SAFETY.md rule 22: no secret in it). The CLI runs as a user runs it,
`python -m orphan_cleanup` in a subprocess, against the tests' real Postgres; network
failures are real sockets on this machine."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database, describe
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, db_now, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

PASSWORD = "s3cret-pw"


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


def cli(*args: str, db: Database | None = None, cwd: Path | None = None,
        **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("ORPHAN_CLEANUP_", "GOOGLE_", "CLOUDSDK_")) and k != "DATABASE_URL"}
    environ.update(NO_COLOR="1", ORPHAN_CLEANUP_DATA_DIR="/nonexistent/never-used")
    if db is not None:
        environ["DATABASE_URL"] = db.info.url()
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("orphan-cleanup: error:")]


# ---- GCP without credentials -------------------------------------------------------

def test_a_gcp_backend_without_credentials_names_what_works_and_not_credentials_json(db, tmp_path):
    add_backend(db, "gcp-main", provider="gcp", account="my-project", regions=("us-central1",))

    # No key, no GOOGLE_APPLICATION_CREDENTIALS, no gcloud login (an empty HOME), no metadata server.
    proc = cli("run", "--backend", "gcp-main", db=db, HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path),
               NO_GCE_CHECK="True")

    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert "no GCP credentials" in said, said
    assert "credentials_json" not in said  # the deployed functions refuse a key in the ledger
    assert "service account" in said and "credentials_file" in said, said
    assert "application-default" in said, said  # the CLI's ADC: gcloud auth application-default login


# ---- explain on a removed backend ---------------------------------------------------

def recorded_leak(db: Database, backend: str) -> str:
    add_backend(db, backend)
    cloud = MemoryCloud()
    at = db_now(db) - timedelta(hours=2)
    ref = make_ref()
    iid = cloud.create(ResourceKind.INSTANCE, "us-east-1", {"provider_ref": ref}, created_at=at)
    add_instance(db, ref=ref, status="terminated", backend_id=backend, primary_id=iid, region="us-east-1",
                 issued_at=at, created_at=at, provisioned_at=at, terminated_at=at)
    pipeline = Pipeline(settings=Settings.explicit(confirm_seconds=0),
                        db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    run_cycle(pipeline, backend)
    return iid


def test_explain_on_a_removed_backend_says_it_was_removed_and_suggests_no_run_of_it(db):
    iid = recorded_leak(db, "aws-old")
    removed = cli("backend", "remove", "aws-old", db=db)
    assert removed.returncode == 0, removed.stderr

    missing = cli("explain", "--backend", "aws-old", "i-0never0listed0", db=db)
    found = cli("explain", "--backend", "aws-old", iid, db=db)

    assert missing.returncode == 1, missing.stderr
    assert "run --backend aws-old" not in missing.stdout + missing.stderr
    assert "backend aws-old was removed" in missing.stderr, missing.stderr
    assert found.returncode == 0, found.stderr  # its history is still explained
    assert iid in found.stdout and "run --backend aws-old" not in found.stdout + found.stderr
    assert "backend aws-old was removed" in found.stderr, found.stderr


# ---- database network errors ------------------------------------------------------

@pytest.fixture
def closing_server() -> Iterator[int]:
    """Accepts each connection and closes it at once, before any answer: what a firewall or
    proxy in front of an unroutable address does (pg8000 says only "network error")."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Takes connections (the kernel's backlog) and never answers: a read that times out."""
    server = socket.create_server(("127.0.0.1", 0), backlog=8)
    yield server.getsockname()[1]
    server.close()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def url(host: str, port: int) -> str:
    return f"postgresql://cleanup:{PASSWORD}@{host}:{port}/platform"


@pytest.mark.parametrize("case", ["closed", "refused", "dns"])
def test_a_database_that_cannot_be_reached_says_why_in_one_line_without_the_password(case, closing_server):
    target = {"closed": url("127.0.0.1", closing_server), "refused": url("127.0.0.1", free_port()),
              "dns": url("db.nowhere.invalid", 5432)}[case]
    proc = cli("status", DATABASE_URL=target)

    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and proc.stderr.strip() == lines[0], proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr  # SAFETY.md rule 22
    expected = {"closed": "closed the connection before any answer", "refused": "connection refused",
                "dns": "DNS failure"}[case]
    assert expected in lines[0], lines[0]
    assert not lines[0].endswith("network error"), lines[0]


def test_a_server_that_never_answers_is_a_timeout(silent_server):
    from orphan_cleanup.core.errors import DatabaseError
    from orphan_cleanup.ledger.db import connect
    from orphan_cleanup.ledger.url import parse_database_url

    with pytest.raises(DatabaseError) as caught:
        connect(parse_database_url(url("127.0.0.1", silent_server)), timeout=1)

    assert "timed out" in str(caught.value) and PASSWORD not in str(caught.value), caught.value
    assert "network error" not in str(caught.value)


@pytest.mark.parametrize(("code", "said"), [(errno.EHOSTUNREACH, "unreachable"), (errno.ENETUNREACH, "unreachable"),
                                            (errno.ETIMEDOUT, "timed out"), (errno.ECONNREFUSED, "refused")])
def test_each_socket_failure_is_named(code, said):
    from pg8000.exceptions import InterfaceError

    try:
        try:
            raise OSError(code, os.strerror(code))
        except OSError as e:
            raise InterfaceError("network error") from e  # as pg8000 wraps a socket's failure
    except InterfaceError as wrapped:
        assert said in describe(wrapped), describe(wrapped)
