"""Spot requests on the moto server (issue #15 item 2): listed as ``spot-request``,
grouped by ref, cancelled before their instance is terminated.

What moto 5.2 does and does not do: ``RequestSpotInstances`` (persistent and one-time,
tags through ``TagSpecifications``), ``DescribeSpotInstanceRequests`` (ids, ``tag-key``
filter, paginated) and ``CancelSpotInstanceRequests`` work, but a cancel *removes* the
request (a re-read returns nothing, not ``cancelled``), the launched instance carries
``InstanceLifecycle: spot`` but no ``SpotInstanceRequestId``, and the request's tags
are not copied to it. The tests that need the id fill it into moto's DescribeInstances
reply with a botocore hook (everything else is moto's); the other shapes are in
``tests/unit/test_aws_spot_delete.py``.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.integration.test_aws_provider import (
    AMI,
    EAST,
    REF_A,
    TAG,
    ec2,
    exists,
    group_map,
    make_provider,
    set_tags,
)
from tests.support.listing import collect

pytestmark = pytest.mark.usefixtures("moto_reset")


def request_spot(client: Any, kind: str, ref: str | None = REF_A) -> tuple[str, str]:
    """A spot request and the instance moto launches for it at once; the instance tagged ``ref``."""
    kwargs: dict[str, Any] = {"SpotPrice": "0.5", "InstanceCount": 1, "Type": kind,
                              "LaunchSpecification": {"ImageId": AMI, "InstanceType": "t3.micro"}}
    if ref is not None:
        kwargs["TagSpecifications"] = [{"ResourceType": "spot-instances-request", "Tags": [{"Key": TAG, "Value": ref}]}]
    [req] = client.request_spot_instances(**kwargs)["SpotInstanceRequests"]
    if ref is not None:
        set_tags(client, req["InstanceId"], **{TAG: ref})
    return req["SpotInstanceRequestId"], req["InstanceId"]


def name_requests(session: boto3.Session, client: Any) -> None:
    """Fill in the ``SpotInstanceRequestId`` moto leaves out of DescribeInstances."""
    of_instance = {r["InstanceId"]: r["SpotInstanceRequestId"]
                   for r in client.describe_spot_instance_requests()["SpotInstanceRequests"] if r.get("InstanceId")}

    def add(parsed: dict[str, Any], **_: Any) -> None:
        for reservation in parsed.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                if inst["InstanceId"] in of_instance:
                    inst["SpotInstanceRequestId"] = of_instance[inst["InstanceId"]]

    session.events.register("after-call.ec2.DescribeInstances", add)


def request_state(client: Any, request_id: str) -> str | None:
    reply = client.describe_spot_instance_requests(Filters=[{"Name": "spot-instance-request-id",
                                                             "Values": [request_id]}])
    return next((r["State"] for r in reply["SpotInstanceRequests"]), None)


def test_a_persistent_spot_orphan_has_its_request_cancelled_before_it_is_terminated(session, calls):
    client = ec2(EAST)
    sir, iid = request_spot(client, "persistent")
    name_requests(session, client)
    provider = make_provider(session)
    [group] = collect(provider).groups
    assert group_map([group]) == {(REF_A, EAST, iid): {iid, sir}}
    calls.clear()

    result = provider.delete_resource_group(group)

    ops = calls.ops()
    assert "CancelSpotInstanceRequests" in ops and "TerminateInstances" in ops
    assert ops.index("CancelSpotInstanceRequests") < ops.index("TerminateInstances")
    assert result.cancelled_requests == (sir,) and set(result.deleted) == {sir, iid}
    assert not exists(client, "instance", iid)
    assert request_state(client, sir) in (None, "cancelled")  # moto forgets a cancelled request
    live = client.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    assert live["Reservations"] == []  # nothing came back


def test_a_one_time_spot_orphan_is_terminated_without_a_cancel(session, calls):
    client = ec2(EAST)
    sir, iid = request_spot(client, "one-time")
    name_requests(session, client)
    provider = make_provider(session)
    [group] = collect(provider).groups
    calls.clear()

    result = provider.delete_resource_group(group)

    ops = calls.ops()
    assert "CancelSpotInstanceRequests" not in ops[:ops.index("TerminateInstances")]
    assert not exists(client, "instance", iid)
    # moto leaves a one-time request "active" after its instance went (AWS closes it): the
    # dependents' pass then cancels it as the leftover it is.
    assert result.status is DeleteStatus.DELETED and sir in result.deleted


def test_a_spot_instance_moto_shows_without_its_request_id_is_not_terminated(session, calls):
    # moto's own reply (InstanceLifecycle spot, no SpotInstanceRequestId): fail closed.
    client = ec2(EAST)
    _, iid = request_spot(client, "persistent")
    provider = make_provider(session)
    [group] = collect(provider).groups
    calls.clear()

    with pytest.raises(ProviderError, match="cannot tell whether a request would replace it"):
        provider.delete_resource_group(group)

    assert "TerminateInstances" not in calls.ops() and exists(client, "instance", iid)


def test_a_ref_tagged_request_without_its_instance_is_a_spot_request_leftover_and_is_cancelled(session, calls):
    client = ec2(EAST)
    sir, iid = request_spot(client, "persistent")
    client.terminate_instances(InstanceIds=[iid])
    request_spot(client, "one-time", ref=None)  # untagged: never listed
    provider = make_provider(session)

    [group] = collect(provider).groups

    assert group_map([group]) == {(REF_A, EAST, None): {sir}}
    [request] = group.resources
    assert request.kind is ResourceKind.SPOT_REQUEST and request.state is ResourceState.ACTIVE
    assert request.details["Type"] == "persistent" and request.attached_to == iid
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETED and result.deleted == (sir,) and result.cancelled_requests == (sir,)
    assert [op for op in calls.ops() if op.startswith("Cancel")] == ["CancelSpotInstanceRequests"]
    assert request_state(client, sir) is None
    assert collect(provider).groups == ()
