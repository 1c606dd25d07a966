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
    with pytest.raises(NotifyError, match="^NOTIFY_TOPIC_ARN: "):
        channel.send(DIGEST)


# SAFETY.md rule 22: an error that would carry a secret names its setting instead.
CANARY = "T0CANARY/B0CANARY/xyzCANARYhook"
BAD_URLS = [
    (f"hooks.slack.com/services/{CANARY}", "the URL has no scheme"),
    (f"https://hooks.slack.com/services/T0 /{CANARY}", "the URL contains a space or a control character"),
    (f"ftp://hooks.slack.com/services/{CANARY}", "the URL's scheme is not http or https"),
    (f"https:///services/{CANARY}", "the URL has no host"),
]


@pytest.mark.parametrize("url, why", BAD_URLS, ids=["no scheme", "a space", "not http", "no host"])
def test_a_bad_webhook_url_is_named_by_its_setting_never_shown(url, why):
    [channel] = notifiers(Settings.explicit(slack_webhook_url=url))

    with pytest.raises(NotifyError) as caught:
        channel.send(DIGEST)

    assert str(caught.value) == f"SLACK_WEBHOOK_URL: {why}"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no traceback carries it


@pytest.mark.parametrize("url, why", BAD_URLS[:2], ids=["no scheme", "a space"])
def test_a_bad_webhook_url_in_its_secret_names_the_secret_setting(url, why, moto_reset):
    import boto3

    arn = boto3.client("secretsmanager", endpoint_url=moto_reset, region_name="us-east-1").create_secret(
        Name="slack-hook", SecretString=url)["ARN"]
    [channel] = notifiers(Settings.explicit(slack_webhook_secret_arn=arn, aws_endpoint_url=moto_reset))

    with pytest.raises(NotifyError) as caught:
        channel.send(DIGEST)

    assert str(caught.value) == f"SLACK_WEBHOOK_SECRET_ARN: {why}"


def test_a_refused_or_failing_webhook_names_the_setting_not_the_url():
    with pytest.raises(NotifyError) as refused:
        notifiers(Settings.explicit(slack_webhook_url=f"http://127.0.0.1:1/services/{CANARY}"))[0].send(DIGEST)
    assert str(refused.value) == "SLACK_WEBHOOK_URL: the webhook is unreachable (connection refused)"

    def unreadable() -> str:
        raise KeyError(f"https://hooks.slack.com/services/{CANARY}")
    with pytest.raises(NotifyError) as secret:
        SlackNotifier(unreadable, timeout=2, setting="SLACK_WEBHOOK_SECRET_ARN").send(DIGEST)
    assert str(secret.value) == "SLACK_WEBHOOK_SECRET_ARN: the webhook URL could not be read (KeyError)"
