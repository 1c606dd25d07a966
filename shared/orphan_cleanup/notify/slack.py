"""A Slack incoming webhook (``SLACK_WEBHOOK_URL``; the deployed functions read it from the
secret ``SLACK_WEBHOOK_SECRET_ARN``): the digest as a short text (``core.digest.slack_text``).

The URL is a secret (SAFETY.md rule 22): no error of this adapter shows it, or any part of
it; each names the setting the URL came from. Errors are raised ``from None``, so no
chained exception (urllib's texts quote the URL) reaches a traceback or a log."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from orphan_cleanup.core.digest import slack_text
from orphan_cleanup.notify.base import Notifier, NotifyError


class SlackNotifier(Notifier):
    channel = "slack"

    def __init__(self, url: Callable[[], str], timeout: float, setting: str = "SLACK_WEBHOOK_URL") -> None:
        # The URL is read on first use (a secret read at cold start must not fail the start).
        self._url = url
        self.timeout = timeout
        self.setting = setting  # how errors name the URL (SLACK_WEBHOOK_URL or SLACK_WEBHOOK_SECRET_ARN)

    def __repr__(self) -> str:
        return f"SlackNotifier(setting={self.setting!r})"

    def send(self, digest: dict[str, Any]) -> None:
        try:
            url = self._url()
        except Exception as e:  # the secret could not be read: this send fails, the next one retries
            raise NotifyError(f"{self.setting}: the webhook URL could not be read ({_kind(e)})") from None
        problem = url_problem(url)
        if problem is not None:
            raise NotifyError(f"{self.setting}: {problem}") from None
        body = json.dumps({"text": slack_text(digest)}).encode()
        failure: str | None = None
        try:
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 (the operator's URL)
                response.read()
        except urllib.error.HTTPError as e:
            failure = f"HTTP {e.code} from the webhook"
        except urllib.error.URLError as e:
            failure = f"the webhook is unreachable ({_reason(e.reason)})"
        except (OSError, ValueError) as e:  # a timeout, a reset, a URL http.client refuses
            failure = f"the webhook is unreachable ({_reason(e)})"
        if failure is not None:
            raise NotifyError(f"{self.setting}: {failure}")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook URL, in words that never quote it; None when it can."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "the URL contains a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return "the URL is malformed"
    if not parts.scheme or not url.lower().startswith(f"{parts.scheme.lower()}://"):
        return "the URL has no scheme"
    if parts.scheme.lower() not in ("http", "https"):
        return "the URL's scheme is not http or https"
    if not parts.hostname:
        return "the URL has no host"
    return None


def _reason(reason: object) -> str:
    """An OS error's words (``connection refused``, ``timed out``), never its text, which may
    quote the URL; else the error's type."""
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return type(reason).__name__ if isinstance(reason, BaseException) else "unknown reason"


def _kind(e: BaseException) -> str:
    """An SDK error's code (``ResourceNotFoundException``) or the error's type; never its text."""
    code = getattr(e, "response", {}).get("Error", {}).get("Code") if isinstance(getattr(e, "response", None),
                                                                                  dict) else None
    return str(code) if code else type(e).__name__
