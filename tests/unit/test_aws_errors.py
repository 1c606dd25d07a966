"""botocore errors -> our error types, on the real botocore exception classes."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError

from orphan_cleanup.core.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderThrottled,
    ProviderTimeout,
    ProviderUnavailable,
    ResourceNotFound,
)
from orphan_cleanup.providers.aws.errors import translate_error, translated


def client_error(code: str, status: int = 400, message: str = "") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "DescribeInstances",
    )


@pytest.mark.parametrize(
    "code, status, expected",
    [
        ("RequestLimitExceeded", 503, ProviderThrottled),
        ("Throttling", 400, ProviderThrottled),
        ("ThrottlingException", 400, ProviderThrottled),
        ("RequestTimeout", 400, ProviderTimeout),
        ("ServiceUnavailable", 503, ProviderUnavailable),
        ("Unavailable", 503, ProviderUnavailable),
        ("InternalError", 500, ProviderUnavailable),
        ("SomethingNew", 502, ProviderUnavailable),
        ("UnauthorizedOperation", 403, AccessDenied),
        ("AccessDenied", 403, AccessDenied),
        ("AccessDeniedException", 400, AccessDenied),
        ("AuthFailure", 401, AccessDenied),
        ("OptInRequired", 401, AccessDenied),
        ("InvalidInstanceID.NotFound", 400, ResourceNotFound),
        ("InvalidVolume.NotFound", 400, ResourceNotFound),
        ("InvalidNetworkInterfaceID.NotFound", 400, ResourceNotFound),
        ("InvalidGroup.NotFound", 400, ResourceNotFound),
        ("InvalidAllocationID.NotFound", 400, ResourceNotFound),
        ("DependencyViolation", 400, DependencyNotReady),
        ("VolumeInUse", 400, DependencyNotReady),
        ("InvalidNetworkInterface.InUse", 400, DependencyNotReady),
        ("InvalidIPAddress.InUse", 400, DependencyNotReady),
        ("InvalidParameterValue", 400, ProviderError),
        ("InvalidInstanceID.Malformed", 400, ProviderError),
    ],
)
def test_client_error_codes_map_to_our_types(code, status, expected):
    err = translate_error(client_error(code, status), region="eu-west-1", operation="describe_instances")

    assert type(err) is expected
    assert err.region == "eu-west-1"
    assert code in str(err)


def test_message_text_is_never_what_decides():
    misleading = client_error("InvalidParameterValue", message="Request limit exceeded; resource not found; timeout")

    assert type(translate_error(misleading, region="us-east-1")) is ProviderError


@pytest.mark.parametrize(
    "exc, expected",
    [
        (ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com"), ProviderTimeout),
        (ConnectTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com"), ProviderTimeout),
        (EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com"), ProviderUnavailable),
        (NoCredentialsError(), AccessDenied),
        (ResponseParserError("Unable to parse response, invalid XML received"), ProviderUnavailable),
        (ParamValidationError(report="bad"), ProviderError),
    ],
)
def test_botocore_errors_map_to_our_types(exc, expected):
    err = translate_error(exc, region="us-east-1")

    assert type(err) is expected and err.region == "us-east-1"


def test_timeouts_are_a_kind_of_unavailable():
    # seed 004: after a timeout the rest of the region is skipped, like unavailable.
    assert isinstance(translate_error(ReadTimeoutError(endpoint_url="x"), region="r"), ProviderUnavailable)


def test_translated_raises_from_the_botocore_error():
    original = client_error("UnauthorizedOperation", 403)

    with pytest.raises(AccessDenied) as caught:
        with translated("ap-south-1", "describe_volumes"):
            raise original

    assert caught.value.__cause__ is original
    assert caught.value.region == "ap-south-1"
    assert "describe_volumes" in str(caught.value)


def test_translated_lets_other_exceptions_through():
    with pytest.raises(KeyError):
        with translated("us-east-1"):
            raise KeyError("bug")
