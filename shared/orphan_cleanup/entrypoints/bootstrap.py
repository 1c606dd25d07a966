"""The composition root: settings, database, provider adapters, queues, and the
``Pipeline`` built from them for the CLI, the deployed functions and the demo.

Nothing else in the library reads the environment or builds a client."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline, ProviderFactory
from orphan_cleanup.cycle.reporting import Reporter, sentry_sink
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.embedded import ensure_database, start_embedded
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.providers.base import ResourceProvider
from orphan_cleanup.providers.ratelimit import process_limits, settings_budgets
from orphan_cleanup.queues.base import Queue

EMBEDDED_DB_NAME = "orphan_cleanup"

AwsSessionFactory = Callable[[], Any]
"""``() -> boto3.Session``: one per adapter, as a session is not thread-safe."""


def load_settings() -> Settings:
    """The settings from this process's environment; a bad value is a ``ConfigError``."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from e


def build_pipeline(settings: Settings, *, listing_queue: Queue, delete_queue: Queue,
                   jobs_queue: Queue | None = None, reporter: Reporter | None = None,
                   provider_for: ProviderFactory | None = None, db: Database | None = None) -> Pipeline:
    """The one place a ``Pipeline`` is assembled.

    Defaults: the database of ``open_database(settings)``, the real provider
    adapters of ``provider_factory(settings)``, and a reporter that logs and,
    with ``SENTRY_DSN``, sends to Sentry. The queues are the caller's: SQS or
    Pub/Sub for the functions, in-process ones for the CLI and the demo; the
    jobs queue only where the tick runs (the deployed lister)."""
    return Pipeline(
        settings=settings,
        db=db if db is not None else open_database(settings),
        provider_for=provider_for or provider_factory(settings),
        listing_queue=listing_queue,
        delete_queue=delete_queue,
        jobs_queue=jobs_queue,
        reporter=reporter or Reporter(sentry=sentry_sink(settings.sentry_dsn)),
    )


def open_database(settings: Settings, *, run_migrations: bool = False, deployed: bool = False) -> Database:
    """DATABASE_URL when set; else the URL in the secret DATABASE_URL_SECRET_ARN
    names (the deployed AWS functions); else the embedded Postgres in the data dir.

    ``deployed`` (the functions' wiring): a URL without ``sslmode`` means
    ``verify-full`` (against the system trust store unless it names ``sslrootcert``)
    instead of libpq's ``prefer``; the CLI and the embedded Postgres keep ``prefer``."""
    default_sslmode = "verify-full" if deployed else "prefer"
    if settings.database_url:
        db = Database.from_url(settings.database_url, keep_idle=True, default_sslmode=default_sslmode)
    elif settings.database_url_secret_arn:
        db = Database.from_url(_secret_url(settings), keep_idle=True, default_sslmode=default_sslmode)
    else:
        info = start_embedded(Path(settings.data_dir), cleanup="stop")
        db = Database(ensure_database(info, EMBEDDED_DB_NAME), keep_idle=True)
    if run_migrations:
        migrate(db)
    return db


def _secret_url(settings: Settings) -> str:
    import boto3

    secrets = boto3.client("secretsmanager", endpoint_url=settings.aws_endpoint_url)
    return str(secrets.get_secret_value(SecretId=settings.database_url_secret_arn)["SecretString"]).strip()


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
            from orphan_cleanup.providers.aws import build_aws_provider

            return build_aws_provider(backend, connect_timeout=settings.provider_connect_timeout,
                                      read_timeout=settings.provider_read_timeout,
                                      session=aws_session() if aws_session else None,
                                      endpoint_url=settings.aws_endpoint_url, limits=limits)
        from orphan_cleanup.providers.gcp import build_gcp_provider

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
