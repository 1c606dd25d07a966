"""The composition root: settings, database, provider adapters, queues, and the
``Pipeline`` built from them for the CLI, the deployed functions and the demo.

Nothing else in the library reads the environment or builds a client."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from orphan_cleanup.core import redact
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.reporting import Reporter, known_secrets, sentry_sink
from orphan_cleanup.cycle.step_context import ProviderFactory
from orphan_cleanup.ledger.cloudsql import CloudSqlOpener
from orphan_cleanup.ledger.db import Database, PasswordSource
from orphan_cleanup.ledger.embedded import embedded_ledger
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.ledger.url import TLS_ONLY_MODES, ConnInfo, parse_database_url, secret_url
from orphan_cleanup.providers.base import ResourceProvider
from orphan_cleanup.providers.ratelimit import process_limits, settings_budgets
from orphan_cleanup.queues.base import Queue

AwsSessionFactory = Callable[[], Any]
"""``() -> boto3.Session``: one per adapter, as a session is not thread-safe."""

CloudSqlConnectorFactory = Callable[[Settings], Any]
"""``settings -> google.cloud.sql.connector.Connector`` (``cloud_sql_connector``, the default)."""


def load_settings() -> Settings:
    """The settings from this process's environment; a bad value is a ``ConfigError``."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as e:
        first = e.errors()[0]
        # not ``from e``: pydantic's text quotes the input value, a URL with its password (SAFETY.md rule 22)
        raise ConfigError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def build_pipeline(settings: Settings, *, listing_queue: Queue, delete_queue: Queue,
                   jobs_queue: Queue | None = None, reporter: Reporter | None = None,
                   provider_for: ProviderFactory | None = None, db: Database | None = None,
                   ledger_keys: bool = True) -> Pipeline:
    """The one place a ``Pipeline`` is assembled.

    Defaults: the database of ``open_database(settings)``, the real provider
    adapters of ``provider_factory(settings)``, and a reporter that logs and,
    with ``SENTRY_DSN``, sends to Sentry, and sends each eventful cycle's digest to the
    configured channels (``entrypoints/notifiers.py``). The queues are the caller's: SQS or
    Pub/Sub for the functions, in-process ones for the CLI and the demo; the
    jobs queue only where the tick runs (the deployed lister)."""
    from orphan_cleanup.entrypoints.notifiers import digests

    database = db if db is not None else open_database(settings)
    return Pipeline(
        settings=settings,
        db=database,
        provider_for=provider_for or provider_factory(settings),
        listing_queue=listing_queue,
        delete_queue=delete_queue,
        jobs_queue=jobs_queue,
        reporter=reporter or Reporter(sentry=sentry_sink(settings.sentry_dsn, secrets=known_secrets(settings)),
                                      after_finish=digests(settings, database)),
        ledger_keys=ledger_keys,
    )


def open_database(settings: Settings, *, run_migrations: bool = False, deployed: bool = False,
                  cloud_sql: CloudSqlConnectorFactory | None = None) -> Database:
    """DATABASE_URL when set; else the URL in the secret DATABASE_URL_SECRET_ARN
    names (the deployed AWS functions: a bare URL or RDS's JSON secret, re-read once
    when the server refuses the password, SQLSTATE 28P01, as after a rotation); else
    the embedded Postgres in the data dir.

    ``deployed`` (the functions' wiring): a URL without ``sslmode`` means
    ``verify-full`` (against the system trust store unless it names ``sslrootcert``)
    instead of libpq's ``prefer``; the CLI and the embedded Postgres keep ``prefer``.
    DATABASE_IAM_AUTH means ``verify-full`` by default too, and refuses a URL whose
    ``sslmode`` allows clear text: the token is a password. CLOUD_SQL_INSTANCE connects
    through the Cloud SQL connector that ``cloud_sql(settings)`` builds (default
    ``cloud_sql_connector``) on the first connection."""
    default_sslmode = "verify-full" if deployed or settings.database_iam_auth else "prefer"
    if settings.database_url or settings.database_url_secret_arn:
        reload: Callable[[], ConnInfo] | None = None
        if settings.database_url:
            info = _conn_info(settings.database_url.get_secret_value(), settings, default_sslmode)
        else:
            secret = _SecretUrl(settings)
            info = _conn_info(secret.read(), settings, default_sslmode)

            def reload() -> ConnInfo:
                return _conn_info(secret.read(), settings, default_sslmode)

        password = _rds_token(settings) if settings.database_iam_auth else None
        opener = None
        if settings.cloud_sql_instance:
            factory = cloud_sql or cloud_sql_connector
            opener = CloudSqlOpener(lambda: factory(settings), settings.cloud_sql_instance,
                                    iam_auth=settings.cloud_sql_iam_auth)
        db = Database(info, keep_idle=True, password=password, reload=reload, opener=opener)
    else:
        if settings.database_iam_auth or settings.cloud_sql_instance:
            raise ConfigError("DATABASE_IAM_AUTH and CLOUD_SQL_INSTANCE need DATABASE_URL or DATABASE_URL_SECRET_ARN"
                              " (the user and the database to log in to)")
        db = Database(embedded_ledger(settings.data_dir), keep_idle=True)
    if run_migrations:
        migrate(db)
    return db


