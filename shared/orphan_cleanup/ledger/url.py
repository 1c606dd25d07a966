"""DATABASE_URL parsing: ``postgresql://`` URLs to connection parameters and back,
and the TLS context each ``sslmode`` asks for. No I/O."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from orphan_cleanup.errors import ConfigError

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


def ssl_context(mode: str) -> ssl.SSLContext | bool | None:
    """What pg8000's ``ssl_context`` needs for ``mode``: False = no TLS; None = try
    TLS unverified, fall back to clear text; else a context (verifying per mode)."""
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
