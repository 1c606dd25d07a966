"""The notify step's wiring (part of the composition root): the channels the settings name
(``NOTIFY_TOPIC_ARN``, ``NOTIFY_TOPIC``, ``SLACK_WEBHOOK_URL`` / ``SLACK_WEBHOOK_SECRET_ARN``),
each client built here with the notification timeout, and the ``NotifyStep`` on them."""

from __future__ import annotations

import functools
from typing import Any

from orphan_cleanup.core import redact
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.notify_step import NotifyStep
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.notify.base import Notifier


def notifiers(settings: Settings) -> list[Notifier]:
    """Every configured channel; none is contacted here."""
    out: list[Notifier] = []
    if settings.notify_topic_arn:
        import boto3
        from botocore.config import Config

        from orphan_cleanup.notify.sns import SnsNotifier

        parts = settings.notify_topic_arn.split(":")
        region = parts[3] if len(parts) > 5 and parts[3] else None
        client = boto3.client("sns", endpoint_url=settings.aws_endpoint_url, region_name=region, config=Config(
            connect_timeout=settings.notify_timeout, read_timeout=settings.notify_timeout,
            retries={"mode": "standard", "max_attempts": 2}))
        out.append(SnsNotifier(client, settings.notify_topic_arn))
    if settings.notify_topic:
        from google.cloud import pubsub_v1  # type: ignore[attr-defined]  # a namespace package without stubs

        from orphan_cleanup.notify.pubsub import PubSubNotifier

        out.append(PubSubNotifier(pubsub_v1.PublisherClient, settings.notify_topic, settings.notify_timeout))
    if settings.slack_webhook_url or settings.slack_webhook_secret_arn:
        from orphan_cleanup.notify.slack import SlackNotifier

        url = settings.slack_webhook_url
        if url is not None:
            out.append(SlackNotifier(url.get_secret_value, settings.notify_timeout, setting="SLACK_WEBHOOK_URL"))
        else:
            out.append(SlackNotifier(_secret_reader(settings), settings.notify_timeout,
                                     setting="SLACK_WEBHOOK_SECRET_ARN"))
    return out


def _secret_reader(settings: Settings) -> Any:
    """Reads the webhook URL from its secret once it is first needed; a failed read is retried."""
    @functools.cache
    def read() -> str:
        import boto3

        client = boto3.client("secretsmanager", endpoint_url=settings.aws_endpoint_url)
        url = str(client.get_secret_value(SecretId=settings.slack_webhook_secret_arn)["SecretString"]).strip()
        redact.remember(url)
        return url
    return read


def digests(settings: Settings, db: Database, logger: Any = None) -> NotifyStep | None:
    """The notify step for ``Reporter.after_finish``; None when no channel is configured."""
    channels = notifiers(settings)
    if not channels:
        return None
    return NotifyStep(settings=settings, db=db, notifiers=channels, **({"logger": logger} if logger else {}))
