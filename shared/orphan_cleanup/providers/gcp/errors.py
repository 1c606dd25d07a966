"""google-api-core and transport errors translated into the library's error types (the GCP
edge). Decided by type (and the API's ``reason`` code for "in use" and rate limits), never
by message text. Callers always ``raise translate(e, ...) from e`` (or use ``gcp_errors``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import google.auth.exceptions as auth_exceptions
import requests
import urllib3.exceptions
from google.api_core import exceptions as gexc
from google.protobuf import json_format

from orphan_cleanup.core.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderThrottled,
    ProviderTimeout,
    ProviderUnavailable,
    ResourceNotFound,
)

#: Error ``reason`` values (REST body) and operation error ``code`` values that mean
#: "still used by another resource / not ready yet": not yet, never failure.
IN_USE_REASONS = frozenset({"resourceInUseByAnotherResource", "resourceNotReady"})
#: The ``reason`` of a refusal for rate (HTTP 403 on Compute, or 429): throttling, not a denied permission.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
IN_USE_OP_CODES = frozenset({"RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "RESOURCE_NOT_READY"})
NOT_FOUND_OP_CODES = frozenset({"RESOURCE_NOT_FOUND"})

#: SDK exception -> our error, first match wins (subclasses before their bases).
ERROR_MAP: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], type[ProviderError]], ...] = (
    (gexc.NotFound, ResourceNotFound),
    ((gexc.Forbidden, gexc.Unauthorized), AccessDenied),  # PermissionDenied, Unauthenticated
    (gexc.TooManyRequests, ProviderThrottled),  # ResourceExhausted
    (gexc.GatewayTimeout, ProviderTimeout),  # DeadlineExceeded
    (gexc.ServerError, ProviderUnavailable),  # InternalServerError, BadGateway, ServiceUnavailable
    (requests.exceptions.Timeout, ProviderTimeout),
    (requests.exceptions.ConnectionError, ProviderUnavailable),
    (auth_exceptions.TransportError, ProviderUnavailable),
    (auth_exceptions.GoogleAuthError, AccessDenied),  # RefreshError, DefaultCredentialsError
)
TRANSLATED: tuple[type[BaseException], ...] = (
    gexc.GoogleAPIError, requests.exceptions.RequestException, auth_exceptions.GoogleAuthError,
    json_format.Error,  # a reply whose JSON does not fit the API's types: a plain ProviderError, fail closed
)


def is_throttle(exc: BaseException) -> bool:
    """Whether the API refused a call for its rate: a 429, or a 403 whose reason is a
    rate limit (Compute's per-project per-minute quotas answer so)."""
    return isinstance(exc, gexc.TooManyRequests) or (
        isinstance(exc, gexc.Forbidden) and bool(error_reasons(exc) & RATE_LIMIT_REASONS))


def error_reasons(exc: BaseException) -> set[str]:
    """The machine-readable ``reason`` values of a REST error body."""
    errors = getattr(exc, "errors", None) or ()
    return {e.get("reason", "") for e in errors if isinstance(e, Mapping)}


_TIMEOUTS = (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)


def _timed_out(exc: BaseException) -> bool:
    """Whether a transport error is a timeout underneath: requests reports a read
    timeout on a reused connection as ``ConnectionError(MaxRetryError(ReadTimeoutError))``."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, _TIMEOUTS):
            return True
        todo.extend(x for x in (e.__cause__, e.__context__, getattr(e, "reason", None), *e.args)
                    if isinstance(x, BaseException))
    return False


def translate(exc: BaseException, *, region: str | None) -> ProviderError:
    """Our error for an SDK/transport exception; decided by type (and the API's
    ``reason`` code for "in use"), never by message text."""
    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        return translate(exc.cause, region=region)
    if isinstance(exc, gexc.RetryError):
        return ProviderTimeout(f"RetryError: {exc}", region=region)
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, gexc.ClientError) and error_reasons(exc) & IN_USE_REASONS:
        return DependencyNotReady(text, region=region)
    if is_throttle(exc):
        return ProviderThrottled(text, region=region)
    if isinstance(exc, requests.exceptions.RequestException) and _timed_out(exc):
        return ProviderTimeout(text, region=region)
    for sdk_types, ours in ERROR_MAP:
        if isinstance(exc, sdk_types):
            return ours(text, region=region)
    return ProviderError(text, region=region)


@contextmanager
def gcp_errors(region: str | None) -> Iterator[None]:
    """Translate SDK errors raised inside the block, ``raise ... from e``."""
    try:
        yield
    except TRANSLATED as e:
        raise translate(e, region=region) from e
