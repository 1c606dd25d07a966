"""A Slack incoming webhook (``SLACK_WEBHOOK_URL``; the deployed functions read it from the
secret ``SLACK_WEBHOOK_SECRET_ARN``): the digest as a short text (``core.digest.slack_text``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from orphan_cleanup.core.digest import slack_text
from orphan_cleanup.notify.base import Notifier, NotifyError


class SlackNotifier(Notifier):
    channel = "slack"

    def __init__(self, url: Callable[[], str], timeout: float) -> None:
        # The URL is read on first use (a secret read at cold start must not fail the start).
        self._url = url
        self.timeout = timeout

    def send(self, digest: dict[str, Any]) -> None:
        try:
            url = self._url()
        except Exception as e:  # the secret could not be read: this send fails, the next one retries
            raise NotifyError(f"slack: the webhook URL could not be read: {type(e).__name__}: {e}") from e
        body = json.dumps({"text": slack_text(digest)}).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (the operator's URL)
                response.read()
        except urllib.error.HTTPError as e:
            raise NotifyError(f"slack: HTTP {e.code} from the webhook") from e
        except (urllib.error.URLError, OSError) as e:
            raise NotifyError(f"slack: the webhook is unreachable: {getattr(e, 'reason', e)}") from e
