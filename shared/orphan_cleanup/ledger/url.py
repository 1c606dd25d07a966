"""DATABASE_URL parsing: ``postgresql://`` URLs to connection parameters and back,
and the TLS context each ``sslmode`` asks for.

Parsing does no I/O; ``ssl_context`` reads the certificate files the URL names.
docs/DATABASE.md is the user's side of this module."""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from orphan_cleanup.core.errors import ConfigError

SSL_MODES = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}
VERIFYING_MODES = {"verify-ca", "verify-full"}
# Modes where pg8000 gets a context, so TLS is required and never falls back to clear text.
TLS_ONLY_MODES = {"require"} | VERIFYING_MODES
SYSTEM_STORE = "system"
"""``sslrootcert=system``: the system trust store (as libpq 16), and verify-full by default."""

# Every query parameter we act on; any other one is a ConfigError, never silently ignored.
PARAMETERS = ("host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "options")

# The keys of the JSON secret RDS creates and rotates that name the connection; the others
# it may hold are RDS's own bookkeeping and are ignored. Any other key is refused.
SECRET_KEYS = ("username", "password", "host", "port", "dbname", "sslmode", "sslrootcert", "options")
RDS_BOOKKEEPING_KEYS = ("engine", "dbInstanceIdentifier", "dbClusterIdentifier", "masterarn", "proxyname")


@dataclass(frozen=True)
class ConnInfo:
    """Parsed connection parameters; ``unix_sock`` set for a socket connection (no TLS,
    as libpq: ``sslmode`` does not apply to a local socket)."""

    user: str = "postgres"
    password: str | None = field(default=None, repr=False)  # SAFETY.md rule 22: no repr shows it
    host: str | None = "localhost"
    port: int = 5432
    database: str = "postgres"
    unix_sock: str | None = None
    sslmode: str = "prefer"
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
    application_name: str | None = None
    options: str | None = None
    """libpq's ``options``, e.g. ``-csearch_path=orphan_cleanup``: sent to the server as
    the startup packet's ``options``, so it holds for the whole session, whatever the
    connection is used for (and survives ``RESET ALL``, which returns to it)."""

    def with_database(self, database: str) -> ConnInfo:
        return replace(self, database=database)

    def url(self) -> str:
        # Percent-encode: a password with '/', '#', '?' or '@' must survive parse_database_url.
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        database = quote(self.database, safe="")
        extra = {k: v for k, v in (("sslrootcert", self.sslrootcert), ("sslcert", self.sslcert),
                                   ("sslkey", self.sslkey), ("application_name", self.application_name),
                                   ("options", self.options)) if v}
        if self.unix_sock:
            query = {"host": str(Path(self.unix_sock).parent), "port": str(self.port), **extra}
            return f"postgresql://{auth}@/{database}?{urlencode(query, quote_via=quote, safe='')}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        query = {"sslmode": self.sslmode, **extra}
        return f"postgresql://{auth}@{host}:{self.port}/{database}?{urlencode(query, quote_via=quote, safe='')}"


def parse_database_url(url: str, *, default_sslmode: str = "prefer") -> ConnInfo:
    """Parse ``postgresql://user:pass@host:port/db?sslmode=…`` (or ``?host=/socket/dir``).

    ``default_sslmode`` applies when the URL names no ``sslmode`` (``prefer`` as libpq;
    the deployed functions pass ``verify-full``). A URL naming a CA (``sslrootcert``)
    and no ``sslmode`` means ``verify-full`` whatever the default: a CA given is a CA
    used. Bad or unknown parameters are a one-line ``ConfigError`` naming them."""
    try:
        parts = urlsplit(url)
        port = parts.port
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:  # its text may quote a part of the password: never shown (SAFETY.md rule 22)
        raise ConfigError("DATABASE_URL is malformed (a password with '/', '?', '#' or '@' must be"
                          " percent-encoded)") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError("DATABASE_URL must start with postgresql://")
    if "@" in url.split("://", 1)[-1][len(parts.netloc):] or parts.netloc.endswith(":"):
        # an unencoded '/', '?' or '#' in the password ended the address early: what follows
        # (the rest of the password) would be read, and shown, as the database or a parameter
        raise ConfigError("DATABASE_URL is malformed (a password with '/', '?', '#' or '@' must be"
                          " percent-encoded)")
    unknown = sorted({k for k, _ in pairs} - set(PARAMETERS))
    if unknown:
        raise ConfigError(f"DATABASE_URL parameter {', '.join(map(repr, unknown))} is not supported"
                          f" (supported: {', '.join(PARAMETERS)})")
    query = {k: v for k, v in pairs if v != ""}  # an empty value means "not given", as in libpq
    sslrootcert = query.get("sslrootcert")
    sslmode = query.get("sslmode") or ("verify-full" if sslrootcert else default_sslmode)
    if sslmode not in SSL_MODES:
        raise ConfigError(f"DATABASE_URL sslmode {sslmode!r} is not one of {sorted(SSL_MODES)}")
    _check_tls_files(sslmode, sslrootcert, query.get("sslcert"), query.get("sslkey"))
    host = parts.hostname
    socket_dir = query.get("host")
    try:
        port = int(query.get("port", port or 5432))
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
        sslrootcert=sslrootcert,
        sslcert=query.get("sslcert"),
        sslkey=query.get("sslkey"),
        application_name=query.get("application_name"),
        options=query.get("options"),
    )


