"""The database as RDS users reach it, on real parts: the TLS Postgres of test_db_tls.py
(``hostssl`` only, SCRAM passwords for the members of ``PASSWORD_GROUP``) and moto's
Secrets Manager over HTTP.

- an RDS-style JSON secret (``username``, ``password``, ``host``, ``port``, ``dbname``,
  ``sslmode``, ``sslrootcert``, ``options``, and RDS's ``engine``) reaches the server;
- a role whose password is rotated, in Postgres (``ALTER ROLE``) and in the secret,
  between two invocations of one warm lister function: the second succeeds, on the
  same warm pipeline, because the refused password (28P01) makes it re-read the secret;
  a rotation the secret does not follow is one error line;
- ``DATABASE_IAM_AUTH``: the password the server checks is the token boto3's
  ``generate_db_auth_token`` makes for the URL's host, port and user, a fresh one for
  each connection. What RDS does with the token (its IAM check) is not verified here:
  the test server stores the expected token as the role's SCRAM password.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest

from functions.aws import lister
from orphan_cleanup.core.errors import ConfigError, DatabaseError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import aws, bootstrap
from orphan_cleanup.ledger.db import Database, sqlstate
from orphan_cleanup.ledger.migrate import migrate
from tests.integration.test_db_tls import BINDIR, PASSWORD_GROUP, TlsServer, tls_server  # noqa: F401 - fixture
from tests.support.sqs_harness import context

pytestmark = pytest.mark.skipif(BINDIR is None, reason="needs the TLS PostgreSQL of test_db_tls.py")


@dataclass
class Role:
    name: str
    password: str
    database: str


def _admin(server: TlsServer, database: str = "postgres") -> Database:
    return Database.from_url(f"postgresql://postgres@127.0.0.1:{server.port}/{database}?sslmode=require")


def _run(server: TlsServer, *statements: str, database: str = "postgres") -> None:
    with _admin(server, database).connection() as conn:
        for sql in statements:
            conn.run(sql)


@pytest.fixture
def role(tls_server: TlsServer) -> Iterator[Role]:
    """A login role that must give its password, owning a database of its own with an
    ``orphan_cleanup`` schema, as a platform's database would have."""
    suffix = uuid.uuid4().hex[:8]
    made = Role(name=f"oc_rds_{suffix}", password=secrets.token_urlsafe(16), database=f"oc_rds_{suffix}")
    _run(tls_server, f"CREATE ROLE {made.name} LOGIN PASSWORD '{made.password}' IN ROLE {PASSWORD_GROUP}",
         f'CREATE DATABASE "{made.database}" OWNER {made.name}')
    _run(tls_server, f"CREATE SCHEMA orphan_cleanup AUTHORIZATION {made.name}", database=made.database)
    yield made
    _run(tls_server, f'DROP DATABASE IF EXISTS "{made.database}" WITH (FORCE)', f"DROP ROLE IF EXISTS {made.name}")


def rds_secret(server: TlsServer, role: Role, password: str | None = None) -> str:
    """The JSON RDS's rotation keeps in the secret, plus our optional keys."""
    return json.dumps({"engine": "postgres", "host": "127.0.0.1", "port": server.port, "username": role.name,
                       "password": password or role.password, "dbname": role.database, "sslmode": "verify-full",
                       "sslrootcert": str(server.ca), "options": "-csearch_path=orphan_cleanup"})


def test_an_rds_json_secret_reaches_postgres(tls_server, role, moto_reset):
    # given the secret in moto's Secrets Manager, as RDS's rotation writes it
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name=f"rds-json-{role.name}", SecretString=rds_secret(tls_server, role))["ARN"]
    # when the functions' wiring opens the database from the secret
    db = bootstrap.open_database(Settings.explicit(database_url_secret_arn=arn, aws_endpoint_url=moto_reset),
                                 deployed=True)
    # then it logs in as the secret's role, verified over TLS, in the secret's schema
    with db.connection() as conn:
        row = conn.run("SELECT current_user, current_database(), current_schema(), ssl"
                       " FROM pg_stat_ssl WHERE pid = pg_backend_pid()")[0]
    assert row == [role.name, role.database, "orphan_cleanup", True]
    assert db.info.sslmode == "verify-full" and db.info.sslrootcert == str(tls_server.ca)


