"""The demo's throwaway world: an embedded Postgres in a temp dir, a moto server
on 127.0.0.1, and the settings and AWS session that point at them.

Nothing outside the temp dir is touched and no real AWS account is reachable:
every AWS client the demo builds gets fake credentials and moto's URL
explicitly; this process's environment and boto3's default session are left
alone. Everything is stopped and deleted on the way out.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.embedded import EmbeddedMissing, ensure_database, start_embedded, stop_embedded
from orphan_cleanup.ledger.migrate import migrate

DB_NAME = "orphan_cleanup_demo"
REGION = "us-east-1"
FAKE_KEY = "demo"


@dataclass(frozen=True)
class DemoWorld:
    db: Database
    aws_url: str
    data_dir: Path
    # The defaults, with AWS calls sent to moto; nothing read from this shell.
    settings: Settings

    def aws_session(self) -> Any:
        """A fresh boto3 session with the demo's fake credentials (one per thread
        or adapter: sessions are not thread-safe)."""
        return fake_aws_session()

    def client(self, service: str) -> Any:
        """A client of ``service`` on moto."""
        return self.aws_session().client(service, region_name=REGION, endpoint_url=self.aws_url)


def fake_aws_session() -> Any:
    """Fixed fake credentials and region. No profile, config or credentials file
    from this shell's ``AWS_*`` variables or ~/.aws: an SSO profile or a session
    token there must not reach the demo, nor a missing profile break it."""
    import boto3
    import botocore.session

    isolated = botocore.session.Session(session_vars={
        # logical name: (config file key, environment variable, default, conversion)
        "profile": (None, None, None, None),
        "config_file": (None, None, os.devnull, None),
        "credentials_file": (None, None, os.devnull, None),
    })
    return boto3.Session(aws_access_key_id=FAKE_KEY, aws_secret_access_key=FAKE_KEY, region_name=REGION,
                         botocore_session=isolated)


@contextmanager
def embedded_postgres(root: Path) -> Iterator[Database]:
    """A fresh, migrated database on an embedded server in ``root``; the
    server is stopped and its data dir deleted on exit."""
    try:
        info = start_embedded(root, cleanup="delete")
    except EmbeddedMissing as e:
        why = " (it never uses DATABASE_URL, which is set in this shell)" if os.environ.get("DATABASE_URL") else ""
        raise ConfigError(f"the demo runs on its own embedded Postgres{why}, and {e}") from None
    try:
        db = Database(ensure_database(info, DB_NAME))
        migrate(db)
        yield db
    finally:
        stop_embedded(root)


@contextmanager
def moto_server() -> Iterator[str]:
    """moto in server mode on 127.0.0.1 and a free port; yields its URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        raise ConfigError("the demo needs moto, from the contributors' install (README, \"Setup and tests\"):"
                          " pip install --require-hashes -r requirements/dev.txt"
                          " && pip install --no-deps --no-build-isolation -e .") from e
    from orphan_cleanup.demo.moto_gaps import filled

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        with filled():  # placement groups, key pairs by id: what moto lacks of EC2 (moto_gaps)
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
    finally:
        server.stop()


#: The demo's short margin, the stack's (a backend row may only lengthen it): it waits it
#: out instead of the default 300 s.
MARGIN_SECONDS = 5
#: The demo's confirmation window (SAFETY.md rule 23; the interval, 900 s, by default): a delete
#: cycle marks an orphan, the next one this much later deletes it.
CONFIRM_SECONDS = 4


@contextmanager
def demo_world(progress: Callable[[str], None]) -> Iterator[DemoWorld]:
    """Postgres + moto, and the settings pointing at them, all torn down on exit."""
    root = Path(tempfile.mkdtemp(prefix="orphan-cleanup-demo-"))
    try:
        progress(f"starting an embedded Postgres in {root} ...")
        with embedded_postgres(root) as db:
            progress("starting moto (a fake AWS) on 127.0.0.1 ...")
            with moto_server() as url:
                yield DemoWorld(db=db, aws_url=url, data_dir=root,
                                settings=Settings.explicit(aws_endpoint_url=url, data_dir=str(root),
                                                           margin_seconds=MARGIN_SECONDS,
                                                           confirm_seconds=CONFIRM_SECONDS))
                progress("stopping moto ...")
            progress("stopping Postgres and deleting its data dir ...")
    finally:
        shutil.rmtree(root, ignore_errors=True)
