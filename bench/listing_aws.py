"""Listing benchmark, AWS side: a moto server, a fleet, and three ways to list it
(see ``bench.listing``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import median
from bench.listing import TAG, Measured
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import ResourceGroup, ResourceKind, ResourceState
from tests.support.listing import collect

REGION = "us-east-1"
AMI = "ami-12c6146b"


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto server on a free port, with this process's AWS environment pointed at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    from orphan_cleanup.demo.moto_gaps import filled
    from tests.support.moto import FAKE_ENV, UNSET_ENV

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in (*FAKE_ENV, *UNSET_ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(FAKE_ENV)
    os.environ["AWS_ENDPOINT_URL"] = url
    for k in UNSET_ENV:
        os.environ.pop(k, None)
    boto3.DEFAULT_SESSION = None
    try:
        with filled():  # what moto lacks of EC2 (placement groups, key pairs by id)
            yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        boto3.DEFAULT_SESSION = None
        server.stop()


def build_aws_fleet(n_ours: int, n_others: int) -> int:
    """``n_ours`` instances whose instance, root volume and primary ENI carry one
    ref each, and ``n_others`` untagged instances. Returns our resource count."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    for i in range(n_ours):
        ref = f"a{i:011d}"
        spec = [{"ResourceType": t, "Tags": [{"Key": TAG, "Value": ref}]} for t in ("instance", "volume")]
        inst = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, TagSpecifications=spec)["Instances"][0]
        # moto does not apply a network-interface TagSpecification to the primary ENI.
        ec2.create_tags(Resources=[inst["NetworkInterfaces"][0]["NetworkInterfaceId"]],
                        Tags=[{"Key": TAG, "Value": ref}])
    for _ in range(0, n_others, 50):
        ec2.run_instances(ImageId=AMI, MinCount=min(50, n_others), MaxCount=min(50, n_others))
    return 3 * n_ours


class _Counter:
    def __init__(self) -> None:
        self.calls = self.requests = self.reply_bytes = 0
        self._lock = threading.Lock()

    def attach(self, session: Any) -> None:
        session.events.register("before-parameter-build", self._call)
        session.events.register("before-send", self._request)
        session.events.register("after-call", self._reply)

    def _reply(self, http_response: Any = None, **_: Any) -> None:
        with self._lock:
            self.reply_bytes += len(getattr(http_response, "content", b"") or b"")

    def _call(self, **_: Any) -> None:
        with self._lock:
            self.calls += 1

    def _request(self, **_: Any) -> None:
        with self._lock:
            self.requests += 1


def _aws_backend() -> Backend:
    return Backend(id="bench-aws", provider="aws", account="123456789012", regions=(REGION,))


def aws_shipped(counter: _Counter) -> Callable[[], list[ResourceGroup]]:
    import boto3

    from orphan_cleanup.providers.aws.provider import build_aws_provider

    session = boto3.Session()
    counter.attach(session)
    provider = build_aws_provider(_aws_backend(), connect_timeout=5, read_timeout=60, session=session)
    return lambda: list(collect(provider).groups)


def aws_old_page_size(counter: _Counter) -> Callable[[], list[ResourceGroup]]:
    """The shipped describes before issue #17: filtered, but no ``MaxResults`` (EC2's
    default page, 100 on moto's DescribeInstances)."""
    import boto3

    from orphan_cleanup.providers.aws import provider as aws

    class DefaultPages(aws.AwsProvider):
        def _describe_tagged(self, region: str, ec2: Any, spec: Any) -> Iterator[Any]:
            if spec.tags_by_arn:  # ELBv2: no tag filter to drop, its pages as shipped
                yield from super()._describe_tagged(region, ec2, spec)
                return
            filters = [{"Name": "tag-key", "Values": [self.tag_key]}, *spec.list_filters]
            if ec2.can_paginate(spec.describe):
                for page in ec2.get_paginator(spec.describe).paginate(Filters=filters, **spec.list_params):
                    yield from spec.items(page)
            else:
                yield from spec.items(getattr(ec2, spec.describe)(Filters=filters, **spec.list_params))

    session = boto3.Session()
    counter.attach(session)
    config = aws.client_config(connect_timeout=5, read_timeout=60)
    provider = DefaultPages(_aws_backend(), aws.session_client_factory(session, config))
    return lambda: list(collect(provider).groups)


#: The kinds listed before volumes and gateways became owners: the same-run baseline of what the
#: later kinds cost (``aws_first_kinds``).
FIRST_KINDS = frozenset({ResourceKind.INSTANCE, ResourceKind.VOLUME, ResourceKind.NETWORK_INTERFACE,
                         ResourceKind.SECURITY_GROUP, ResourceKind.ADDRESS, ResourceKind.SPOT_REQUEST,
                         ResourceKind.SNAPSHOT})


