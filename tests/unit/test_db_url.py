"""DATABASE_URL parsing (C4): no sockets, just the parsed parameters."""

from __future__ import annotations

import json
import ssl

import pytest

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.ledger.url import SSL_MODES, ConnInfo, parse_database_url, secret_url, ssl_context

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
    ("application_name kept", "postgresql://u@h/db?application_name=x&sslmode=require",
     dict(application_name="x", sslmode="require")),
    ("TLS files", "postgresql://u@h/db?sslmode=verify-ca&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
     dict(sslmode="verify-ca", sslrootcert="/ca.pem", sslcert="/c.pem", sslkey="/k.pem")),
    ("a CA and no sslmode means verify-full", "postgresql://u@h/db?sslrootcert=/var/task/ca.pem",
     dict(sslmode="verify-full", sslrootcert="/var/task/ca.pem")),
    ("the system store means verify-full", "postgresql://u@h/db?sslrootcert=system",
     dict(sslmode="verify-full", sslrootcert="system")),
    ("require with a CA (libpq: verifies the chain)", "postgresql://u@h/db?sslmode=require&sslrootcert=/ca.pem",
     dict(sslmode="require", sslrootcert="/ca.pem")),
    ("an empty value is not given", "postgresql://u@h/db?sslmode=&application_name=",
     dict(sslmode="prefer", application_name=None)),
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
    ("unknown parameter (a typo of sslmode)", "postgresql://u@h/db?sslmod=require"),
    ("unknown parameter (libpq's connect_timeout, not supported)", "postgresql://u@h/db?connect_timeout=5"),
    ("a parameter without a value", "postgresql://u@h/db?sslmode"),
    ("a CA with a mode that does not verify", "postgresql://u@h/db?sslmode=prefer&sslrootcert=/ca.pem"),
    ("a client certificate with a mode that may fall back", "postgresql://u@h/db?sslmode=allow&sslcert=/c.pem"),
    ("a key without its certificate", "postgresql://u@h/db?sslmode=require&sslkey=/k.pem"),
    ("the system store without verify-full (as libpq 16)", "postgresql://u@h/db?sslmode=require&sslrootcert=system"),
]


@pytest.mark.parametrize("url", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ConfigError) as err:
        parse_database_url(url)
    assert "\n" not in str(err.value)


def test_an_unknown_parameter_is_named_in_one_line():
    with pytest.raises(ConfigError) as err:
        parse_database_url("postgresql://u:secret@h/db?sslmod=require&sslmode=verify-full")
    message = str(err.value)
    assert "'sslmod'" in message and "\n" not in message
    assert "secret" not in message  # never echo the URL: it holds the password


def test_default_sslmode_applies_only_when_the_url_names_none():
    assert parse_database_url("postgresql://u@h/db", default_sslmode="verify-full").sslmode == "verify-full"
    assert parse_database_url("postgresql://u@h/db?sslmode=require", default_sslmode="verify-full").sslmode == \
        "require"
    assert parse_database_url("postgresql://u@h/db").sslmode == "prefer"


@pytest.mark.parametrize("info", [
    ConnInfo(user="u", password="p@ss/w:rd#?", host="db.example.com", port=6543, database="ledger",
             sslmode="require"),
    ConnInfo(user="svc@corp", password=None, host="localhost", port=5432, database="my db"),
    ConnInfo(user="postgres", host="::1", port=5433, database="db"),
    ConnInfo(user="postgres", host=None, port=5433, database="oc", unix_sock="/tmp/pg dir/.s.PGSQL.5433"),
    ConnInfo(user="u", host="db", sslmode="verify-full", sslrootcert="/certs/a&b ca.pem", sslcert="/c.pem",
             sslkey="/k.pem", application_name="orphan cleanup"),
], ids=["tcp with special password", "special user and database", "IPv6 host", "unix socket", "TLS files"])
def test_url_round_trips(info):
    # ConnInfo.url() is what tests and tools hand to DATABASE_URL
    assert parse_database_url(info.url()) == info