def secret_url(secret: str) -> str:
    """The ``postgresql://`` URL a Secrets Manager secret holds: the secret itself (a
    bare URL), or the URL made of the JSON secret RDS creates and rotates (``username``,
    ``password``, ``host``, ``port``, ``dbname``; optionally ``sslmode``, ``sslrootcert``,
    ``options``). The URL is then parsed like any other (``parse_database_url``).

    Errors are a one-line ``ConfigError`` that names keys, never values: the secret
    holds a password."""
    text = secret.strip()
    if not text.startswith("{"):
        return text
    try:
        fields = json.loads(text)
    except ValueError:
        raise ConfigError("the database secret is neither a postgresql:// URL nor valid JSON") from None
    if not isinstance(fields, dict):
        raise ConfigError("the database secret's JSON is not an object")
    unknown = sorted(set(fields) - set(SECRET_KEYS) - set(RDS_BOOKKEEPING_KEYS))
    if unknown:
        raise ConfigError(f"the database secret's key {', '.join(map(repr, unknown))} is not supported"
                          f" (supported: {', '.join(SECRET_KEYS)})")
    wrong = [k for k in SECRET_KEYS if fields.get(k) is not None
             and (isinstance(fields[k], bool) or not isinstance(fields[k], str | int))]
    if wrong:
        raise ConfigError(f"the database secret's {', '.join(map(repr, wrong))} must be a string")
    values = {k: str(fields[k]) for k in SECRET_KEYS if fields.get(k) not in (None, "")}
    missing = [k for k in ("username", "host", "dbname") if k not in values]
    if missing:
        raise ConfigError(f"the database secret lacks {', '.join(map(repr, missing))}"
                          " (an RDS JSON secret names username, password, host, port and dbname)")
    auth = quote(values["username"], safe="") + (f":{quote(values['password'], safe='')}"
                                                 if "password" in values else "")
    host = values["host"]
    host = f"[{host}]" if ":" in host else host
    port = f":{values['port']}" if "port" in values else ""
    query: dict[str, str] = {k: values[k] for k in ("sslmode", "sslrootcert", "options") if k in values}
    tail = f"?{urlencode(query, quote_via=quote, safe='')}" if query else ""
    return f"postgresql://{auth}@{host}{port}/{quote(values['dbname'], safe='')}{tail}"


def _check_tls_files(sslmode: str, rootcert: str | None, cert: str | None, key: str | None) -> None:
    if sslmode not in TLS_ONLY_MODES:
        given = [name for name, v in (("sslrootcert", rootcert), ("sslcert", cert), ("sslkey", key)) if v]
        if given:
            # pg8000 cannot both fall back to clear text and verify or present a certificate.
            raise ConfigError(f"DATABASE_URL {given[0]} needs sslmode require, verify-ca or verify-full,"
                              f" not {sslmode}")
    if rootcert == SYSTEM_STORE and sslmode != "verify-full":
        raise ConfigError(f"DATABASE_URL sslrootcert=system needs sslmode=verify-full, not {sslmode}")
    if key and not cert:
        raise ConfigError("DATABASE_URL sslkey needs sslcert")


def ssl_context(info: ConnInfo) -> ssl.SSLContext | bool | None:
    """What pg8000's ``ssl_context`` needs for ``info``: False = no TLS; None = try TLS
    unverified, fall back to clear text (allow, prefer); else a context, and TLS is
    required (require, verify-ca, verify-full).

    ``verify-ca`` checks the chain, ``verify-full`` the chain and the host name; their
    CAs are ``sslrootcert`` (a PEM bundle) or, without it or with ``system``, the
    system trust store. ``require`` verifies nothing, unless ``sslrootcert`` names a
    CA: then it checks the chain, as libpq does. A certificate file that cannot be
    read is a ``ConfigError``."""
    mode = info.sslmode
    if info.unix_sock or mode == "disable":
        return False
    if mode not in TLS_ONLY_MODES:
        return None
    cafile = info.sslrootcert if info.sslrootcert != SYSTEM_STORE else None
    if mode == "require" and cafile is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        try:
            ctx = ssl.create_default_context(cafile=cafile)  # no cafile: the system store
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"DATABASE_URL sslrootcert {cafile!r} cannot be loaded: {_reason(e)}") from e
        ctx.check_hostname = mode == "verify-full"
    if info.sslcert:
        try:
            # An encrypted key would make OpenSSL prompt on the terminal: refuse it instead.
            ctx.load_cert_chain(info.sslcert, info.sslkey, password=_no_passphrase)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"DATABASE_URL sslcert {info.sslcert!r} / sslkey {info.sslkey!r}"
                              f" cannot be loaded: {_reason(e)}") from e
    return ctx


def _no_passphrase() -> str:
    raise ConfigError("DATABASE_URL sslkey is encrypted; pg8000 takes no key passphrase: decrypt it")


def _reason(e: OSError | ssl.SSLError) -> str:
    return " ".join(str(e.strerror or e).split())
