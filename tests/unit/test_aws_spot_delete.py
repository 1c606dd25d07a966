"""Spot instances and their requests on delete (issue #15 item 2), on a real botocore
EC2 client with botocore's Stubber: every request is checked against the EC2 model, the
calls must come in exactly the order given (the cancel before the terminate), and any
call not listed fails the test. Shapes moto never returns (no ``Type``, an odd
lifecycle, a request without its id) are played here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.stub import Stubber

from orphan_cleanup.core.delete_rules import delete_record
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.support.aws_stub import stubbed_delete
from tests.unit.test_aws_delete_states import res

REGION = "us-east-1"
REF = "abcdefabcdef"
TAGS = [{"Key": "provider_ref", "Value": REF}]
PID = "i-0123456789abcdef0"
OTHER = "i-0fedcba9876543210"
SIR = "sir-0123456789abcdef"


OWNER = ResourceGroup(provider_ref=REF, region=REGION, primary_id=PID, resources=(
    res(ResourceKind.INSTANCE, PID), res(ResourceKind.SPOT_REQUEST, SIR)))


def delete(client: Any, group: ResourceGroup = OWNER):
    return stubbed_delete(client, group)


def expect_spot_instance(stub: Stubber, state: str = "running", **fields: Any) -> None:
    spot = {"InstanceLifecycle": "spot", "SpotInstanceRequestId": SIR} | fields
    item = {"InstanceId": PID, "State": {"Name": state, "Code": 16}, "Tags": TAGS, "BlockDeviceMappings": [],
            "NetworkInterfaces": []} | {k: v for k, v in spot.items() if v is not None}
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [item]}]}, {"InstanceIds": [PID]})


def expect_attribute(stub: Stubber) -> None:
    stub.add_response("describe_instance_attribute", {"InstanceId": PID, "DisableApiTermination": {"Value": False}},
                      {"InstanceId": PID, "Attribute": "disableApiTermination"})


def expect_attribute_denied(stub: Stubber) -> None:
    stub.add_client_error("describe_instance_attribute", "UnauthorizedOperation", "not authorized",
                          expected_params={"InstanceId": PID, "Attribute": "disableApiTermination"})


def expect_request(stub: Stubber, **fields: Any) -> None:
    item = {"SpotInstanceRequestId": SIR, "Type": "persistent", "State": "active", "InstanceId": PID,
            "Tags": TAGS} | fields
    stub.add_response("describe_spot_instance_requests",
                      {"SpotInstanceRequests": [{k: v for k, v in item.items() if v is not None}]},
                      {"SpotInstanceRequestIds": [SIR]})


def expect_member_read(stub: Stubber, tags: list[dict[str, str]] = TAGS) -> None:
    """The re-read of the group's members before the terminate (a protect tag on any one
    protects the group): the one member, the request, is read by its id."""
    stub.add_response("describe_spot_instance_requests",
                      {"SpotInstanceRequests": [{"SpotInstanceRequestId": SIR, "Tags": tags}]},
                      {"SpotInstanceRequestIds": [SIR]})


def expect_cancel(stub: Stubber) -> None:
    stub.add_response("cancel_spot_instance_requests", {"CancelledSpotInstanceRequests": [
        {"SpotInstanceRequestId": SIR, "State": "cancelled"}]}, {"SpotInstanceRequestIds": [SIR]})


def expect_final_read(stub: Stubber, *, denied: bool = False,
                      members: Callable[[Stubber], None] | None = expect_member_read, **fields: Any) -> None:
    """The owner judged again right before ``TerminateInstances`` (after the cancel, if any):
    read once more by id, its ``disableApiTermination`` read again (``denied``: refused, as in
    the judgement), then the other members re-read by id (``members``: ``OWNER``'s request as
    ``expect_member_read`` answers it by default, None for a group of the instance alone). The
    call acts on what these reads show, or not at all."""
    expect_spot_instance(stub, **fields)
    if denied:
        expect_attribute_denied(stub)
    else:
        expect_attribute(stub)
    if members is not None:
        members(stub)


def expect_terminate(stub: Stubber) -> None:
    stub.add_response("terminate_instances", {}, {"InstanceIds": [PID]})
    expect_spot_instance(stub, "shutting-down")


def spot_owner_read(stub: Stubber, **request: Any) -> None:
    expect_spot_instance(stub)
    expect_attribute(stub)
    expect_member_read(stub, request.get("Tags", TAGS))
    expect_request(stub, **request)


@pytest.mark.parametrize("state", ["active", "open", "disabled", "failed", "marked-for-stop"])
def test_a_persistent_request_is_cancelled_and_confirmed_before_the_instance_is_terminated(ec2, state):
    client, stub = ec2
    spot_owner_read(stub, State=state)
    expect_cancel(stub)
    expect_request(stub, State="cancelled")  # the confirming re-read
    # the owner judged again after the cancel, right before its own call (the request, cancelled
    # and confirmed by this deletion, is not read again among the members)
    expect_final_read(stub, members=None)
    expect_terminate(stub)  # the stubber answers only in this order: terminate after cancel

    result = delete(client)

    assert result.status is DeleteStatus.DELETING
    # the terminating owner is pending too: its deletion is under way, not finished
    assert result.cancelled_requests == (SIR,) and result.deleted == (SIR, PID) and result.pending == (PID,)
    assert f"cancelled spot request {SIR}" in delete_record(OWNER, result=result).message


@pytest.mark.parametrize("request_fields", [{"Type": "one-time"}, {"State": "cancelled"}, {"State": "closed"},
                                            {"Type": None, "State": "closed"}],
                         ids=["one-time", "cancelled", "closed", "closed-without-type"])
def test_a_request_that_cannot_launch_again_is_not_cancelled(ec2, request_fields):
    client, stub = ec2
    spot_owner_read(stub, **request_fields)
    expect_final_read(stub)
    expect_terminate(stub)  # no cancel answer: a cancel call would fail the test

    result = delete(client)

    assert result.status is DeleteStatus.DELETING and result.cancelled_requests == ()


def test_a_request_ec2_no_longer_knows_is_gone(ec2):
    client, stub = ec2
    expect_spot_instance(stub)
    expect_attribute(stub)
    expect_member_read(stub)
    stub.add_client_error("describe_spot_instance_requests", "InvalidSpotInstanceRequestID.NotFound",
                          expected_params={"SpotInstanceRequestIds": [SIR]})
    expect_final_read(stub)
    expect_terminate(stub)

    assert delete(client).status is DeleteStatus.DELETING


@pytest.mark.parametrize("request_fields", [
    {"Type": None}, {"Type": "Persistent"}, {"Type": "", "State": "open"}, {"Type": None, "State": None},
], ids=["no-type", "odd-type", "empty-type", "no-type-no-state"])
def test_a_request_that_reads_as_neither_one_time_nor_cancelled_stops_the_group(ec2, request_fields):
    client, stub = ec2
    spot_owner_read(stub, **request_fields)  # no cancel, no terminate answer

    with pytest.raises(ProviderError, match="neither one-time nor cancelled"):
        delete(client)


@pytest.mark.parametrize("instance_fields", [
    {"SpotInstanceRequestId": None}, {"SpotInstanceRequestId": ""}, {"InstanceLifecycle": "odd"},
    {"InstanceLifecycle": "scheduled"},  # a request id on an instance no request launched
], ids=["spot-without-request-id", "empty-request-id", "odd-lifecycle", "scheduled-with-request-id"])
def test_a_spot_instance_whose_request_cannot_be_named_is_not_terminated(ec2, instance_fields):
    client, stub = ec2
    expect_spot_instance(stub, **instance_fields)
    expect_attribute(stub)
    expect_member_read(stub)

    with pytest.raises(ProviderError, match="cannot tell whether a request would replace it"):
        delete(client)


@pytest.mark.parametrize("reply", [
    {"SpotInstanceRequests": []},
    {"SpotInstanceRequests": [{"Type": "one-time", "State": "active"}]},
    {"SpotInstanceRequests": [{"SpotInstanceRequestId": "sir-0other000000000", "Type": "one-time"}]},
], ids=["empty", "no-id", "another-id"])
def test_a_request_reply_that_is_not_that_request_stops_the_group(ec2, reply):
    client, stub = ec2
    expect_spot_instance(stub)
    expect_attribute(stub)
    expect_member_read(stub)
    stub.add_response("describe_spot_instance_requests", reply, {"SpotInstanceRequestIds": [SIR]})

    with pytest.raises(ProviderError, match="describe_spot_instance_requests"):
        delete(client)


def test_a_failed_cancel_leaves_the_instance_running(ec2):
    client, stub = ec2
    spot_owner_read(stub)
    stub.add_client_error("cancel_spot_instance_requests", "UnauthorizedOperation", "not authorized",
                          expected_params={"SpotInstanceRequestIds": [SIR]})

    with pytest.raises(ProviderError):
        delete(client)


def test_a_cancel_that_does_not_take_leaves_the_instance_running(ec2):
    client, stub = ec2
    spot_owner_read(stub)
    expect_cancel(stub)
    expect_request(stub, State="open")

    with pytest.raises(ProviderError, match=f"{SIR} is still open after its delete call"):
        delete(client)


@pytest.mark.parametrize("tags, reason, why", [
    # a protect tag on the request protects the group as on any member: found by the members' re-read
    ([*TAGS, {"Key": "orphan-cleanup-protect", "Value": ""}], "protected", "group_protected"),
    ([{"Key": "provider_ref", "Value": "bbbbbbbbbbbb"}], "ref_changed", "spot_request_ref_changed"),
])
def test_a_persistent_request_not_ours_to_cancel_keeps_the_group(ec2, tags, reason, why):
    client, stub = ec2
    expect_spot_instance(stub)
    expect_attribute(stub)
    expect_member_read(stub, tags)
    if reason != "protected":
        expect_request(stub, Tags=tags)

    result = delete(client)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == () and result.cancelled_requests == ()
    assert (PID, why) in [(s.id, s.reason) for s in result.skipped]
    assert (SIR, reason) in [(s.id, s.reason) for s in result.skipped]


def test_an_on_demand_instance_reads_no_spot_request(ec2):
    client, stub = ec2
    expect_spot_instance(stub, InstanceLifecycle=None, SpotInstanceRequestId=None)
    expect_attribute(stub)
    expect_final_read(stub, members=None, InstanceLifecycle=None, SpotInstanceRequestId=None)
    expect_terminate(stub)

    group = ResourceGroup(provider_ref=REF, region=REGION, primary_id=PID, resources=(res(ResourceKind.INSTANCE, PID),))
    assert delete(client, group).status is DeleteStatus.DELETING


def test_a_final_read_after_the_cancel_showing_a_protect_tag_is_not_terminated(ec2):
    # the cancel and its confirmation came between the judgement and the call: the owner is
    # judged again on a read after them
    client, stub = ec2
    spot_owner_read(stub)
    expect_cancel(stub)
    expect_request(stub, State="cancelled")
    # the final read shows a protect tag: the judgement ends there (no attribute, no member read)
    expect_spot_instance(stub, Tags=[*TAGS, {"Key": "orphan-cleanup-protect", "Value": ""}])
    # no terminate answer: a terminate would fail the test

    result = delete(client)

    assert result.status is DeleteStatus.SKIPPED and result.cancelled_requests == (SIR,)
    assert (PID, "protected") in [(s.id, s.reason) for s in result.skipped] and PID not in result.deleted


# ---- the termination protection unknown: nothing is cancelled ---------------------------------------

def test_an_attribute_read_denied_leaves_a_persistent_request_and_its_instance_alone(ec2):
    # attack F5: the cancel must never come before the protection is known; with the attribute
    # unreadable only TerminateInstances' refusal would tell, and that comes after the cancel
    client, stub = ec2
    expect_spot_instance(stub)
    expect_attribute_denied(stub)
    expect_member_read(stub)
    expect_request(stub)  # persistent, active: it would have to be cancelled first
    # no cancel, no final read, no terminate answer: any of them would fail the test

    result = delete(client)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == () and result.cancelled_requests == ()
    assert [(s.id, s.reason) for s in result.skipped] == [(PID, "protection_unreadable"), (SIR, "owner_skipped")]
    record = delete_record(OWNER, result=result)
    assert record.unsettled and not record.failed


def test_an_attribute_read_denied_with_nothing_to_cancel_falls_back_to_the_terminate_refusal(ec2):
    client, stub = ec2
    expect_spot_instance(stub)
    expect_attribute_denied(stub)
    expect_member_read(stub)
    expect_request(stub, Type="one-time")  # nothing would relaunch it: nothing to cancel first
    expect_final_read(stub, denied=True)  # denied again in the final judgement
    stub.add_client_error("terminate_instances", "OperationNotPermitted", "may not be terminated",
                          expected_params={"InstanceIds": [PID]})

    result = delete(client)

    assert result.status is DeleteStatus.PROTECTED and result.protection == "termination_protection"
    assert result.cancelled_requests == ()


# ---- a leftover request (its instance is gone) ------------------------------------------------------

LEFTOVER = ResourceGroup(provider_ref=REF, region=REGION, primary_id=None,
                         resources=(res(ResourceKind.SPOT_REQUEST, SIR),))


def test_a_leftover_request_is_cancelled(ec2):
    client, stub = ec2
    expect_request(stub, State="open", InstanceId=None)  # the members' re-read (no owner), before any call
    expect_request(stub, State="open", InstanceId=None)  # read again right before its own call
    expect_cancel(stub)
    expect_request(stub, State="cancelled", InstanceId=None)  # the cancel confirmed by a re-read

    result = delete(client, LEFTOVER)

    assert result.status is DeleteStatus.DELETED and result.deleted == (SIR,) and result.cancelled_requests == (SIR,)


def test_a_leftover_request_of_a_live_instance_outside_the_group_is_pending_not_cancelled(ec2):
    client, stub = ec2
    expect_request(stub, InstanceId=OTHER)  # the members' re-read (no owner), before any call
    expect_request(stub, InstanceId=OTHER)  # read again right before its own call
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [
        {"InstanceId": OTHER, "State": {"Name": "running", "Code": 16}}]}]}, {"InstanceIds": [OTHER]})
    # no cancel answer: a cancel would fail the test

    result = delete(client, LEFTOVER)

    assert result.status is DeleteStatus.DELETING and result.pending == (SIR,) and result.cancelled_requests == ()
    assert [(s.id, s.reason) for s in result.skipped] == [(SIR, "in_use")]
