"""The notification adapters against real transports: Pub/Sub through the fake Publisher
service (the real client), and the error contract (``NotifyError``, nothing else) of
the Pub/Sub, Slack and SNS adapters when their channel is not there."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints.notifiers import notifiers
from orphan_cleanup.notify.base import NotifyError
from orphan_cleanup.notify.slack import SlackNotifier
from tests.support.pubsub_harness import pubsub, pubsub_server  # noqa: F401  (fixtures)

TOPIC = "projects/p/topics/digests"
DIGEST = {"type": "orphan-cleanup.cycle", "backend": "gcp-main", "provider": "gcp", "account": "p", "cycle_id": "c1",
          "mode": "report", "outcome": "clean", "new_orphans": [], "deleted": [], "delete_failed": [],
          "open_orphans": 0, "failures": [], "stale_seconds": None, "error": None,
          "counts": {"new_orphans": 0, "deleted": 0, "delete_failed": 0}, "notify_failures": 0, "at": "2026-01-01"}


def test_pubsub_publishes_the_digest_with_its_attributes(pubsub):  # noqa: F811
    [channel] = notifiers(Settings.explicit(notify_topic=TOPIC))

    channel.send(DIGEST)

    [message] = pubsub.take(TOPIC)
    assert message.json() == DIGEST
    assert message.attributes == {"type": "orphan-cleanup.cycle", "backend": "gcp-main", "outcome": "clean"}


def test_an_unreachable_webhook_or_an_unreadable_secret_is_a_notify_error():
    with pytest.raises(NotifyError, match="unreachable"):
        SlackNotifier(lambda: "http://127.0.0.1:1/hook", timeout=2).send(DIGEST)

    def no_secret() -> str:
        raise KeyError("no such secret")
    with pytest.raises(NotifyError, match="could not be read"):
        SlackNotifier(no_secret, timeout=2).send(DIGEST)


def test_a_missing_sns_topic_is_a_notify_error(moto_reset):
    [channel] = notifiers(Settings.explicit(notify_topic_arn="arn:aws:sns:us-east-1:123456789012:nope",
                                            aws_endpoint_url=moto_reset))
    with pytest.raises(NotifyError, match="sns"):
        channel.send(DIGEST)
