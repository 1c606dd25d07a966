"""boto3 clients for the AWS adapter: timeouts, ``standard`` retries, the process's request
budgets (``ratelimit``: every HTTP attempt takes a token of its account, region and API
class) and an optional assumed role. Nothing here reads the environment: boto3 resolves
credentials and ``AWS_ENDPOINT_URL`` itself."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import CredentialProvider, DeferredRefreshableCredentials

from orphan_cleanup.providers.aws.errors import THROTTLING_CODES, translated
from orphan_cleanup.providers.ratelimit import RateLimits, attach_to_boto3_client

ClientFactory = Callable[[str, str], Any]
"""``(service, region) -> boto3 client``; must return clients usable from several threads."""

ROLE_SESSION_NAME = "orphan-cleanup"
DEFAULT_MAX_ATTEMPTS = 5
STS_FALLBACK_REGION = "us-east-1"


def client_config(*, connect_timeout: float, read_timeout: float, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                  max_pool_connections: int = 10) -> Config:
    """botocore config for every adapter call: bounded time, ``standard`` retries.

    Not ``adaptive``: its client-side limiter is per client, so threads and clients of
    one account and region would each think they have the whole budget; the shared
    buckets of ``ratelimit`` do that job (``session_client_factory``). ``standard`` keeps
    the backoff with jitter and the retry quota; ``max_attempts`` is botocore's: the
    retries after the first try. A call still throttled then raises ``ProviderThrottled``
    (its region is unavailable this cycle).
    """
    return Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": "standard", "max_attempts": max_attempts},
        max_pool_connections=max_pool_connections,
    )


def session_client_factory(session: boto3.Session, config: Config, *,
                           endpoint_url: str | None = None, limits: RateLimits | None = None,
                           account: str = "") -> ClientFactory:
    """A thread-safe factory over one boto3 session (``Session.client`` is not);
    ``endpoint_url``, when given, for every service (moto, a VPC endpoint). With
    ``limits``, every HTTP attempt of every client takes a token of the bucket of
    (``account``, its region, its service, the operation's API class)."""
    lock = threading.Lock()

    def make(service: str, region: str) -> Any:
        with lock:
            client = session.client(service, region_name=region, config=config, endpoint_url=endpoint_url)
        if limits is not None:
            attach_to_boto3_client(client, limits, account=account, region=region,
                                   throttling_codes=THROTTLING_CODES)
        return client

    return make


class _AssumedRole(CredentialProvider):
    METHOD = "orphan-cleanup-assume-role"
    CANONICAL_NAME = "custom-orphan-cleanup-assume-role"

    def __init__(self, fetch: Callable[[], dict[str, str]]) -> None:
        super().__init__()
        self._fetch = fetch

    def load(self) -> DeferredRefreshableCredentials:
        return DeferredRefreshableCredentials(refresh_using=self._fetch, method=self.METHOD)


def assumed_role_session(
    base: boto3.Session, *, role_arn: str, external_id: str | None, config: Config, region: str | None,
    endpoint_url: str | None = None, limits: RateLimits | None = None, account: str = "",
) -> boto3.Session:
    """A session whose credentials come from ``sts:AssumeRole`` on ``base``'s
    credentials (session name ``orphan-cleanup``), fetched on first use and
    refreshed before they expire. No network call happens here."""
    sts = base.client("sts", region_name=region, config=config, endpoint_url=endpoint_url)
    if limits is not None:
        attach_to_boto3_client(sts, limits, account=account, region=region or STS_FALLBACK_REGION,
                               throttling_codes=THROTTLING_CODES)
    params = {"RoleArn": role_arn, "RoleSessionName": ROLE_SESSION_NAME}
    if external_id:
        params["ExternalId"] = external_id

    def fetch() -> dict[str, str]:
        with translated(region, "sts:AssumeRole"):
            creds = sts.assume_role(**params)["Credentials"]
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": creds["Expiration"].isoformat(),
        }

    core = botocore.session.Session()
    core.get_component("credential_provider").insert_before("env", _AssumedRole(fetch))
    return boto3.Session(botocore_session=core)