def test_a_json_secret_lacking_a_key_is_one_line_naming_the_key_not_the_password(tls_server, role, moto_reset):
    sm = boto3.client("secretsmanager")
    broken = json.loads(rds_secret(tls_server, role))
    del broken["host"]
    arn = sm.create_secret(Name=f"rds-broken-{role.name}", SecretString=json.dumps(broken))["ARN"]
    with pytest.raises(ConfigError) as err:
        bootstrap.open_database(Settings.explicit(database_url_secret_arn=arn, aws_endpoint_url=moto_reset),
                                deployed=True)
    assert "'host'" in str(err.value) and role.password not in str(err.value) and "\n" not in str(err.value)


@pytest.fixture
def deployed_lister(tls_server, role, moto_reset, monkeypatch) -> Iterator[str]:
    """The lister's environment as the stack sets it: the secret's ARN and the queues;
    the ledger migrated in its schema. Yields the secret's ARN."""
    sm, sqs = boto3.client("secretsmanager"), boto3.client("sqs")
    arn = sm.create_secret(Name=f"rotated-{role.name}", SecretString=rds_secret(tls_server, role))["ARN"]
    queues = {f"{name}_QUEUE_URL": sqs.create_queue(QueueName=f"{role.name}-{name.lower()}")["QueueUrl"]
              for name in ("JOBS", "LISTING", "DELETE")}
    owner = Settings.explicit(database_url_secret_arn=arn, aws_endpoint_url=moto_reset)
    migrate(bootstrap.open_database(owner, deployed=True))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL_SECRET_ARN", arn)
    for key, url in queues.items():
        monkeypatch.setenv(key, url)
    yield arn


def _sessions_of(server: TlsServer, role: Role) -> list[int]:
    with _admin(server).connection() as conn:
        return [r[0] for r in conn.run("SELECT pid FROM pg_stat_activity WHERE usename = :u", u=role.name)]


def _rotate_in_postgres(server: TlsServer, role: Role) -> str:
    """A new password for the role, and its sessions ended (as a restart, a failover or
    idle_session_timeout would: a session of the old password outlives ALTER ROLE)."""
    new = secrets.token_urlsafe(16)
    _run(server, f"ALTER ROLE {role.name} PASSWORD '{new}'")
    with _admin(server).connection() as conn:
        conn.run("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = :u", u=role.name)
    assert _sessions_of(server, role) == []
    return new


def test_a_rotated_password_is_re_read_between_two_warm_invocations(tls_server, role, deployed_lister):
    # given a warm lister: the first invocation (a tick: one query) opened its pipeline
    first = lister.handler({}, context("lister"))
    assert first["ok"] is True, first
    warm = aws.pipeline()
    assert warm.db.info.password == role.password
    # when the password is rotated in Postgres and in the secret, and the old session is gone
    new = _rotate_in_postgres(tls_server, role)
    boto3.client("secretsmanager").put_secret_value(SecretId=deployed_lister,
                                                    SecretString=rds_secret(tls_server, role, new))
    # then the second invocation of the same warm function succeeds, without a redeploy
    second = lister.handler({}, context("lister"))
    assert second["ok"] is True, second
    assert aws.pipeline() is warm and warm.db.info.password == new
    assert len(_sessions_of(tls_server, role)) == 1  # a new session, logged in with the new password


def test_a_rotation_the_secret_does_not_follow_is_one_error_line(tls_server, role, deployed_lister):
    assert lister.handler({}, context("lister"))["ok"] is True
    # the password changes in Postgres only: the re-read secret still holds the old one
    _rotate_in_postgres(tls_server, role)
    with pytest.raises(DatabaseError) as err:
        lister.handler({}, context("lister"))
    message = str(err.value)
    assert sqlstate(err.value.__cause__) == "28P01" and "SQLSTATE 28P01" in message
    assert "\n" not in message and role.password not in message


# ---- RDS IAM database authentication ------------------------------------------------

def _token(server: TlsServer, role: Role) -> str:
    """What RDS expects as the password now: boto3's token for this host, port and user,
    made with the session's (moto's fake) credentials, independently of the product."""
    rds = boto3.client("rds", region_name="us-east-1")
    return str(rds.generate_db_auth_token(DBHostname="127.0.0.1", Port=server.port, DBUsername=role.name))


