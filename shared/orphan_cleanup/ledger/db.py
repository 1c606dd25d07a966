"""Database access with pg8000: connections with timeouts, transactions, and
pg8000 errors translated into ``DatabaseError``. URL parsing is in ``url``,
the embedded server in ``embedded``."""

from __future__ import annotations

import errno
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache
from typing import Any, Protocol

import pg8000.native
from pg8000.exceptions import DatabaseError as PgDatabaseError
from pg8000.exceptions import InterfaceError as PgInterfaceError

from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.ledger.url import ConnInfo, parse_database_url, ssl_context

__all__ = ["ConnInfo", "Database", "Opener", "connect", "describe", "network_failure", "parse_database_url",
           "sqlstate"]

INVALID_PASSWORD = "28P01"  # SQLSTATE invalid_password: a wrong or rotated password, an expired IAM token


class Opener(Protocol):
    """Opens the connection instead of pg8000's own socket code (the Cloud SQL Python
    Connector: ``ledger.cloudsql``). It gets pg8000's keyword arguments but the
    address and TLS, which are its own, and raises pg8000's or socket errors, or a
    ``DatabaseError`` of its own."""

    where: str
    """How error lines name the server, e.g. ``Cloud SQL instance p:r:i``."""

    def __call__(self, **kwargs: Any) -> pg8000.native.Connection: ...


#: What pg8000 raises when a statement fails or its connection breaks: its own errors and
#: the socket's (a read that timed out, a reset), which it lets through unwrapped.
PG_FAILURES = (PgInterfaceError, PgDatabaseError, TimeoutError, ConnectionError)

PasswordSource = Callable[[ConnInfo], str]
"""The password of each new connection, asked afresh every time (an RDS IAM token)."""


def connect(info: ConnInfo, *, timeout: float = 10.0, application_name: str = "orphan-cleanup",
            statement_timeout_ms: int = 60_000, opener: Opener | None = None) -> pg8000.native.Connection:
    """Open a connection with a socket timeout and a server-side statement timeout.

    TLS follows ``info.sslmode`` (see ``url.ssl_context``); a server whose certificate
    fails verification is a one-line ``DatabaseError``, never a clear-text retry.
    The URL's ``application_name`` wins over the argument. The URL's ``options`` go in
    the startup packet (pg8000's ``startup_params``), so a ``search_path`` set there
    holds for the whole session, as with libpq."""
    kwargs: dict[str, Any] = dict(user=info.user, password=info.password, database=info.database,
                                  timeout=timeout, application_name=info.application_name or application_name)
    if info.options:
        kwargs["startup_params"] = {"options": info.options}
    if opener is not None:
        where = f"{opener.where}/{info.database}"  # the opener picks the address and does TLS itself
    elif info.unix_sock:
        # No TLS on a local socket (as libpq); None would also build a CA-loaded context per connection.
        kwargs.update(unix_sock=info.unix_sock, ssl_context=False)
        where = f"{info.unix_sock}/{info.database}"
    else:
        kwargs.update(host=info.host, port=info.port, ssl_context=_ssl_context(info))
        where = f"{info.host}:{info.port}/{info.database}"
    try:
        conn = opener(**kwargs) if opener is not None else pg8000.native.Connection(**kwargs)
    except ssl.SSLCertVerificationError as e:
        ca = info.sslrootcert if info.sslrootcert not in (None, "system") else "the system trust store"
        raise DatabaseError(f"cannot connect to the database at {where}: its TLS certificate failed verification"
                            f" (sslmode={info.sslmode}, CA {ca}): {_one_line(e.verify_message or str(e))}") from e
    except (PgInterfaceError, PgDatabaseError, OSError) as e:
        raise DatabaseError(f"cannot connect to the database at {where}: {describe(e, connecting=True)}") from e
    try:
        conn.run(f"SET statement_timeout = {int(statement_timeout_ms)}")
    except (PgInterfaceError, PgDatabaseError, OSError) as e:
        _close(conn)
        raise DatabaseError(f"cannot set up the connection to {where}: {describe(e)}") from e
    return conn