def aws_first_kinds(counter: _Counter) -> Callable[[], list[ResourceGroup]]:
    """The shipped listing of the first kinds only (no launch templates, key pairs, placement
    groups, load balancers or target groups): what the listing cost before those were added."""
    import boto3

    from orphan_cleanup.providers.aws import provider as aws

    class FirstKinds(aws.AwsProvider):
        def _describe_tagged(self, region: str, ec2: Any, spec: Any) -> Iterator[Any]:
            return super()._describe_tagged(region, ec2, spec) if spec.kind in FIRST_KINDS else iter(())

    session = boto3.Session()
    counter.attach(session)
    config = aws.client_config(connect_timeout=5, read_timeout=60)
    provider = FirstKinds(_aws_backend(), aws.session_client_factory(session, config))
    return lambda: list(collect(provider).groups)


def aws_floor() -> int:
    """The fewest calls that can list the region: one describe per kind listed (every
    kind's items fit one page at the API's maximum)."""
    from orphan_cleanup.providers.aws.kinds import listed_kinds

    return len(listed_kinds(None))


def aws_unfiltered(counter: _Counter) -> Callable[[], list[ResourceGroup]]:
    import boto3

    from orphan_cleanup.providers.aws import provider as aws

    class Unfiltered(aws.AwsProvider):
        """Every describe without the tag-key filter; ``group_resources`` drops the rest."""

        def _describe_tagged(self, region: str, ec2: Any, spec: Any) -> Iterator[Any]:
            if spec.tags_by_arn:  # ELBv2 has no tag filter: as shipped
                yield from super()._describe_tagged(region, ec2, spec)
                return
            filters = list(spec.list_filters)
            kwargs = {"Filters": filters} if filters else {}
            if ec2.can_paginate(spec.describe):
                for page in ec2.get_paginator(spec.describe).paginate(**kwargs):
                    yield from spec.items(page)
            else:
                yield from spec.items(getattr(ec2, spec.describe)(**kwargs))

    session = boto3.Session()
    counter.attach(session)
    config = aws.client_config(connect_timeout=5, read_timeout=60)
    provider = Unfiltered(_aws_backend(), aws.session_client_factory(session, config))
    return lambda: list(collect(provider).groups)


_ARN_KIND = {"instance": ResourceKind.INSTANCE, "volume": ResourceKind.VOLUME,
             "network-interface": ResourceKind.NETWORK_INTERFACE, "security-group": ResourceKind.SECURITY_GROUP,
             "elastic-ip": ResourceKind.ADDRESS}


def aws_tagging_api(counter: _Counter) -> Callable[[], list[ResourceGroup]]:
    """Tagging API for the ids, then one describe per resource (by id)."""
    import boto3

    from orphan_cleanup.providers.aws import provider as aws
    from orphan_cleanup.providers.aws.kinds import BY_KIND, KINDS
    from orphan_cleanup.providers.aws.listing import link_resources, to_resource
    from orphan_cleanup.providers.base import group_resources

    session = boto3.Session()
    counter.attach(session)
    config = aws.client_config(connect_timeout=5, read_timeout=60)
    tagging = session.client("resourcegroupstaggingapi", region_name=REGION, config=config)
    ec2 = session.client("ec2", region_name=REGION, config=config)

    def listing() -> list[ResourceGroup]:
        ids: dict[ResourceKind, list[str]] = {k.kind: [] for k in KINDS}
        for page in tagging.get_paginator("get_resources").paginate(
                TagFilters=[{"Key": TAG}], ResourceTypeFilters=[f"ec2:{t}" for t in _ARN_KIND]):
            for item in page["ResourceTagMappingList"]:
                rtype, _, rid = item["ResourceARN"].split(":", 5)[5].partition("/")
                ids[_ARN_KIND[rtype]].append(rid)
        raw: dict[ResourceKind, list[Any]] = {}
        for spec in KINDS:
            items = []
            for rid in ids[spec.kind]:
                reply = getattr(ec2, spec.describe)(**{BY_KIND[spec.kind].ids_param: [rid]})
                items.extend(spec.items(reply))
            raw[spec.kind] = items
        resources = [to_resource(spec, item, REGION) for spec in KINDS for item in raw[spec.kind]]
        live = [r for r in link_resources(raw, resources, TAG) if r.state is not ResourceState.TERMINATED]
        return group_resources(live, TAG)

    return listing


def measure_all(makers: list[Callable[[_Counter], Callable[[], list[ResourceGroup]]]],
                 reps: list[int]) -> list[Measured]:
    """Warm every method up, then run their listings interleaved (rep by rep), so
    a drifting server (moto, a busy machine) hurts them alike."""
    counters = [_Counter() for _ in makers]
    listings = [make(c) for make, c in zip(makers, counters)]
    for listing in listings:
        listing()  # warm-up: client creation, endpoint resolution
    times: list[list[float]] = [[] for _ in makers]
    last: list[tuple[list[ResourceGroup], int, int, int]] = [([], 0, 0, 0)] * len(makers)
    for k in range(max(reps)):
        for i, (listing, counter) in enumerate(zip(listings, counters)):
            if k >= reps[i]:
                continue
            c0, r0, b0 = counter.calls, counter.requests, counter.reply_bytes
            start = time.perf_counter()
            groups = listing()
            times[i].append(time.perf_counter() - start)
            last[i] = (groups, counter.calls - c0, counter.requests - r0, counter.reply_bytes - b0)
    return [Measured(g, c, r, median(t), b) for (g, c, r, b), t in zip(last, times)]