def _connects_with_the_current_token(server: TlsServer, role: Role, db: Database) -> bool:
    """Sets the role's password to the token of this second, then opens a new connection.
    The token names its second (X-Amz-Date): if the clock ticks in between, try again."""
    for _ in range(3):
        _run(server, f"ALTER ROLE {role.name} PASSWORD '{_token(server, role)}'")
        try:
            conn = db.connect()
        except DatabaseError as e:
            if sqlstate(e.__cause__) != "28P01":
                raise
            continue
        try:
            assert conn.run("SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") == \
                [[role.name, True]]
        finally:
            conn.close()
        return True
    return False


def test_iam_auth_sends_a_fresh_rds_token_as_each_connections_password(tls_server, role, moto_reset):
    # given DATABASE_IAM_AUTH and a URL whose own password is wrong (the token replaces it)
    url = (f"postgresql://{role.name}:not-the-password@127.0.0.1:{tls_server.port}/{role.database}"
           f"?sslrootcert={tls_server.ca}")
    db = bootstrap.open_database(Settings.explicit(database_url=url, database_iam_auth=True,
                                                   aws_endpoint_url=moto_reset))
    assert db.info.sslmode == "verify-full"  # the CLI's default would be prefer: a token needs TLS
    # then the server accepts the token of this second as the password
    assert _connects_with_the_current_token(tls_server, role, db)
    # and a connection made seconds later carries a new token: the old one is refused now
    time.sleep(1.1)
    assert _connects_with_the_current_token(tls_server, role, db)


def test_iam_auth_signs_the_token_for_database_user_the_stack_sets(tls_server, role, moto_reset):
    # given a URL naming another user (a shared secret's runtime role) and DATABASE_USER, the
    # one user the function's role may rds-db:connect as (docs/DATABASE.md, "One role per function")
    url = f"postgresql://orphan_cleanup_runtime@127.0.0.1:{tls_server.port}/{role.database}?sslrootcert={tls_server.ca}"
    db = bootstrap.open_database(Settings.explicit(database_url=url, database_iam_auth=True,
                                                   database_user=role.name, aws_endpoint_url=moto_reset))
    # then the token is DATABASE_USER's and the session logs in as that user
    assert db.info.user == role.name
    assert _connects_with_the_current_token(tls_server, role, db)


@pytest.mark.parametrize("query, refused", [("sslmode=prefer", "sslmode prefer"),
                                            ("sslmode=disable", "sslmode disable"),
                                            ("host=/tmp", "a Unix socket")])
def test_iam_auth_refuses_a_url_that_allows_clear_text(query, refused):
    settings = Settings.explicit(database_url=f"postgresql://u@db.internal:5432/platform?{query}",
                                 database_iam_auth=True)
    with pytest.raises(ConfigError) as err:
        bootstrap.open_database(settings)
    assert "DATABASE_IAM_AUTH" in str(err.value) and refused in str(err.value) and "\n" not in str(err.value)


def test_the_ca_shipped_in_the_lambda_zip_verifies_the_server(tls_server, role, tmp_path):
    # given the zip built with the server's CA, unpacked as Lambda unpacks it into /var/task
    from infra import package

    assert package.main(["--out", str(tmp_path / "build"), "--no-deps", "--target", "aws",
                         "--ca-bundle", str(tls_server.ca)]) == 0
    task = tmp_path / "task"
    with zipfile.ZipFile(tmp_path / "build" / package.LAMBDA_ZIP) as zf:
        zf.extractall(task)
    shipped = task / "certs" / tls_server.ca.name
    # then a URL naming the shipped file connects with verify-full, as the functions' would
    url = (f"postgresql://{role.name}:{role.password}@127.0.0.1:{tls_server.port}/{role.database}"
           f"?sslrootcert={shipped}")
    db = bootstrap.open_database(Settings.explicit(database_url=url), deployed=True)
    with db.connection() as conn:
        assert conn.run("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") == [[True]]
    assert db.info.sslmode == "verify-full" and shipped.read_bytes() == tls_server.ca.read_bytes()
