"""Compute's rate refusals are throttling, not a denied permission (issue #17 item 2):
a 429, or a 403 whose reason is ``rateLimitExceeded`` / ``userRateLimitExceeded``,
translates to ``ProviderThrottled`` (an unavailable region), and reads retry on them."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from orphan_cleanup.core.errors import AccessDenied, ProviderThrottled, ProviderUnavailable
from orphan_cleanup.providers.gcp.calls import read_retry
from orphan_cleanup.providers.gcp.errors import is_throttle, translate


def forbidden(reason: str) -> gexc.Forbidden:
    return gexc.Forbidden("refused", errors=[{"reason": reason, "domain": "usageLimits", "message": "refused"}])


@pytest.mark.parametrize("exc", [forbidden("rateLimitExceeded"), forbidden("userRateLimitExceeded"),
                                 gexc.TooManyRequests("slow down")])
def test_a_rate_refusal_is_throttling_and_an_unavailable_region(exc):
    assert is_throttle(exc)
    ours = translate(exc, region="us-central1")
    assert isinstance(ours, ProviderThrottled) and isinstance(ours, ProviderUnavailable)


def calls_until(errors: list[Exception]) -> tuple[list[int], object]:
    """A call that raises ``errors`` in turn, then answers; and the list of its attempts."""
    attempts: list[int] = []

    def call() -> str:
        attempts.append(1)
        if len(attempts) <= len(errors):
            raise errors[len(attempts) - 1]
        return "answer"

    return attempts, call


def test_a_denied_permission_stays_access_denied_and_is_not_retried():
    exc = forbidden("forbidden")
    assert not is_throttle(exc)
    assert isinstance(translate(exc, region=None), AccessDenied)
    attempts, call = calls_until([exc])
    with pytest.raises(gexc.Forbidden):
        read_retry(5.0)(call)()
    assert len(attempts) == 1


def test_each_retried_refusal_is_reported_before_the_retry():
    seen: list[str] = []
    attempts, call = calls_until([forbidden("rateLimitExceeded")])
    assert read_retry(5.0, on_throttle=lambda: seen.append("throttled"))(call)() == "answer"
    assert len(attempts) == 2 and seen == ["throttled"]
    unavailable, down = calls_until([gexc.ServiceUnavailable("down")])
    with pytest.raises(gexc.ServiceUnavailable):  # a 503 is not retried (seed 004)
        read_retry(5.0, on_throttle=lambda: seen.append("throttled"))(down)()
    assert len(unavailable) == 1 and seen == ["throttled"]