def test_sslmode_maps_to_pg8000_semantics():
    # pg8000: False = no TLS at all; None = try TLS (unverified) and fall back to clear text;
    # a context = TLS required, verified as the context says.
    assert ssl_context(ConnInfo(sslmode="disable")) is False
    assert ssl_context(ConnInfo(sslmode="allow")) is None
    assert ssl_context(ConnInfo(sslmode="prefer")) is None
    require = ssl_context(ConnInfo(sslmode="require"))
    assert isinstance(require, ssl.SSLContext)
    assert (require.verify_mode, require.check_hostname) == (ssl.CERT_NONE, False)
    verify_ca = ssl_context(ConnInfo(sslmode="verify-ca"))
    assert isinstance(verify_ca, ssl.SSLContext)
    assert (verify_ca.verify_mode, verify_ca.check_hostname) == (ssl.CERT_REQUIRED, False)
    verify_full = ssl_context(ConnInfo(sslmode="verify-full"))
    assert isinstance(verify_full, ssl.SSLContext)
    assert (verify_full.verify_mode, verify_full.check_hostname) == (ssl.CERT_REQUIRED, True)
    system = ssl_context(ConnInfo(sslmode="verify-full", sslrootcert="system"))
    assert isinstance(system, ssl.SSLContext)
    assert (system.verify_mode, system.check_hostname) == (ssl.CERT_REQUIRED, True)


def test_a_local_socket_never_uses_tls():
    # libpq: sslmode does not apply to a Unix-domain socket
    assert ssl_context(ConnInfo(host=None, unix_sock="/run/pg/.s.PGSQL.5432", sslmode="verify-full")) is False


@pytest.mark.parametrize("info", [
    ConnInfo(sslmode="verify-full", sslrootcert="/nonexistent/ca.pem"),
    ConnInfo(sslmode="require", sslcert="/nonexistent/client.pem", sslkey="/nonexistent/client.key"),
], ids=["sslrootcert", "sslcert"])
def test_a_missing_certificate_file_is_a_one_line_config_error(info):
    with pytest.raises(ConfigError) as err:
        ssl_context(info)
    assert "/nonexistent/" in str(err.value) and "\n" not in str(err.value)


# ---- options (search_path) and the secrets RDS manages ------------------------------

def test_options_is_libpqs_form_and_survives_the_round_trip():
    info = parse_database_url("postgresql://u@h/db?options=-csearch_path%3Dorphan_cleanup")
    assert info.options == "-csearch_path=orphan_cleanup"
    assert parse_database_url(info.url()) == info


RDS_SECRET = {"engine": "postgres", "host": "ledger.abc.us-east-1.rds.amazonaws.com", "port": 5432,
              "username": "orphan_cleanup_runtime", "password": "p@ss/w:rd#?%", "dbname": "platform",
              "dbInstanceIdentifier": "ledger"}


def test_an_rds_json_secret_is_the_url_of_its_keys():
    url = secret_url(json.dumps({**RDS_SECRET, "sslrootcert": "/var/task/certs/global-bundle.pem",
                                 "options": "-csearch_path=orphan_cleanup"}))
    info = parse_database_url(url)
    assert (info.user, info.password, info.host, info.port, info.database) == \
        ("orphan_cleanup_runtime", "p@ss/w:rd#?%", "ledger.abc.us-east-1.rds.amazonaws.com", 5432, "platform")
    assert info.sslrootcert == "/var/task/certs/global-bundle.pem" and info.sslmode == "verify-full"
    assert info.options == "-csearch_path=orphan_cleanup"


def test_a_bare_url_secret_is_itself():
    assert secret_url("  postgresql://u:p@h/db?sslmode=require\n") == "postgresql://u:p@h/db?sslmode=require"


@pytest.mark.parametrize("secret, named", [
    ({k: v for k, v in RDS_SECRET.items() if k != "host"}, "'host'"),
    ({k: v for k, v in RDS_SECRET.items() if k != "dbname"}, "'dbname'"),
    ({**RDS_SECRET, "sslmod": "require"}, "'sslmod'"),
    ({**RDS_SECRET, "port": True}, "'port'"),
    ({**RDS_SECRET, "password": ["x"]}, "'password'"),
])
def test_a_bad_json_secret_names_the_key_never_the_password(secret, named):
    with pytest.raises(ConfigError) as err:
        parse_database_url(secret_url(json.dumps(secret)))
    assert named in str(err.value) and "p@ss" not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["{not json", "{\"username\": \"u\", \"password\": \"p@ss\""])
def test_a_secret_that_is_neither_is_one_line(text):
    with pytest.raises(ConfigError) as err:
        secret_url(text)
    assert "database secret" in str(err.value)
