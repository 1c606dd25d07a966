"""Database access with pg8000: connections with timeouts, transactions, and
pg8000 errors translated into ``DatabaseError``. URL parsing is in ``url``,
the embedded server in ``embedded``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pg8000.native
from pg8000.exceptions import DatabaseError as PgDatabaseError
from pg8000.exceptions import InterfaceError as PgInterfaceError

from orphan_cleanup.errors import DatabaseError
from orphan_cleanup.ledger.url import ConnInfo, parse_database_url, ssl_context

__all__ = ["ConnInfo", "Database", "connect", "parse_database_url", "sqlstate"]


def connect(info: ConnInfo, *, timeout: float = 10.0, application_name: str = "orphan-cleanup",
            statement_timeout_ms: int = 60_000) -> pg8000.native.Connection:
    """Open a connection with a socket timeout and a server-side statement timeout."""
    kwargs: dict[str, Any] = dict(user=info.user, password=info.password, database=info.database,
                                  timeout=timeout, application_name=application_name)
    if info.unix_sock:
        # No TLS on a local socket (as libpq); None would also build a CA-loaded context per connection.
        kwargs.update(unix_sock=info.unix_sock, ssl_context=False)
    else:
        kwargs.update(host=info.host, port=info.port, ssl_context=ssl_context(info.sslmode))
    try:
        conn = pg8000.native.Connection(**kwargs)
        conn.run(f"SET statement_timeout = {int(statement_timeout_ms)}")
    except (PgInterfaceError, PgDatabaseError, OSError) as e:
        where = info.unix_sock or f"{info.host}:{info.port}"
        raise DatabaseError(f"cannot connect to the database at {where}/{info.database}: {e}") from e
    return conn


class Database:
    """A factory of connections to one database. Thread-safe: each caller gets its own.

    With ``keep_idle``, ``transaction()`` keeps one idle connection per thread
    for the next transaction (connecting costs round trips, and TLS over TCP);
    a connection that saw any error is closed instead of kept, and one the
    server closed while idle is replaced once, before anything ran on it."""

    def __init__(self, info: ConnInfo, *, keep_idle: bool = False) -> None:
        self.info = info
        self.keep_idle = keep_idle
        self._idle = threading.local()

    @classmethod
    def from_url(cls, url: str, *, keep_idle: bool = False) -> Database:
        return cls(parse_database_url(url), keep_idle=keep_idle)

    def connect(self) -> pg8000.native.Connection:
        return connect(self.info)

    def close(self) -> None:
        """Close this thread's idle connection, if any."""
        conn = getattr(self._idle, "conn", None)
        self._idle.conn = None
        if conn is not None:
            _close(conn)

    @contextmanager
    def connection(self) -> Iterator[pg8000.native.Connection]:
        conn = self.connect()
        try:
            yield conn
        finally:
            _close(conn)

    def _begin(self) -> pg8000.native.Connection:
        conn = getattr(self._idle, "conn", None)
        self._idle.conn = None
        if conn is not None:
            try:
                conn.run("BEGIN")
                return conn
            except (PgInterfaceError, PgDatabaseError, OSError):
                _close(conn)  # the server closed it while idle: connect afresh
        conn = self.connect()
        try:
            conn.run("BEGIN")
        except (PgInterfaceError, PgDatabaseError, OSError) as e:
            _close(conn)
            raise DatabaseError(str(e)) from e
        return conn

    @contextmanager
    def transaction(self) -> Iterator[pg8000.native.Connection]:
        """One transaction: commit on success, roll back on error.
        pg8000 errors are translated into ``DatabaseError``."""
        conn = self._begin()
        healthy = False
        try:
            yield conn
            conn.run("COMMIT")
            healthy = True
        except (PgInterfaceError, PgDatabaseError) as e:
            _rollback(conn)
            raise DatabaseError(str(e)) from e
        except BaseException:
            _rollback(conn)
            raise
        finally:
            if healthy and self.keep_idle and getattr(self._idle, "conn", None) is None:
                self._idle.conn = conn
            else:
                _close(conn)


def _close(conn: pg8000.native.Connection) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken socket must not mask the real error
        pass


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE code of a pg8000 server error, if any."""
    if exc.args and isinstance(exc.args[0], dict):
        return exc.args[0].get("C")
    return None


def _rollback(conn: pg8000.native.Connection) -> None:
    try:
        conn.run("ROLLBACK")
    except Exception:  # noqa: BLE001 - the connection may be gone; the original error matters
        pass
