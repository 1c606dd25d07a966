"""Connections to Cloud SQL through the Cloud SQL Python Connector (the ``gcp`` extra).

The connector asks the Cloud SQL Admin API for the instance's address and an ephemeral
client certificate, opens a TLS connection to the instance's server-side proxy (port 3307)
and hands the socket to pg8000. The connector object is built at the composition root
(``entrypoints.bootstrap``); this module only turns its connections into the kind
``ledger.db`` uses, and its errors into ours.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pg8000.native
from pg8000.core import CoreConnection
from pg8000.exceptions import DatabaseError as PgDatabaseError
from pg8000.exceptions import InterfaceError as PgInterfaceError

from orphan_cleanup.core.errors import DatabaseError

DRIVER = "pg8000"


class CloudSqlOpener:
    """A ``ledger.db.Opener``: ``connector.connect(instance, "pg8000", ...)``.

    ``connector`` builds a ``google.cloud.sql.connector.Connector`` (or anything with its
    ``connect``), once, on the first connection: building one reads the credentials and
    starts its event loop thread, which a process that never connects should not pay or
    fail for. With ``iam_auth`` the connector logs in as the IAM database user the URL
    names, with the credentials' OAuth token: any password is dropped."""

    def __init__(self, connector: Callable[[], Any], instance: str, *, iam_auth: bool) -> None:
        self._factory = connector
        self._connector: Any = None
        self._lock = threading.Lock()
        self.instance = instance
        self.iam_auth = iam_auth
        self.where = f"Cloud SQL instance {instance}"

    def connector(self) -> Any:
        with self._lock:
            if self._connector is None:
                self._connector = self._factory()
            return self._connector

    def __call__(self, **kwargs: Any) -> pg8000.native.Connection:
        if self.iam_auth:
            kwargs.pop("password", None)
        connector = self.connector()
        try:
            conn = connector.connect(self.instance, DRIVER, enable_iam_auth=self.iam_auth, **kwargs)
        except (PgInterfaceError, PgDatabaseError, OSError):
            raise  # the server's answer or the socket's: ledger.db.connect translates them
        except Exception as e:  # noqa: BLE001 - the Admin API, google-auth and aiohttp raise their own types
            raise DatabaseError(f"cannot connect to the database at {self.where}/{kwargs.get('database')}:"
                                f" {type(e).__name__}:"
                                f" {' '.join(str(e).split())}") from e
        return as_native(conn)


def as_native(conn: Any) -> pg8000.native.Connection:
    """The connector's ``pg8000.dbapi.Connection`` as the ``pg8000.native.Connection``
    the rest of ``ledger`` uses (``run`` with named parameters).

    Both classes are pg8000's ``CoreConnection`` with nothing else of their own but
    methods: after the startup both hold the same state, and the native class adds
    ``run``/``prepare`` and a ``_context`` it sets in ``__init__``. The connector only
    offers the DB-API class, so the connection is re-classed (checked by
    tests/integration/test_cloud_sql.py on a real server)."""
    if isinstance(conn, pg8000.native.Connection):
        return conn
    if not isinstance(conn, CoreConnection):
        raise DatabaseError(f"the Cloud SQL connector returned a {type(conn).__name__}, not a pg8000 connection")
    conn.__class__ = pg8000.native.Connection
    conn._context = None
    return conn
