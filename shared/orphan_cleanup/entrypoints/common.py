"""Cold-start wiring shared by the deployed functions: one ``Pipeline`` per
configuration, built on first use (never at import time)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from orphan_cleanup.core import policy
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.reporting import MetricSink, Reporter, known_secrets, sentry_sink
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.providers.base import ResourceProvider
from orphan_cleanup.queues.base import Queue

# (listing, delete, jobs): the jobs queue is None where the tick is not wired.
QueueFactory = Callable[[Settings], tuple[Queue, Queue, Queue | None]]


def pipeline(queues: QueueFactory, integrations: tuple[Any, ...] = (), logger: Any = None,
             metrics: MetricSink | None = None) -> Pipeline:
    """The warm pipeline for this invocation's settings.

    The settings are read afresh on every call (cheap) and are the cache key:
    a warm function reuses its database, queue clients and adapters until any
    setting changes (another test, a redeploy with new configuration)."""
    return _pipeline(bootstrap.load_settings(), queues, integrations, logger or logging.getLogger("orphan_cleanup"),
                     metrics)


@lru_cache(maxsize=4)
def _pipeline(settings: Settings, queues: QueueFactory, integrations: tuple[Any, ...], logger: Any,
              metrics: MetricSink | None) -> Pipeline:
    db = bootstrap.open_database(settings, deployed=True)
    listing, delete, jobs = queues(settings)
    from orphan_cleanup.entrypoints.notifiers import digests

    reporter = Reporter(logger=logger, sentry=sentry_sink(settings.sentry_dsn, list(integrations),
                                                                   secrets=known_secrets(settings)), metrics=metrics,
                        after_finish=digests(settings, db, logger))
    factory = bootstrap.provider_factory(settings)

    def provider_for(backend: Backend) -> ResourceProvider:
        # The lister refuses such a backend before its lease; this covers a key written
        # into the row while a cycle runs, for the deleter.
        refused = policy.ledger_key_refusal(backend)
        if refused is not None:
            raise ConfigError(refused)
        return factory(backend)

    return bootstrap.build_pipeline(settings, db=db, listing_queue=listing, delete_queue=delete, jobs_queue=jobs,
                                    reporter=reporter, provider_for=provider_for, ledger_keys=False)
