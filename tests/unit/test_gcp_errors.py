"""Error translation of the GCP adapter on the real google.api_core / requests exception classes."""

from __future__ import annotations

import pytest
import requests
import urllib3.exceptions
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions

from orphan_cleanup.core.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderThrottled,
    ProviderTimeout,
    ProviderUnavailable,
    ResourceNotFound,
)
from orphan_cleanup.providers.gcp.errors import gcp_errors, translate

IN_USE = [{"reason": "resourceInUseByAnotherResource", "message": "x", "domain": "global"}]


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (gexc.NotFound("gone"), ResourceNotFound),
        (gexc.from_http_status(404, "gone", errors=[{"reason": "notFound"}]), ResourceNotFound),
        (gexc.Forbidden("no"), AccessDenied),
        (gexc.PermissionDenied("no"), AccessDenied),
        (gexc.Unauthorized("who"), AccessDenied),
        (gexc.Unauthenticated("who"), AccessDenied),
        (gexc.TooManyRequests("slow down"), ProviderThrottled),
        (gexc.ResourceExhausted("quota"), ProviderThrottled),
        (gexc.ServiceUnavailable("down"), ProviderUnavailable),
        (gexc.InternalServerError("oops"), ProviderUnavailable),
        (gexc.BadGateway("proxy"), ProviderUnavailable),
        (gexc.from_http_status(503, "down"), ProviderUnavailable),
        (gexc.DeadlineExceeded("late"), ProviderTimeout),
        (gexc.GatewayTimeout("late"), ProviderTimeout),
        (requests.exceptions.ReadTimeout("late"), ProviderTimeout),
        (requests.exceptions.ConnectTimeout("late"), ProviderTimeout),
        (requests.exceptions.ConnectionError("refused"), ProviderUnavailable),
        (requests.exceptions.ConnectionError(urllib3.exceptions.MaxRetryError(
            None, "/x", urllib3.exceptions.ReadTimeoutError(None, "/x", "late"))), ProviderTimeout),
        (auth_exceptions.TransportError("dns"), ProviderUnavailable),
        (auth_exceptions.RefreshError("expired"), AccessDenied),
        (gexc.RetryError("gave up", cause=gexc.TooManyRequests("slow")), ProviderThrottled),
        (gexc.RetryError("gave up", cause=None), ProviderTimeout),
        (gexc.BadRequest("in use", errors=IN_USE), DependencyNotReady),
        (gexc.BadRequest("bad"), ProviderError),
        (gexc.Conflict("busy"), ProviderError),
    ],
)
def test_translates_by_type(exc: BaseException, expected: type[ProviderError]) -> None:
    got = translate(exc, region="us-central1-a")
    assert type(got) is expected
    assert got.region == "us-central1-a"


def test_timeout_is_a_kind_of_unavailable() -> None:
    assert isinstance(translate(gexc.DeadlineExceeded("late"), region=None), ProviderUnavailable)


@pytest.mark.parametrize(
    "exc",
    [gexc.NotFound("resource is in use by another resource, quota exceeded, timed out"),
     gexc.BadRequest("The disk resource is already being used by instance vm")],
)
def test_message_text_is_never_consulted(exc: BaseException) -> None:
    got = translate(exc, region=None)
    assert type(got) is (ResourceNotFound if isinstance(exc, gexc.NotFound) else ProviderError)


def test_gcp_errors_chains_the_sdk_error() -> None:
    original = gexc.ServiceUnavailable("down")
    with pytest.raises(ProviderUnavailable) as info, gcp_errors("europe-west1"):
        raise original
    assert info.value.__cause__ is original
    assert info.value.region == "europe-west1"


def test_gcp_errors_lets_bugs_through() -> None:
    with pytest.raises(KeyError), gcp_errors("europe-west1"):
        raise KeyError("bug")
