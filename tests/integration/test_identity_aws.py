"""The AWS adapter's identity check (SAFETY.md rule 11) against the moto server.

moto's default credentials reach account 123456789012; credentials from
``AssumeRole`` on ``arn:aws:iam::210987654321:role/x`` reach 210987654321 (moto
reports the role's account in ``GetCallerIdentity``). STS calls are observed
with botocore event hooks on the session the adapter is built with.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.credentials import CredentialResolver
from botocore.exceptions import NoCredentialsError, ParamValidationError

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.errors import AccessDenied, IdentityMismatch, ProviderError, ProviderTimeout
from orphan_cleanup.providers.aws.provider import AwsProvider, build_aws_provider

pytestmark = pytest.mark.usefixtures("moto_reset")

MOTO_ACCOUNT, OTHER_ACCOUNT = "123456789012", "210987654321"
OTHER_ROLE = f"arn:aws:iam::{OTHER_ACCOUNT}:role/x"
EAST, WEST = "us-east-1", "eu-west-1"


class StsLog:
    """The STS calls a session's clients sign: (operation, region)."""

    def __init__(self, session: boto3.Session) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        session.events.register("before-sign.sts", self._record)

    def _record(self, operation_name: str, region_name: str, **_: Any) -> None:
        with self._lock:
            self.calls.append((operation_name, region_name))

    def count(self, operation: str) -> int:
        return sum(1 for op, _ in self.calls if op == operation)


def backend(account: str = MOTO_ACCOUNT, regions: tuple[str, ...] = (EAST,), **settings: Any) -> Backend:
    return Backend(id="aws-id", provider="aws", account=account, regions=regions,
                   settings=BackendSettings(**settings))


def make(session: boto3.Session, account: str = MOTO_ACCOUNT, **kw: Any) -> AwsProvider:
    regions = kw.pop("regions", (EAST,))
    timeouts = {key: kw.pop(key, default)
                for key, default in (("connect_timeout", 2), ("read_timeout", 10), ("max_attempts", 5))}
    return build_aws_provider(backend(account, regions, **kw), session=session, **timeouts)


def credentialless_session() -> boto3.Session:
    """A session that finds no credentials whatever the environment holds."""
    core = botocore.session.Session()
    core.register_component("credential_provider", CredentialResolver(providers=[]))
    return boto3.Session(botocore_session=core)


@pytest.fixture
def session() -> boto3.Session:
    return boto3.Session()


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


# -- the account the credentials reach --------------------------------------------------------------


def test_matching_account_passes_with_one_call_in_the_first_region(session):
    log = StsLog(session)
    provider = make(session, regions=(WEST, EAST))

    provider.verify_identity()

    assert provider.reached_account() == MOTO_ACCOUNT
    assert log.calls == [("GetCallerIdentity", WEST), ("GetCallerIdentity", WEST)]


def test_other_backend_account_is_a_mismatch(session):
    provider = make(session, account="111122223333")

    with pytest.raises(IdentityMismatch) as err:
        provider.verify_identity()

    assert str(err.value) == "account_mismatch: credentials reach 123456789012, backend aws-id says 111122223333"


def test_assumed_role_in_another_account_reaches_that_account(session):
    # Given: a backend that names the role's account
    log = StsLog(session)
    provider = make(session, account=OTHER_ACCOUNT, role_arn=OTHER_ROLE)

    # When / then: the check passes, asked after the role was assumed with the base credentials
    provider.verify_identity()
    assert log.count("AssumeRole") == 1
    assert log.count("GetCallerIdentity") == 0  # made with the assumed session, not the base one


def test_assumed_role_in_another_account_does_not_match_the_callers_account(session):
    provider = make(session, account=MOTO_ACCOUNT, role_arn=OTHER_ROLE)

    with pytest.raises(IdentityMismatch) as err:
        provider.verify_identity()

    assert str(err.value) == "account_mismatch: credentials reach 210987654321, backend aws-id says 123456789012"


# -- a check that cannot be made ---------------------------------------------------------------------


@pytest.mark.parametrize("settings", [{}, {"role_arn": OTHER_ROLE}], ids=["own credentials", "assumed role"])
def test_no_credentials_is_a_one_line_access_denied(settings):
    provider = make(credentialless_session(), **settings)

    with pytest.raises(AccessDenied) as err:
        provider.verify_identity()

    message = str(err.value)
    assert "\n" not in message and "no usable AWS credentials" in message
    cause = err.value.__cause__
    assert isinstance(cause, NoCredentialsError) or isinstance(cause.__cause__, NoCredentialsError)


def test_malformed_role_arn_is_a_one_line_provider_error(session):
    # The model refuses such a row (core.backends.BackendSettings); one built without validation
    # still fails in one line at the adapter.
    bad = backend().model_copy(update={"settings": BackendSettings.model_construct(role_arn="not-an-arn")})
    provider = build_aws_provider(bad, session=session, connect_timeout=2, read_timeout=10, max_attempts=5)

    with pytest.raises(ProviderError) as err:
        provider.verify_identity()

    assert not isinstance(err.value, IdentityMismatch)
    assert isinstance(err.value.__cause__, ParamValidationError)
    assert "\n" not in str(err.value) and str(err.value).startswith("sts:AssumeRole in us-east-1: ")


def test_sts_call_keeps_the_adapters_read_timeout(session, silent_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", silent_endpoint)
    provider = make(session, connect_timeout=1, read_timeout=0.3, max_attempts=1)

    with pytest.raises(ProviderTimeout):
        provider.verify_identity()


# -- caching ---------------------------------------------------------------------------------------


def test_a_success_is_cached_for_the_adapters_life(session):
    log = StsLog(session)
    provider = make(session)

    provider.verify_identity()
    provider.verify_identity()

    assert log.count("GetCallerIdentity") == 1


def test_a_failure_is_asked_again(session):
    log = StsLog(session)
    provider = make(session, account="111122223333")

    for _ in range(2):
        with pytest.raises(IdentityMismatch):
            provider.verify_identity()

    assert log.count("GetCallerIdentity") == 2