def _ssl_context(info: ConnInfo) -> ssl.SSLContext | bool | None:
    return _tls_context(info.sslmode, info.sslrootcert, info.sslcert, info.sslkey)


# One context per TLS configuration: loading a CA bundle (the system store is ~150
# certificates) for every connection would cost milliseconds each. Contexts are
# safe to share between threads; a failed load (ConfigError) is not cached.
@lru_cache(maxsize=16)
def _tls_context(sslmode: str, sslrootcert: str | None, sslcert: str | None,
                 sslkey: str | None) -> ssl.SSLContext | bool | None:
    return ssl_context(ConnInfo(sslmode=sslmode, sslrootcert=sslrootcert, sslcert=sslcert, sslkey=sslkey))


def describe(exc: BaseException, *, connecting: bool = False) -> str:
    """One line for a pg8000 or socket error: a server error's message and SQLSTATE; a
    network failure as what it was (``network_failure``); else the error's text (with its
    cause, as pg8000 wraps socket errors). ``connecting``: it happened while connecting."""
    if exc.args and isinstance(exc.args[0], dict):
        fields = exc.args[0]
        return _one_line(f"{fields.get('M', fields)} (SQLSTATE {fields.get('C', '?')})")
    network = network_failure(exc, connecting=connecting)
    if network is not None:
        return network
    text = str(exc)
    if exc.__cause__ is not None and str(exc.__cause__) not in text:
        text = f"{text}: {exc.__cause__}"
    return _one_line(text)


_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN)
_CLOSED = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED)


