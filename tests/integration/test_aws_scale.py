"""Listing cost on a moto server: API calls and time per 1,000 listed resources.

Run: ``python -m pytest tests/integration/test_aws_scale.py -m slow -s``
(excluded from the default run by the ``slow`` marker).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import boto3
import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.providers.aws.provider import build_aws_provider
from tests.support.listing import collect

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("moto_reset")]

REGION = "us-east-1"
TAG = [{"Key": "provider_ref", "Value": "scaletest000"}]


def tagged(resource_type: str) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": TAG}]


def measure_listing() -> tuple[int, Counter[str], float]:
    session = boto3.Session()
    calls: Counter[str] = Counter()
    session.events.register("before-call", lambda model, **_: calls.update([model.name]))
    backend = Backend(id="scale", provider="aws", account="123456789012", regions=(REGION,))
    provider = build_aws_provider(backend, connect_timeout=5, read_timeout=60, session=session)
    started = time.perf_counter()
    listing = collect(provider)
    elapsed = time.perf_counter() - started
    assert not listing.failures
    return sum(len(g.resources) for g in listing.groups), calls, elapsed


def test_listing_1000_instances():
    client = boto3.client("ec2", region_name=REGION)
    for _ in range(1000):  # one reservation each, as a platform provisions them
        client.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=tagged("instance"))

    listed, calls, elapsed = measure_listing()

    print(f"\n1000 instances: listed={listed} calls={sum(calls.values())} {dict(calls)} time={elapsed:.2f}s")
    assert listed == 1000
    assert calls["DescribeInstances"] <= 11 and sum(calls.values()) <= 15


def test_listing_1000_resources_of_all_kinds():
    client = boto3.client("ec2", region_name=REGION)
    for n in range(200):  # 200 x (instance, volume, interface, security group, address)
        sg = client.create_security_group(GroupName=f"g{n}", Description="scale",
                                          TagSpecifications=tagged("security-group"))["GroupId"]
        inst = client.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, SecurityGroupIds=[sg],
                                    TagSpecifications=tagged("instance"))["Instances"][0]
        vol = client.create_volume(AvailabilityZone=inst["Placement"]["AvailabilityZone"], Size=1,
                                   TagSpecifications=tagged("volume"))["VolumeId"]
        client.attach_volume(VolumeId=vol, InstanceId=inst["InstanceId"], Device="/dev/sdf")
        eni = client.create_network_interface(SubnetId=inst["SubnetId"], Groups=[sg],
                                              TagSpecifications=tagged("network-interface"))
        client.attach_network_interface(NetworkInterfaceId=eni["NetworkInterface"]["NetworkInterfaceId"],
                                        InstanceId=inst["InstanceId"], DeviceIndex=1)
        eip = client.allocate_address(Domain="vpc", TagSpecifications=tagged("elastic-ip"))["AllocationId"]
        client.associate_address(AllocationId=eip, InstanceId=inst["InstanceId"])

    listed, calls, elapsed = measure_listing()

    print(f"\n1000 mixed resources: listed={listed} calls={sum(calls.values())} {dict(calls)} time={elapsed:.2f}s")
    assert listed == 1000
    assert sum(calls.values()) <= 10
