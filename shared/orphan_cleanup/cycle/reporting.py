"""STEP 6 reporting outside the database: a structured log line and a Sentry
event per orphan, per-backend metrics, and what follows a finished cycle (its
outcome metric, its digest). Called only after the fenced write committed; a
failing sink is logged, never raised into the cycle."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orphan_cleanup.core import redact
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.ledger.records import FinishedCycle

log = logging.getLogger("orphan_cleanup")

# (message, level, fingerprint, extra) -> None; None when Sentry is off.
SentrySink = Callable[[str, str, list[str], dict[str, Any]], None]
# (metric name, count, backend id) -> None: a count with a ``Backend`` dimension.
MetricSink = Callable[[str, float, str], None]
# What runs after a cycle finished (its digest): never raises into the cycle.
FinishSink = Callable[[FinishedCycle], object]


class Reporter:
    def __init__(self, logger: logging.Logger | logging.LoggerAdapter | Any = log,
                 sentry: SentrySink | None = None, metrics: MetricSink | None = None,
                 after_finish: FinishSink | None = None) -> None:
        self.logger = logger
        self.sentry = sentry
        self.metrics = metrics
        self.after_finish = after_finish

    def count(self, name: str, value: float, backend_id: str) -> None:
        """A per-backend count (``GroupsListed``, ``Groups_orphan``, ``Delete_deleted``, ...)."""
        if self.metrics is None:
            return
        try:
            self.metrics(name, value, backend_id)
        except Exception as e:  # a metric never fails the work it counts
            self.logger.warning(f"metric {name} not emitted: {type(e).__name__}: {e}")

    def cycle_finished(self, finished: FinishedCycle) -> None:
        """A cycle's STEP 7 committed: log it, count its outcome, run ``after_finish``
        (the digest). Nothing here can fail the cycle, which is already over."""
        self.logger.info(f"cycle {finished.cycle_id} of {finished.backend_id} finished {finished.outcome}",
                         extra={"cycle": {"backend": finished.backend_id, "cycle_id": finished.cycle_id,
                                          "mode": finished.mode, "outcome": finished.outcome}})
        self.count(f"Cycles_{finished.outcome}", 1, finished.backend_id)
        if self.after_finish is None:
            return
        try:
            self.after_finish(finished)
        except Exception as e:  # e.g. the digest's database read: logged, the cycle stands
            self.logger.error(f"after cycle {finished.cycle_id}: {type(e).__name__}: {e}")

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


def known_secrets(settings: Settings) -> tuple[str, ...]:
    """The secret values the settings hold (``redact.remember`` them, with the parts of
    each that are secrets of their own: a database URL's password, the DSN's key)."""
    from urllib.parse import unquote, urlsplit

    values: list[str] = []
    for secret in (settings.database_url, settings.slack_webhook_url, settings.sentry_dsn):
        if secret is None:
            continue
        text = secret.get_secret_value()
        values.append(text)
        try:
            parts = urlsplit(text)
            values += [unquote(p) for p in (parts.password, parts.username if secret is settings.sentry_dsn
                                            else None) if p]
        except ValueError:
            pass
    return tuple(values)


def sentry_sink(dsn: Any, integrations: list[Any] | None = None,
                secrets: tuple[str, ...] = ()) -> SentrySink | None:
    """Initialise Sentry once (per cold start) and return a sink, or None without a DSN.

    No secret reaches Sentry (SAFETY.md rule 22): no frame's local variables are sent
    (a traceback's locals hold the settings, a connection's parameters), and every event
    and breadcrumb goes through ``redact`` (the ``secrets`` given, and every one the
    process remembers later: a rotated password, a token, a webhook URL read from its
    secret), whatever integration made it (the logging one, Flask's, Lambda's)."""
    if dsn is None:
        return None
    dsn = dsn.get_secret_value() if hasattr(dsn, "get_secret_value") else str(dsn)
    if not dsn:
        return None
    import sentry_sdk

    redact.remember(*secrets)
    if not sentry_sdk.get_client().is_active():
        sentry_sdk.init(dsn=dsn, integrations=integrations or [], traces_sample_rate=0,
                        include_local_variables=False, max_request_body_size="never",
                        before_send=_scrubbed, before_breadcrumb=_scrubbed)

    def capture(message: str, level: Any, fingerprint: list[str], extra: dict[str, Any]) -> None:
        with sentry_sdk.new_scope() as scope:
            scope.fingerprint = fingerprint
            for k, v in extra.items():
                scope.set_extra(k, v)
            sentry_sdk.capture_message(message, level=level)

    return capture


def _scrubbed(event: Any, hint: Any) -> Any:
    """Sentry's ``before_send`` / ``before_breadcrumb``: the whole event, redacted."""
    return redact.redact_tree(event)
