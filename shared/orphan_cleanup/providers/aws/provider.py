"""The AWS adapter of the provider port: EC2 instances and their volumes, interfaces,
security groups, Elastic IPs, spot requests, launch templates, key pairs, placement groups,
ELBv2 load balancers and target groups, and (past their retention) our snapshots.

``AwsProvider`` only receives a client factory (``clients``), so tests and other callers
choose where clients point; ``build_aws_provider`` (the composition root's entry) builds
real ones. Listing is ``listing``'s, per region on a bounded pool; deletion is the one
algorithm (``providers.deletion``) over ``operations.AwsOperations``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from functools import partial
from typing import Any

import boto3

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError, ProviderError
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.providers.aws.calls import Ec2Calls
from orphan_cleanup.providers.aws.clients import (
    DEFAULT_MAX_ATTEMPTS,
    STS_FALLBACK_REGION,
    ClientFactory,
    assumed_role_session,
    client_config,
    session_client_factory,
)
from orphan_cleanup.providers.aws.errors import translated
from orphan_cleanup.providers.aws.kinds import INSTANCE, AwsKind, as_utc, dig
from orphan_cleanup.providers.aws.listing import describe_tagged, describe_tagged_by_arn, list_region
from orphan_cleanup.providers.aws.operations import AwsOperations
from orphan_cleanup.providers.base import parallel_regions
from orphan_cleanup.providers.deletion import OperationsProvider
from orphan_cleanup.providers.operations import Live, Target
from orphan_cleanup.providers.ratelimit import DEFAULT_BUDGETS, RateLimits, process_limits


class AwsProvider(OperationsProvider):
    """Lists and deletes the EC2 resource groups of one AWS backend (the ``ResourceProvider``
    contract). Regions are listed in parallel on ``settings.max_concurrency`` threads; the
    identity is ``sts:GetCallerIdentity`` in the first configured region, with the
    factory's credentials (the assumed role's, when one is configured)."""

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
        settings = self.backend.settings
        yield from parallel_regions(self.backend.regions, lambda region: list_region(
            self.ec2(region), region, settings, partial(self._describe_tagged, region)), settings.max_concurrency)

    def _describe_tagged(self, region: str, ec2: Any, spec: AwsKind) -> Iterator[Mapping[str, Any]]:
        """One kind's items carrying the backend's ref tag (``listing.describe_tagged``; an ELBv2
        kind's with its tags read by ARN: ``listing.describe_tagged_by_arn``)."""
        if spec.tags_by_arn:
            return describe_tagged_by_arn(self._client(spec.service, region), spec, self.tag_key)
        return describe_tagged(ec2, spec, self.tag_key)

    def operations(self, region: str) -> AwsOperations:
        """The deletion's operations in one of the backend's regions."""
        if region not in self.backend.regions:
            raise ProviderError(f"{region} is not a region of backend {self.backend.id}", region=region)
        return AwsOperations(Ec2Calls(self.ec2(region), region=region),
                             controller_keys=self.backend.settings.controller_tag_keys,
                             elb=Ec2Calls(self._client("elbv2", region), region=region),
                             autoscaling=Ec2Calls(self._client("autoscaling", region), region=region))

    def group_operations(self, group: ResourceGroup) -> AwsOperations:
        """Every resource in the group's region, one of the backend's (a forged batch may name another)."""
        outside = sorted({r.region for r in group.resources} - {group.region})
        if outside or group.region not in self.backend.regions:
            raise ProviderError(f"group {group.key} names {', '.join(outside) or group.region}, not its region"
                                f" in backend {self.backend.id}", region=group.region)
        return self.operations(group.region)

    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        if region not in self.backend.regions:
            return False
        try:
            live = self.operations(region).read([Target(INSTANCE.kind, instance_id, region)])[instance_id]
        except ProviderError:  # a malformed id, an unavailable region: cannot confirm, so no
            return False
        return isinstance(live, Live) and live.tags.get(self.tag_key) == ref

    def holds_volume(self, region: str, volume_id: str, ref: str) -> bool:
        if region not in self.backend.regions:
            return False
        try:
            live = self.operations(region).read([Target(ResourceKind.VOLUME, volume_id, region)])[volume_id]
        except ProviderError:  # a malformed id, an unavailable region: cannot confirm, so no
            return False
        return isinstance(live, Live) and live.tags.get(self.tag_key) == ref \
            and live.state not in (ResourceState.TERMINATING, ResourceState.TERMINATED)

    def instance_created_at(self, instance: Resource) -> datetime | None:
        live = self.operations(instance.region).read([Target(INSTANCE.kind, instance.id, instance.region)])
        found = live[instance.id]
        if not isinstance(found, Live):  # gone, or not answered for: the deleter skips its group
            return None
        return as_utc(dig(found.item, INSTANCE.created_path))  # LaunchTime, as listed


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
