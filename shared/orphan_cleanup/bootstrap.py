"""The composition root: settings, database, provider adapters, queues."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from orphan_cleanup.errors import ConfigError
from orphan_cleanup.ledger.db import Database, ensure_database, start_embedded
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.models import Backend
from orphan_cleanup.pipeline import ProviderFactory
from orphan_cleanup.providers.base import ResourceProvider
from orphan_cleanup.settings import Settings

EMBEDDED_DB_NAME = "orphan_cleanup"


def load_settings() -> Settings:
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from e


def open_database(settings: Settings, *, run_migrations: bool = False) -> Database:
    """DATABASE_URL when set, else the embedded Postgres in the data dir."""
    if settings.database_url:
        db = Database.from_url(settings.database_url, keep_idle=True)
    else:
        info = start_embedded(Path(settings.data_dir), cleanup="stop")
        db = Database(ensure_database(info, EMBEDDED_DB_NAME), keep_idle=True)
    if run_migrations:
        migrate(db)
    return db


def provider_factory(settings: Settings, *, max_cached: int = 16) -> ProviderFactory:
    """Build the real adapter for a backend (imports the SDK only when needed).

    One adapter per backend configuration is kept and reused: a warm function
    handles many delete requests, and a fresh SDK session and client per
    message costs ~0.3 s of model loading each. A changed backend row (regions,
    settings) builds a new adapter."""
    cache: OrderedDict[str, ResourceProvider] = OrderedDict()
    lock = threading.Lock()

    def create(backend: Backend) -> ResourceProvider:
        if backend.provider == "aws":
            from orphan_cleanup.providers.aws import build_aws_provider

            return build_aws_provider(backend, connect_timeout=settings.provider_connect_timeout,
                                      read_timeout=settings.provider_read_timeout)
        from orphan_cleanup.providers.gcp import build_gcp_provider

        return build_gcp_provider(backend, endpoint=settings.gcp_endpoint, timeout=settings.provider_read_timeout)

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
