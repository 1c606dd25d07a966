"""SNS (``NOTIFY_TOPIC_ARN``): the digest as the message's JSON body, a short subject, and
``type``, ``backend`` and ``outcome`` as message attributes (for subscription filters)."""

from __future__ import annotations

import json
from typing import Any

from orphan_cleanup.core.digest import subject
from orphan_cleanup.core.redact import redact
from orphan_cleanup.notify.base import Notifier, NotifyError


class SnsNotifier(Notifier):
    channel = "sns"

    def __init__(self, client: Any, topic_arn: str) -> None:
        self.client = client  # a boto3 SNS client with the adapter's timeouts
        self.topic_arn = topic_arn

    def send(self, digest: dict[str, Any]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        attributes = {k: {"DataType": "String", "StringValue": str(digest[k])} for k in ("type", "backend", "outcome")}
        try:
            self.client.publish(TopicArn=self.topic_arn, Message=json.dumps(digest), Subject=subject(digest),
                                MessageAttributes=attributes)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "error")
            raise NotifyError(f"NOTIFY_TOPIC_ARN: {code}: {redact(str(e))}") from e
        except BotoCoreError as e:
            raise NotifyError(f"NOTIFY_TOPIC_ARN: {type(e).__name__}: {redact(str(e))}") from e
