"""Cold-start wiring shared by the deployed functions: one ``Pipeline`` per
configuration, built on first use (never at import time)."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from orphan_cleanup import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.pipeline import Pipeline
from orphan_cleanup.queues.base import Queue
from orphan_cleanup.reporting import Reporter, sentry_sink
from orphan_cleanup.settings import Settings

# The environment a pipeline depends on: a change (another test, a redeploy
# with new config) builds a new one instead of reusing a stale cached one.
ENV_KEYS = ("DATABASE_URL", "DATABASE_URL_SECRET_ARN", "ORPHAN_CLEANUP_MODE", "ORPHAN_CLEANUP_MARGIN_SECONDS",
            "ORPHAN_CLEANUP_INTERVAL_SECONDS", "ORPHAN_CLEANUP_MAX_DELETES", "ORPHAN_CLEANUP_MAX_DELETE_SHARE",
            "LISTING_QUEUE_URL", "DELETE_QUEUE_URL", "LISTING_TOPIC", "DELETE_TOPIC", "AWS_ENDPOINT_URL",
            "ORPHAN_CLEANUP_GCP_ENDPOINT", "SENTRY_DSN", "ORPHAN_CLEANUP_DATA_DIR")

QueueFactory = Callable[[Settings], tuple[Queue, Queue]]


def env_key() -> tuple[str | None, ...]:
    return tuple(os.environ.get(k) for k in ENV_KEYS)


@lru_cache(maxsize=4)
def _pipeline(key: tuple[str | None, ...], queues: QueueFactory, integrations: tuple[Any, ...],
              logger: Any) -> Pipeline:
    settings = bootstrap.load_settings()
    db = _database(settings)
    listing, delete = queues(settings)
    reporter = Reporter(logger=logger, sentry=sentry_sink(settings.sentry_dsn, list(integrations)))
    return Pipeline(settings=settings, db=db, provider_for=bootstrap.provider_factory(settings),
                    listing_queue=listing, delete_queue=delete, reporter=reporter)


def pipeline(queues: QueueFactory, integrations: tuple[Any, ...] = (), logger: Any = None) -> Pipeline:
    import logging

    return _pipeline(env_key(), queues, integrations, logger or logging.getLogger("orphan_cleanup"))


def _database(settings: Settings) -> Database:
    secret_arn = os.environ.get("DATABASE_URL_SECRET_ARN")
    if not settings.database_url and secret_arn:
        import boto3

        url = boto3.client("secretsmanager").get_secret_value(SecretId=secret_arn)["SecretString"].strip()
        return Database.from_url(url, keep_idle=True)
    return bootstrap.open_database(settings)
