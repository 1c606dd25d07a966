"""Pub/Sub (``NOTIFY_TOPIC``, ``projects/P/topics/T``): the digest as the message's JSON data,
with ``type``, ``backend`` and ``outcome`` attributes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orphan_cleanup.core.redact import redact
from orphan_cleanup.notify.base import Notifier, NotifyError


class PubSubNotifier(Notifier):
    channel = "pubsub"

    def __init__(self, publisher: Callable[[], Any], topic: str, timeout: float) -> None:
        # ``() -> google.cloud.pubsub_v1.PublisherClient``, called on first use: building one
        # reads credentials, which must not fail a cold start.
        self._publisher = publisher
        self._client: Any = None
        self.topic = topic
        self.timeout = timeout

    def send(self, digest: dict[str, Any]) -> None:
        import google.auth.exceptions
        from google.api_core import exceptions as gexc

        try:
            if self._client is None:
                self._client = self._publisher()
            future = self._client.publish(self.topic, json.dumps(digest).encode(), type=str(digest["type"]),
                                            backend=str(digest["backend"]), outcome=str(digest["outcome"]))
            future.result(timeout=self.timeout)
        except (gexc.GoogleAPIError, TimeoutError, google.auth.exceptions.GoogleAuthError) as e:
            raise NotifyError(f"NOTIFY_TOPIC: {type(e).__name__}: {redact(' '.join(str(e).split()))}") from e
        except (ValueError, OSError) as e:  # credentials that cannot be read: never their text (it may quote a key)
            raise NotifyError(f"NOTIFY_TOPIC: the client could not be built ({type(e).__name__})") from None
