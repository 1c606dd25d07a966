"""CLOUD_SQL_INSTANCE: the wiring up to the Cloud SQL Python Connector, on a real Postgres.

What is real here: the composition root choosing the connector path from the settings,
the connector's own pg8000 helper (``google.cloud.sql.connector.pg8000.connect``, which
the connector calls with its TLS socket) logging in to the test Postgres, and everything
``ledger`` then does on that connection (migrate, the URL's search_path).

What is not: the ``Connector`` itself. ``LocalConnector`` stands in for it, injected at
the composition root (``open_database(cloud_sql=...)``): it hands the helper a plain
socket to the local server where the real one asks the Cloud SQL Admin API for the
instance's address and an ephemeral certificate and opens TLS to port 3307. A fake Admin
API and server-side proxy would be our guess at Google's protocol, so none is built:
the Admin API, the certificates, IAM login and private IP are verified only on Cloud SQL.
The default factory (``bootstrap.cloud_sql_connector``) is checked to build Google's
``Connector`` with the settings' IP type, IAM flag and lazy refresh, and to turn missing
credentials into one line.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.cloud.sql.connector import pg8000 as connector_pg8000

from orphan_cleanup.core.errors import ConfigError, DatabaseError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.migrate import available_migrations, migrate
from orphan_cleanup.ledger.url import ConnInfo

INSTANCE = "my-project:us-central1:ledger"


@dataclass
class LocalConnector:
    """``Connector.connect(instance, driver, **kwargs)`` onto the local server's socket."""

    server: ConnInfo
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def connect(self, instance: str, driver: str, **kwargs: Any) -> Any:
        self.calls.append((instance, driver, dict(kwargs)))
        kwargs.pop("enable_iam_auth")
        if self.server.unix_sock:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(self.server.unix_sock)
        else:
            sock = socket.create_connection((self.server.host, self.server.port))
        return connector_pg8000.connect("127.0.0.1", sock, **kwargs)


@pytest.fixture
def cloud_sql_db(pg_server: ConnInfo, empty_db):
    built: list[LocalConnector] = []

    def factory(settings: Settings) -> LocalConnector:
        assert settings.cloud_sql_instance == INSTANCE
        built.append(LocalConnector(pg_server))
        return built[0]

    def open_(**settings: Any):
        url = f"postgresql://{pg_server.user}:pw@/{empty_db.info.database}?options=-csearch_path%3Dledger"
        db = bootstrap.open_database(Settings.explicit(database_url=url, cloud_sql_instance=INSTANCE, **settings),
                                     deployed=True, cloud_sql=factory)
        return db, built

    with empty_db.connection() as conn:
        conn.run("CREATE SCHEMA ledger")
    return open_


def test_cloud_sql_instance_connects_through_the_connector_with_pg8000(cloud_sql_db):
    db, built = cloud_sql_db()
    assert built == []  # no connector (no credentials read, no thread) before the first connection
    # when the ledger is migrated and read through it
    assert migrate(db) == [name for _, name, _ in available_migrations()]
    with db.connection() as conn:
        assert conn.run("SELECT current_schema(), count(*) FROM backends")[0] == ["ledger", 0]
    # then one connector served every connection, asked for this instance with pg8000
    assert len(built) == 1 and built[0].calls
    for instance, driver, kwargs in built[0].calls:
        assert (instance, driver, kwargs["enable_iam_auth"]) == (INSTANCE, "pg8000", False)
        assert kwargs["startup_params"] == {"options": "-csearch_path=ledger"} and kwargs["password"] == "pw"
        assert not {"host", "port", "ssl_context", "unix_sock"} & set(kwargs)  # the connector's own


def test_cloud_sql_iam_auth_logs_in_as_the_functions_user_without_a_password(cloud_sql_db, empty_db):
    # given the IAM database user of one function (DATABASE_USER, set per function by infra/gcp)
    iam_user = f"lister-{empty_db.info.database}@my-project.iam"
    with empty_db.connection() as conn:
        conn.run(f'CREATE ROLE "{iam_user}" LOGIN')
    try:
        db, built = cloud_sql_db(cloud_sql_iam_auth=True, database_user=iam_user)
        with db.connection() as conn:
            assert conn.run("SELECT current_user")[0][0] == iam_user
        db.close()
    finally:
        with empty_db.connection() as conn:
            conn.run(f'DROP ROLE "{iam_user}"')
    # then the connector was asked for an IAM login, and got no password to send
    (instance, driver, kwargs), = built[0].calls
    assert kwargs["enable_iam_auth"] is True and "password" not in kwargs and kwargs["user"] == iam_user


def test_a_connector_failure_is_one_line(pg_server, empty_db):
    class Broken:
        def connect(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("403 Forbidden:\n the caller lacks cloudsql.instances.connect")

    url = f"postgresql://u@/{empty_db.info.database}"
    db = bootstrap.open_database(Settings.explicit(database_url=url, cloud_sql_instance=INSTANCE),
                                 deployed=True, cloud_sql=lambda _s: Broken())
    with pytest.raises(DatabaseError) as err:
        with db.connection():
            pass
    message = str(err.value)
    assert message.startswith(f"cannot connect to the database at Cloud SQL instance {INSTANCE}/")
    assert "cloudsql.instances.connect" in message and "\n" not in message


def test_the_default_factory_builds_googles_connector_from_the_settings(tmp_path, monkeypatch):
    # given Application Default Credentials: a service-account key made here (nothing is called with it)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.cloud.sql.connector import Connector, IPTypes, RefreshStrategy

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    (tmp_path / "sa.json").write_text(json.dumps({
        "type": "service_account", "project_id": "my-project", "private_key_id": "1", "private_key": key,
        "client_email": "lister@my-project.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
    connector = bootstrap.cloud_sql_connector(Settings.explicit(cloud_sql_instance=INSTANCE, cloud_sql_iam_auth=True,
                                                                cloud_sql_ip_type="private"))
    try:
        assert isinstance(connector, Connector)
        # the connector's own defaults for every connect: what CLOUD_SQL_* asked for
        assert connector._ip_type == IPTypes.PRIVATE and connector._enable_iam_auth is True
        assert connector._refresh_strategy == RefreshStrategy.LAZY
    finally:
        connector.close()


def test_no_google_credentials_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError) as err:
        bootstrap.cloud_sql_connector(Settings.explicit(cloud_sql_instance=INSTANCE))
    assert str(err.value).startswith("CLOUD_SQL_INSTANCE: no Google credentials") and "\n" not in str(err.value)
