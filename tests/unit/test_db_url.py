"""DATABASE_URL parsing (C4): no sockets, just the parsed parameters."""

from __future__ import annotations

import ssl

import pytest

from orphan_cleanup.errors import ConfigError
from orphan_cleanup.ledger.url import SSL_MODES, ConnInfo, parse_database_url, ssl_context

GOOD = [
    ("everything", "postgresql://alice:s3cret@db.example.com:6543/ledger",
     dict(user="alice", password="s3cret", host="db.example.com", port=6543, database="ledger",
          unix_sock=None, sslmode="prefer")),
    ("postgres:// scheme and defaults", "postgres://bob@localhost/x",
     dict(user="bob", password=None, host="localhost", port=5432, database="x", sslmode="prefer")),
    ("no user, no database", "postgresql://db.internal",
     dict(user="postgres", password=None, host="db.internal", port=5432, database="postgres")),
    ("percent-encoded password", "postgresql://u:p%40ss%3Aw%2Frd%23%3F@h/db",
     dict(user="u", password="p@ss:w/rd#?", host="h")),
    ("percent-encoded user", "postgresql://svc%40corp:pw@h/db", dict(user="svc@corp", password="pw")),
    ("percent-encoded database", "postgresql://u@h/my%20db", dict(database="my db")),
    ("IPv6 host", "postgresql://u@[::1]:5433/db", dict(host="::1", port=5433)),
    ("unix socket dir", "postgresql://u@/db?host=/var/run/postgresql",
     dict(unix_sock="/var/run/postgresql/.s.PGSQL.5432", host=None, port=5432, database="db")),
    ("unix socket dir and port", "postgresql://u@/db?host=/tmp/pg&port=6000",
     dict(unix_sock="/tmp/pg/.s.PGSQL.6000", host=None, port=6000)),
    ("encoded socket dir", "postgresql://u@/db?host=%2Ftmp%2Fpg", dict(unix_sock="/tmp/pg/.s.PGSQL.5432")),
    ("host as a query parameter", "postgresql://u@/db?host=pg.example.com&port=7000",
     dict(host="pg.example.com", port=7000, unix_sock=None)),
    ("other options kept", "postgresql://u@h/db?application_name=x&sslmode=require",
     dict(options={"application_name": "x"}, sslmode="require")),
]


@pytest.mark.parametrize("url, expected", [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_parse(url, expected):
    info = parse_database_url(url)
    assert {k: getattr(info, k) for k in expected} == expected


@pytest.mark.parametrize("mode", sorted(SSL_MODES))
def test_every_sslmode(mode):
    assert parse_database_url(f"postgresql://u@h/db?sslmode={mode}").sslmode == mode
    assert sorted(SSL_MODES) == ["allow", "disable", "prefer", "require", "verify-ca", "verify-full"]


BAD = [
    ("unknown sslmode", "postgresql://u@h/db?sslmode=maybe"),
    ("port not a number", "postgresql://u@h:abc/db"),
    ("port out of range", "postgresql://u@h:99999/db"),
    ("port parameter not a number", "postgresql://u@/db?host=/tmp&port=abc"),
    ("another scheme", "mysql://u@h/db"),
    ("not a URL", "host=localhost dbname=x"),
]


@pytest.mark.parametrize("url", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ConfigError):
        parse_database_url(url)


@pytest.mark.parametrize("info", [
    ConnInfo(user="u", password="p@ss/w:rd#?", host="db.example.com", port=6543, database="ledger",
             sslmode="require"),
    ConnInfo(user="svc@corp", password=None, host="localhost", port=5432, database="my db"),
    ConnInfo(user="postgres", host="::1", port=5433, database="db"),
    ConnInfo(user="postgres", host=None, port=5433, database="oc", unix_sock="/tmp/pg dir/.s.PGSQL.5433"),
], ids=["tcp with special password", "special user and database", "IPv6 host", "unix socket"])
def test_url_round_trips(info):
    # ConnInfo.url() is what tests and tools hand to DATABASE_URL
    assert parse_database_url(info.url()) == info


def test_sslmode_maps_to_pg8000_semantics():
    # pg8000: False = no TLS at all; None = try TLS (unverified) and fall back to clear text;
    # a context = TLS required, verified as the context says.
    assert ssl_context("disable") is False
    assert ssl_context("allow") is None
    assert ssl_context("prefer") is None
    require = ssl_context("require")
    assert isinstance(require, ssl.SSLContext)
    assert (require.verify_mode, require.check_hostname) == (ssl.CERT_NONE, False)
    verify_ca = ssl_context("verify-ca")
    assert (verify_ca.verify_mode, verify_ca.check_hostname) == (ssl.CERT_REQUIRED, False)
    verify_full = ssl_context("verify-full")
    assert (verify_full.verify_mode, verify_full.check_hostname) == (ssl.CERT_REQUIRED, True)
