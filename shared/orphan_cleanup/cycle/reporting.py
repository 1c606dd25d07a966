"""STEP 6 reporting outside the database: a structured log line and a Sentry
event per orphan. Called only after the fenced apply committed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("orphan_cleanup")

# (message, level, fingerprint, extra) -> None; None when Sentry is off.
SentrySink = Callable[[str, str, list[str], dict[str, Any]], None]


class Reporter:
    def __init__(self, logger: logging.Logger | logging.LoggerAdapter | Any = log,
                 sentry: SentrySink | None = None) -> None:
        self.logger = logger
        self.sentry = sentry

    def orphan(self, backend_id: str, cycle_id: str, row: dict[str, Any]) -> None:
        fields = {"backend": backend_id, "cycle_id": cycle_id, **{k: row.get(k) for k in (
            "provider_ref", "region", "primary_id", "verdict", "reason", "owner_id", "owner_name")},
            "resources": [r["id"] for r in row.get("resources", [])]}
        msg = f"{row['verdict']} resource group {row['group_key']} ({row['reason']})"
        self.logger.warning(msg, extra={"orphan": fields})
        if self.sentry is not None:
            self.sentry(msg, "warning", ["orphan-cleanup", backend_id, row["provider_ref"]], fields)

    def error(self, message: str, **fields: Any) -> None:
        self.logger.error(message, extra={"details": fields})
        if self.sentry is not None:
            self.sentry(message, "error", ["orphan-cleanup", message], fields)


def sentry_sink(dsn: str | None, integrations: list[Any] | None = None) -> SentrySink | None:
    """Initialise Sentry once (per cold start) and return a sink, or None without a DSN."""
    if not dsn:
        return None
    import sentry_sdk

    if not sentry_sdk.get_client().is_active():
        sentry_sdk.init(dsn=dsn, integrations=integrations or [], traces_sample_rate=0)

    def capture(message: str, level: Any, fingerprint: list[str], extra: dict[str, Any]) -> None:
        with sentry_sdk.new_scope() as scope:
            scope.fingerprint = fingerprint
            for k, v in extra.items():
                scope.set_extra(k, v)
            sentry_sdk.capture_message(message, level=level)

    return capture
