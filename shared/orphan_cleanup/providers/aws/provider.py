"""The AWS adapter: EC2 instances and their volumes, interfaces, security
groups, Elastic IPs, spot requests and (past their retention) our snapshots,
listed with each service's own describe call.

Wiring: ``build_aws_provider`` (the composition root's entry) builds real
boto3 clients with timeouts, standard retries, the process's request budgets
(``ratelimit``: every HTTP attempt takes a token of its account, region and API
class) and an optional assumed role;
``AwsProvider`` itself only receives a client factory, so tests and other
callers choose where clients point. Nothing here reads the environment:
boto3 resolves credentials and ``AWS_ENDPOINT_URL`` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import CredentialProvider, DeferredRefreshableCredentials

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError, ProviderError
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteResult
from orphan_cleanup.providers.aws.calls import Ec2Calls
from orphan_cleanup.providers.aws.delete import GroupDeletion
from orphan_cleanup.providers.aws.errors import THROTTLING_CODES, translated
from orphan_cleanup.providers.aws.kinds import INSTANCE, SNAPSHOT, AwsKind, as_utc, dig, tags_of
from orphan_cleanup.providers.aws.resources import link_resources, to_resource
from orphan_cleanup.providers.aws.snapshots import expired, listed_kinds, taken_by_us
from orphan_cleanup.providers.base import ResourceProvider, group_resources, not_yet_is_deleting, parallel_regions
from orphan_cleanup.providers.ratelimit import DEFAULT_BUDGETS, RateLimits, attach_to_boto3_client, process_limits

ClientFactory = Callable[[str, str], Any]
"""``(service, region) -> boto3 client``; must return clients usable from several threads."""

ROLE_SESSION_NAME = "orphan-cleanup"
DEFAULT_MAX_ATTEMPTS = 5
STS_FALLBACK_REGION = "us-east-1"


class AwsProvider(ResourceProvider):
    """Lists and deletes the EC2 resource groups of one AWS backend.

    Implements the ``ResourceProvider`` contract (see its docstring). AWS specifics:

    - listing: per region, one describe call per kind (``aws_kinds.KINDS``),
      server-side filtered on ``tag-key = settings.tag_key`` (never an unfiltered
      describe: it draws from EC2's smaller unfiltered bucket), paginated at each
      API's largest page (``AwsKind.page_size``); never
      the Resource Groups Tagging API; instances in ``terminated`` are
      excluded by filter; regions run in parallel on
      ``settings.max_concurrency`` threads;
    - attachment: volumes and interfaces by their attachment, addresses by
      their instance (or their interface's instance), security groups by the
      single same-ref instance that uses them (see ``link_resources``);
    - deletion: ``aws_delete.GroupDeletion`` (re-read, terminate, confirm,
      then ``aws_kinds.DELETE_ORDER``: volumes, addresses, interfaces,
      security groups);
    - identity: ``sts:GetCallerIdentity`` in the first configured region, with
      the factory's credentials (the assumed role's, when one is configured).
    """

    def __init__(self, backend: Backend, client_factory: ClientFactory) -> None:
        if backend.provider != "aws":
            raise ConfigError(f"backend {backend.id} is a {backend.provider} backend, not aws")
        super().__init__(backend)
        self._client_factory = client_factory
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    @property
    def client_factory(self) -> ClientFactory:
        return self._client_factory

    def ec2(self, region: str) -> Any:
        """The (cached) EC2 client of one region."""
        return self._client("ec2", region)

    def reached_account(self) -> str:
        # STS has no region of its own to prefer; without configured regions use its home one.
        region = self.backend.regions[0] if self.backend.regions else STS_FALLBACK_REGION
        sts = self._client("sts", region)
        with translated(region, "sts:GetCallerIdentity"):
            reply = sts.get_caller_identity()
        account = reply.get("Account") if isinstance(reply, Mapping) else None
        if not isinstance(account, str) or not account:
            raise ProviderError(f"sts:GetCallerIdentity in {region}: no Account in the reply", region=region)
        return account

    def _client(self, service: str, region: str) -> Any:
        with self._lock:
            client = self._clients.get((service, region))
            if client is None:
                with translated(region, f"create {service} client"):
                    client = self._clients[(service, region)] = self._client_factory(service, region)
            return client

    def iter_listing(self) -> Iterator[RegionListing]:
        yield from parallel_regions(self.backend.regions, self._list_region, self.backend.settings.max_concurrency)

    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        if group.region not in self.backend.regions:
            raise ProviderError(
                f"group {group.key} is in {group.region}, not a region of backend {self.backend.id}",
                region=group.region,
            )
        deletion = GroupDeletion(self.ec2(group.region), group, tag_key=self.tag_key, protect_key=self.protect_key,
                                 protect_keys=self.protect_keys,
                                 controller_keys=self.backend.settings.controller_tag_keys,
                                 snapshot_before_delete=self.backend.settings.snapshot_before_delete,
                                 retain_snapshots_days=self.backend.settings.retain_snapshots_days,
                                 journal=journal, remembered_protection=remembered_protection,
                                 known_attached=known_attached)
        return not_yet_is_deleting(group, deletion.run)

    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        if region not in self.backend.regions:
            return False
        try:
            item = self._calls(region, ref).read(INSTANCE, instance_id)
        except ProviderError:  # a malformed id, an unavailable region: cannot confirm, so no
            return False
        return item is not None and tags_of(item, INSTANCE).get(self.tag_key) == ref

    def instance_created_at(self, instance: Resource) -> datetime | None:
        if instance.region not in self.backend.regions:
            raise ProviderError(f"instance {instance.id} is in {instance.region}, not a region of backend"
                                f" {self.backend.id}", region=instance.region)
        item = self._calls(instance.region, "").read(INSTANCE, instance.id)  # LaunchTime, as listed
        return None if item is None else as_utc(dig(item, INSTANCE.created_path))

    def _calls(self, region: str, ref: str) -> Ec2Calls:
        return Ec2Calls(self.ec2(region), region=region, ref=ref, tag_key=self.tag_key,
                        protect_keys=self.protect_keys)

    def _list_region(self, region: str) -> list[ResourceGroup]:
        ec2 = self.ec2(region)
        raw: dict[ResourceKind, list[Mapping[str, Any]]] = {}
        retain_days = self.backend.settings.retain_snapshots_days
        kinds = listed_kinds(retain_days)
        for spec in kinds:
            with translated(region, spec.describe):
                raw[spec.kind] = list(self._describe_tagged(ec2, spec))
        try:
            if retain_days is not None:  # a retained snapshot is not listed: no orphan, no unsettled cycle
                now = datetime.now(UTC)
                raw[SNAPSHOT.kind] = [s for s in raw[SNAPSHOT.kind] if expired(s, retain_days=retain_days, now=now)
                                      and taken_by_us(s, self.tag_key)]  # never a backup we did not take
            keys = self.backend.settings.controller_tag_keys
            resources = [to_resource(spec, item, region, keys) for spec in kinds for item in raw[spec.kind]]
            linked = link_resources(raw, resources, self.tag_key)
        except (KeyError, TypeError, ValueError) as exc:
            # An unexpected reply shape fails the region (fail closed), it never drops items silently.
            raise ProviderError(f"unexpected describe reply in {region}: {exc!r}", region=region) from exc
        live = [r for r in linked if r.state is not ResourceState.TERMINATED]
        return group_resources(live, self.tag_key)

    def _describe_tagged(self, ec2: Any, spec: AwsKind) -> Iterator[Mapping[str, Any]]:
        filters = [{"Name": "tag-key", "Values": [self.tag_key]}, *spec.list_filters]
        if ec2.can_paginate(spec.describe):
            paging = {"PageSize": spec.page_size} if spec.page_size else {}
            pages = ec2.get_paginator(spec.describe).paginate(Filters=filters, PaginationConfig=paging,
                                                             **spec.list_params)
            for page in pages:
                yield from spec.items(page)
        else:
            yield from spec.items(getattr(ec2, spec.describe)(Filters=filters, **spec.list_params))


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


def build_aws_provider(
    backend: Backend,
    *,
    connect_timeout: float,
    read_timeout: float,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    session: boto3.Session | None = None,
    endpoint_url: str | None = None,
    limits: RateLimits | None = None,
) -> AwsProvider:
    """Build the adapter with real boto3 clients (the composition root's call).

    ``session`` defaults to a fresh ``boto3.Session()`` (environment
    credentials, ``AWS_ENDPOINT_URL`` honoured by boto3); ``endpoint_url``,
    when given, is where every call goes (the role's ``sts:AssumeRole`` too). When
    ``backend.settings.role_arn`` is set, every client uses credentials
    assumed from that role (with ``external_id`` when given). ``limits`` are the
    request budgets (default: the process's buckets at the default rates).
    """
    settings = backend.settings
    limits = limits if limits is not None else process_limits(DEFAULT_BUDGETS)
    account = backend.scope_account
    config = client_config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_attempts=max_attempts,
        max_pool_connections=max(10, 2 * settings.max_concurrency),
    )
    session = session or boto3.Session()
    if settings.role_arn:
        session = assumed_role_session(
            session,
            role_arn=settings.role_arn,
            external_id=settings.external_id,
            config=config,
            region=backend.regions[0] if backend.regions else None,
            endpoint_url=endpoint_url,
            limits=limits,
            account=account,
        )
    factory = session_client_factory(session, config, endpoint_url=endpoint_url, limits=limits, account=account)
    return AwsProvider(backend, factory)