def _conn_info(url: str, settings: Settings, default_sslmode: str) -> ConnInfo:
    info = parse_database_url(url, default_sslmode=default_sslmode)
    if settings.database_user:
        info = replace(info, user=settings.database_user)
    if settings.cloud_sql_iam_auth and not settings.cloud_sql_instance:
        raise ConfigError("CLOUD_SQL_IAM_AUTH needs CLOUD_SQL_INSTANCE")
    if settings.database_iam_auth:
        if settings.cloud_sql_instance:
            raise ConfigError("DATABASE_IAM_AUTH is RDS's; on Cloud SQL set CLOUD_SQL_IAM_AUTH instead")
        if info.unix_sock or info.sslmode not in TLS_ONLY_MODES:
            where = "a Unix socket" if info.unix_sock else f"sslmode {info.sslmode}"
            raise ConfigError(f"DATABASE_IAM_AUTH sends a token as the password, so it needs TLS: sslmode require,"
                              f" verify-ca or verify-full and a host, not {where}")
    return info


class _SecretUrl:
    """The database URL of the Secrets Manager secret DATABASE_URL_SECRET_ARN names."""

    def __init__(self, settings: Settings) -> None:
        import boto3

        self.arn = settings.database_url_secret_arn
        self.client = boto3.client("secretsmanager", endpoint_url=settings.aws_endpoint_url)

    def read(self) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            text = self.client.get_secret_value(SecretId=self.arn)["SecretString"]
        except ClientError as e:
            error = e.response.get("Error", {})
            raise ConfigError(f"cannot read the database secret {self.arn}: {error.get('Code', '?')}"
                              f" {' '.join(str(error.get('Message', '')).split())}".rstrip()) from e
        except BotoCoreError as e:
            raise ConfigError(f"cannot read the database secret {self.arn}: {' '.join(str(e).split())}") from e
        url = secret_url(str(text))
        remember_url(url)
        return url


def remember_url(url: str) -> None:
    """A database URL read at run time, and its password, are masked from then on (``core.redact``)."""
    redact.remember(url, parse_database_url(url).password)


def _rds_token(settings: Settings) -> PasswordSource:
    """A fresh RDS IAM token per connection: a SigV4-presigned string made locally from
    the function's credentials (no call to AWS), valid 15 minutes. The client is made on
    the first connection, in the region of the environment (AWS_REGION on Lambda)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    clients: list[Any] = []

    def token(info: ConnInfo) -> str:
        try:
            if not clients:
                clients.append(boto3.client("rds", endpoint_url=settings.aws_endpoint_url))
            made = str(clients[0].generate_db_auth_token(DBHostname=info.host, Port=info.port, DBUsername=info.user))
        except BotoCoreError as e:
            raise ConfigError(f"DATABASE_IAM_AUTH: cannot make an RDS IAM token: {' '.join(str(e).split())}") from e
        redact.remember(made)
        return made

    return token


def cloud_sql_connector(settings: Settings) -> Any:
    """The Cloud SQL Python Connector for CLOUD_SQL_INSTANCE: Application Default
    Credentials, CLOUD_SQL_IP_TYPE's address, IAM login with CLOUD_SQL_IAM_AUTH. Lazy
    refresh: a function's CPU is throttled between requests, so the certificate is
    refreshed when a connection needs it, not by a background task."""
    try:
        from google.auth.exceptions import GoogleAuthError
        from google.cloud.sql.connector import Connector
    except ImportError as e:
        raise ConfigError("CLOUD_SQL_INSTANCE needs the Cloud SQL connector (the [gcp] extra): pip install"
                          " --require-hashes -r requirements/install-gcp.txt from the repository root") from e
    try:
        return Connector(ip_type=settings.cloud_sql_ip_type, enable_iam_auth=settings.cloud_sql_iam_auth,
                         refresh_strategy="lazy")
    except GoogleAuthError as e:
        raise ConfigError(f"CLOUD_SQL_INSTANCE: no Google credentials: {' '.join(str(e).split())}") from e


def provider_factory(settings: Settings, *, aws_session: AwsSessionFactory | None = None,
                     max_cached: int = 16) -> ProviderFactory:
    """Build the real adapter for a backend (imports the SDK only when needed).

    AWS adapters get a session from ``aws_session`` (default: ``boto3.Session()``,
    the environment's credentials) and send every call to ``settings.aws_endpoint_url``
    when set. One adapter per backend configuration is kept and reused: a warm
    function handles many delete requests, and a fresh SDK session and client per
    message costs ~0.3 s of model loading each. A changed backend row (regions,
    settings) builds a new adapter."""
    cache: OrderedDict[str, ResourceProvider] = OrderedDict()
    lock = threading.Lock()
    limits = process_limits(settings_budgets(settings))  # one set of buckets per process

    def create(backend: Backend) -> ResourceProvider:
        if backend.provider == "aws":
            from orphan_cleanup.providers.aws.provider import build_aws_provider

            return build_aws_provider(backend, connect_timeout=settings.provider_connect_timeout,
                                      read_timeout=settings.provider_read_timeout,
                                      session=aws_session() if aws_session else None,
                                      endpoint_url=settings.aws_endpoint_url, limits=limits)
        from orphan_cleanup.providers.gcp.provider import build_gcp_provider

        return build_gcp_provider(backend, endpoint=settings.gcp_endpoint, timeout=settings.provider_read_timeout,
                                  limits=limits)

    def build(backend: Backend) -> ResourceProvider:
        key = backend.model_dump_json()
        with lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        provider = create(backend)
        with lock:
            provider = cache.setdefault(key, provider)
            while len(cache) > max_cached:
                cache.popitem(last=False)
        return provider

    return build