def network_failure(exc: BaseException, *, connecting: bool = False) -> str | None:
    """What a network failure was, in words an operator can act on: DNS, refused, timed
    out, unreachable, or closed by the other end (pg8000's bare "network error": EOF or a
    reset before any answer). None when ``exc`` is no network failure (a TLS failure is
    not one: its own message names it). Names no address: callers add where."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for e in chain:
        if isinstance(e, ssl.SSLError):
            return None
        if isinstance(e, socket.gaierror):
            return "DNS failure (the host name does not resolve)"
        code = getattr(e, "errno", None)
        if isinstance(e, ConnectionRefusedError) or code == errno.ECONNREFUSED:
            return "connection refused (is Postgres listening there?)"
        if isinstance(e, TimeoutError) or code == errno.ETIMEDOUT:
            return "timed out (no answer from the server)"
        if code in _UNREACHABLE:
            return f"host unreachable ({_one_line(os_text(e))}: no network route to it)"
        if isinstance(e, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) or code in _CLOSED:
            return _closed(connecting)
    if any(isinstance(e, PgInterfaceError) and str(e) == "network error" for e in chain):
        return _closed(connecting)
    return None


def os_text(e: BaseException) -> str:
    return (e.strerror if isinstance(e, OSError) else None) or str(e)


def _closed(connecting: bool) -> str:
    if connecting:
        return ("the server closed the connection before any answer (no Postgres at that address, or a firewall"
                " or proxy in between)")
    return "the connection was closed by the server or the network"


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Database:
    """A factory of connections to one database. Thread-safe: each caller gets its own.

    With ``keep_idle`` (the deployed functions and the CLI: ``bootstrap``), ``transaction()``
    and ``connection()`` keep one idle connection per thread for the next use, so a warm
    function makes one connection (and one TLS handshake) across its invocations:

    - a connection that saw any error, or that is left inside a transaction, is closed
      instead of kept;
    - before reuse it is re-validated without a round trip: a server that closed it
      while idle (``idle_session_timeout``, ``pg_terminate_backend``, a restart) has sent
      its goodbye or EOF, so its socket reads ready (``_alive``), and it is dropped and
      reopened once, before anything ran on it; ``transaction()``'s ``BEGIN`` also
      catches a silent drop and reconnects once. A drop that only shows on a later
      statement fails that one use (``DatabaseError``); the next use reconnects."""

    def __init__(self, info: ConnInfo, *, keep_idle: bool = False, password: PasswordSource | None = None,
                 reload: Callable[[], ConnInfo] | None = None, opener: Opener | None = None) -> None:
        """``password``: asked for each new connection instead of ``info.password`` (an
        RDS IAM token). ``reload``: the connection parameters read afresh (the secret
        re-read) when the server refuses the password (SQLSTATE 28P01): once per refusal,
        then one more attempt, whose failure is the caller's error. ``opener``: opens
        connections instead of pg8000's sockets (the Cloud SQL connector)."""
        self.info = info
        self.keep_idle = keep_idle
        self._idle = threading.local()
        self._password = password
        self._reload = reload
        self._opener = opener
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, keep_idle: bool = False, default_sslmode: str = "prefer") -> Database:
        """``default_sslmode`` applies when the URL names none (see ``parse_database_url``)."""
        return cls(parse_database_url(url, default_sslmode=default_sslmode), keep_idle=keep_idle)

    def connect(self) -> pg8000.native.Connection:
        """A new connection. With ``reload``, a refused password (a rotated secret: the
        connection parameters are cached since the cold start) re-reads them once and
        retries once; anything else, or a second refusal, is a ``DatabaseError``."""
        info = self.info
        try:
            return self._open(info)
        except DatabaseError as e:
            if self._reload is None or sqlstate(e.__cause__) != INVALID_PASSWORD:
                raise
        fresh = self._reload()
        with self._lock:
            self.info = fresh
        return self._open(fresh)

    def _open(self, info: ConnInfo) -> pg8000.native.Connection:
        if self._password is not None:
            info = replace(info, password=self._password(info))
        return connect(info, opener=self._opener)

    def close(self) -> None:
        """Close this thread's idle connection, if any."""
        conn = getattr(self._idle, "conn", None)
        self._idle.conn = None
        if conn is not None:
            _close(conn)

    @contextmanager
    def connection(self) -> Iterator[pg8000.native.Connection]:
        """One connection without a transaction (each statement commits on its own).
        With ``keep_idle`` it is this thread's idle connection when one is alive."""
        conn = self._take_idle() or self.connect()
        healthy = False
        try:
            yield conn
            healthy = True
        except (TimeoutError, ConnectionError) as e:  # (pg8000's own errors are the caller's to read)
            raise DatabaseError(describe(e)) from e
        finally:
            self._release(conn, healthy)

    def _take_idle(self) -> pg8000.native.Connection | None:
        conn = getattr(self._idle, "conn", None)
        self._idle.conn = None
        if conn is not None and not _alive(conn):
            _close(conn)
            return None
        return conn

    def _release(self, conn: pg8000.native.Connection, healthy: bool) -> None:
        if (healthy and self.keep_idle and getattr(self._idle, "conn", None) is None
                and _transaction_status(conn) == _IDLE):
            self._idle.conn = conn
        else:
            _close(conn)

    def _begin(self) -> pg8000.native.Connection:
        conn = self._take_idle()
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
            raise DatabaseError(describe(e)) from e
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
        except PG_FAILURES as e:
            _rollback(conn)
            raise DatabaseError(describe(e)) from e
        except BaseException:
            _rollback(conn)
            raise
        finally:
            self._release(conn, healthy)


_IDLE = b"I"  # ReadyForQuery: not inside a transaction block


def _transaction_status(conn: pg8000.native.Connection) -> bytes | None:
    return getattr(conn, "_transaction_status", None)


def _alive(conn: pg8000.native.Connection) -> bool:
    """Whether an idle connection may be reused, without a round trip: the server sends
    nothing unasked to an idle session of ours (no LISTEN), so a socket that reads ready
    holds the server's goodbye (a FATAL error, EOF) or garbage; either way it is done."""
    sock = getattr(conn, "_usock", None)
    if sock is None:
        return False
    try:
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return False
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _close(conn: pg8000.native.Connection) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken socket must not mask the real error
        pass


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE code of a pg8000 server error, if any."""
    if exc is not None and exc.args and isinstance(exc.args[0], dict):
        return exc.args[0].get("C")
    return None


def _rollback(conn: pg8000.native.Connection) -> None:
    try:
        conn.run("ROLLBACK")
    except Exception:  # noqa: BLE001 - the connection may be gone; the original error matters
        pass
