"""botocore errors translated into the library's error types (the AWS edge).

Every decision is made on ``e.response["Error"]["Code"]`` (and the HTTP status
for unknown server errors) or on the botocore exception class, never on
message text. Callers always ``raise translate_error(e, ...) from e``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.parsers import ResponseParserError

from orphan_cleanup.core.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderThrottled,
    ProviderTimeout,
    ProviderUnavailable,
    ResourceInUse,
    ResourceNotFound,
)

THROTTLING_CODES = frozenset({
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "EC2ThrottledException",
    "PriorRequestNotComplete",
    "BandwidthLimitExceeded",
    "SlowDown",
})
TIMEOUT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException"})
UNAVAILABLE_CODES = frozenset({
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "Unavailable",
    "InternalError",
    "InternalFailure",
    "InternalServerError",
})
ACCESS_DENIED_CODES = frozenset({
    "UnauthorizedOperation",
    "AuthFailure",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "OptInRequired",
    "Blocked",
})
# "The resource is still in use by something": retry later, never a failure.
NOT_YET_CODES = frozenset({
    "DependencyViolation",
    "VolumeInUse",
    "IncorrectState",
    "IncorrectInstanceState",
    "InvalidNetworkInterface.InUse",
    "InvalidIPAddress.InUse",
    "InvalidGroup.InUse",
    "InvalidPlacementGroup.InUse",
    "ResourceInUse",  # ELBv2: a target group a listener or rule still uses
})

# "Something outside the group uses it": not going away by waiting for the group.
IN_USE_CODES = frozenset({"InvalidSnapshot.InUse"})


CREDENTIAL_ERRORS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)

# Everything the SDK raises for a failed call. ``ResponseParserError`` (an
# unparseable reply, e.g. a proxy's HTML 500 page) is not a ``BotoCoreError``.
SDK_ERRORS = (ClientError, BotoCoreError, ResponseParserError)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_not_found_code(code: str) -> bool:
    return code.endswith(".NotFound") or code in {"NotFound", "ResourceNotFoundException"}


def _client_error_type(exc: ClientError) -> type[ProviderError]:
    code = error_code(exc)
    if code in THROTTLING_CODES:
        return ProviderThrottled
    if code in TIMEOUT_CODES:
        return ProviderTimeout
    if code in UNAVAILABLE_CODES:
        return ProviderUnavailable
    if code in ACCESS_DENIED_CODES or code.startswith("AccessDenied"):
        return AccessDenied
    if code in NOT_YET_CODES:
        return DependencyNotReady
    if code in IN_USE_CODES:
        return ResourceInUse
    if is_not_found_code(code):
        return ResourceNotFound
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if isinstance(status, int) and status >= 500:
        return ProviderUnavailable
    return ProviderError


def _botocore_error_type(exc: BotoCoreError | ResponseParserError) -> type[ProviderError]:
    if isinstance(exc, ResponseParserError):
        return ProviderUnavailable
    # Timeouts first: ConnectTimeoutError is also an EndpointConnectionError.
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
        return ProviderTimeout
    if isinstance(exc, (EndpointConnectionError, BotoConnectionError, HTTPClientError)):
        return ProviderUnavailable
    if isinstance(exc, CREDENTIAL_ERRORS):
        return AccessDenied
    return ProviderError


def translate_error(
    exc: ClientError | BotoCoreError | ResponseParserError, *, region: str | None, operation: str | None = None
) -> ProviderError:
    """Map a botocore error to our type; the caller raises it ``from exc``.

    Throttling past retries -> ``ProviderThrottled`` (a ``ProviderUnavailable``: the
    region is skipped for this cycle, never a failed cycle); read/connect timeouts ->
    ``ProviderTimeout``; endpoint unreachable, 5xx, unparseable reply,
    ``ServiceUnavailable`` / ``InternalError`` -> ``ProviderUnavailable``; ``UnauthorizedOperation``,
    ``AccessDenied*``, missing credentials -> ``AccessDenied``; "still in use"
    codes -> ``DependencyNotReady``; "used by something else" (a snapshot an AMI was
    registered from) -> ``ResourceInUse``; ``*.NotFound`` -> ``ResourceNotFound``;
    anything else (e.g. ``ParamValidationError`` for a malformed role ARN) ->
    ``ProviderError``. The message is always one line.
    """
    where = f" in {region}" if region else ""
    what = f"{operation}{where}" if operation else f"AWS call{where}"
    if isinstance(exc, ClientError):
        code = error_code(exc) or "Unknown"
        message = _one_line(str(exc.response.get("Error", {}).get("Message", "")))
        text = f"{what}: {code}" + (f" ({message[:200]})" if message else "")
        return _client_error_type(exc)(text, region=region)
    detail = f"{type(exc).__name__}: {_one_line(str(exc))[:300]}"
    if isinstance(exc, CREDENTIAL_ERRORS):
        return AccessDenied(f"{what}: no usable AWS credentials ({detail})", region=region)
    return _botocore_error_type(exc)(f"{what}: {detail}", region=region)


def _one_line(text: str) -> str:
    """botocore's messages can span lines (``ParamValidationError``); ours never do."""
    return " ".join(text.split())


@contextmanager
def translated(region: str | None, operation: str | None = None) -> Iterator[None]:
    """Run a block of SDK calls, raising our error types ``from`` botocore's."""
    try:
        yield
    except SDK_ERRORS as exc:
        raise translate_error(exc, region=region, operation=operation) from exc
