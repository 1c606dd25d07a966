"""Listing at the API floor (issue #17 item 1) on the moto server: every describe is
filtered and asks for the API's largest page (``AwsKind.page_size``), so listing
1,000 instances with their volumes and interfaces costs one call per kind plus the
identity call; and every HTTP attempt takes a token of its (account, region, API
class) bucket. Calls are counted with a botocore event hook (``CallLog``)."""

from __future__ import annotations

import math
from typing import Any

import boto3
import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.providers.aws.kinds import BY_KIND, KINDS
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.providers.ratelimit import DEFAULT_BUDGETS, RateLimits
from tests.support.aws_calls import CallLog
from tests.support.listing import collect
from tests.support.sqs_harness import AMI

pytestmark = pytest.mark.usefixtures("moto_reset")

REGION = "us-east-1"
TAG = "provider_ref"


def backend(**settings: Any) -> Backend:
    return Backend(id="aws-floor", provider="aws", account="123456789012", regions=(REGION,), settings=settings)


def adapter(calls: CallLog, limits: RateLimits | None = None, **settings: Any) -> Any:
    session = boto3.Session()
    calls.attach(session)
    return build_aws_provider(backend(**settings), connect_timeout=5, read_timeout=120, session=session,
                              limits=limits or RateLimits(DEFAULT_BUDGETS))


def fleet(n: int, per_reservation: int, *, tag_enis: bool = True) -> None:
    """``n`` instances with our ref on the instance, its root volume and its primary ENI,
    launched ``per_reservation`` at a time (moto pages DescribeInstances by reservation)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    spec = [{"ResourceType": t, "Tags": [{"Key": TAG, "Value": "abcdefabcdef"}]} for t in ("instance", "volume")]
    enis: list[str] = []
    for _ in range(n // per_reservation):
        reply = ec2.run_instances(ImageId=AMI, MinCount=per_reservation, MaxCount=per_reservation,
                                  TagSpecifications=spec)
        enis += [i["NetworkInterfaces"][0]["NetworkInterfaceId"] for i in reply["Instances"]]
    # moto does not apply a network-interface TagSpecification to the primary ENI.
    for k in range(0, len(enis) if tag_enis else 0, 500):
        ec2.create_tags(Resources=enis[k:k + 500], Tags=[{"Key": TAG, "Value": "abcdefabcdef"}])


def provider_pages(op: str) -> bool:
    """Whether the EC2 API pages ``op`` (its model has ``MaxResults``)."""
    model = boto3.client("ec2", region_name=REGION).meta.service_model.operation_model(op)
    return "MaxResults" in model.input_shape.members


def test_every_describe_is_filtered_and_asks_for_the_apis_largest_page(calls):
    # given a small fleet, snapshots listed too (retain_snapshots_days)
    fleet(3, per_reservation=3)
    provider = adapter(calls, retain_snapshots_days=7)

    # when the region is listed
    provider.verify_identity()
    listing = collect(provider)

    # then every describe carried the tag-key filter and, when the API pages, its maximum
    assert not listing.failures
    describes = [(op, params) for service, op, params in calls.calls if service == "ec2"]
    # one call per EC2 kind: 10 with snapshots (launch templates, key pairs and placement groups
    # added 3: docs/PERFORMANCE.md)
    ec2_kinds = [k for k in KINDS if k.service == "ec2"]
    assert len(describes) == len(ec2_kinds) == 10
    assert sorted(op for op, _ in describes) == sorted(
        "".join(w.title() for w in k.describe.split("_")) for k in ec2_kinds)
    # ELBv2 has no tag filter: one describe per kind at its largest page, and no DescribeTags
    # while there is nothing to read tags of (20 ARNs a call otherwise)
    elb = [(op, params) for service, op, params in calls.calls if service == "elbv2"]
    assert sorted(op for op, _ in elb) == ["DescribeLoadBalancers", "DescribeTargetGroups"]
    assert all(params.get("PageSize") == 400 for _, params in elb)
    for op, params in describes:
        assert {"Name": "tag-key", "Values": [TAG]} in params.get("Filters", []), op
        spec = next(k for k in KINDS if "".join(w.title() for w in k.describe.split("_")) == op)
        assert params.get("MaxResults") == spec.page_size, op
        # only the describes without paging (addresses, key pairs, placement groups: one call
        # answers every item) name no page; every other describe names its maximum page
        assert spec.page_size is not None or not provider_pages(op), op
    assert BY_KIND[KINDS[0].kind].page_size == 1000


def test_every_http_attempt_takes_a_token_of_its_account_region_and_class(calls):
    # given two instances and shared budgets
    fleet(2, per_reservation=2, tag_enis=False)
    limits = RateLimits(DEFAULT_BUDGETS)
    provider = adapter(calls, limits)

    # when identity, listing and a group's deletion run
    provider.verify_identity()
    groups = list(collect(provider).groups)
    provider.delete_resource_group(next(g for g in groups if g.primary_id))

    # then each call took one token, in its class's bucket
    taken = {key: b.acquired for key, b in limits.buckets().items()}
    ops = [(service, op) for service, op, _ in calls.calls]
    assert sum(taken.values()) == len(ops)
    assert taken[("123456789012", REGION, "sts", "describe")] == 1
    assert taken[("123456789012", REGION, "ec2", "terminate")] == ops.count(("ec2", "TerminateInstances")) == 1
    assert taken[("123456789012", REGION, "ec2", "describe")] == sum(
        op.startswith("Describe") for service, op in ops if service == "ec2")
    assert taken[("123456789012", REGION, "elastic-load-balancing-v2", "describe")] == sum(
        op.startswith("Describe") for service, op in ops if service == "elbv2")


@pytest.mark.slow
def test_listing_1000_instances_with_volumes_and_interfaces_costs_the_floor(calls):
    # given 1,000 instances, each with its root volume and primary interface carrying the ref
    n = 1000
    fleet(n, per_reservation=8)  # 125 reservations: more than moto's default page of 100
    provider = adapter(calls)

    # when the backend is verified and listed
    provider.verify_identity()
    listing = collect(provider)

    # then every resource is listed, in one call per kind (and the identity call)
    assert not listing.failures
    resources = [r for g in listing.groups for r in g.resources]
    assert len(resources) == 3 * n
    floor = len(KINDS) - 1 + 1  # kinds listed (snapshots are not, without retention) + identity
    # (the ELBv2 kinds' DescribeTags: none, the fleet has no load balancer or target group)
    assert math.ceil(n / 1000) == 1
    assert len(calls.calls) <= 1.1 * floor, calls.ops()
