"""Deletion paths moto cannot show (it terminates instantly, never says "still
running"), played on a real botocore EC2 client with botocore's Stubber: every
request is validated against the EC2 model and no socket is opened. Any call
not listed here fails the test (the stubber has no answer for it)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.stub import Stubber

from orphan_cleanup.core.errors import ProviderError, ProviderThrottled
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.support.aws_stub import stubbed_delete

REGION = "us-east-1"
REF = "abcdefabcdef"
TAGS = [{"Key": "provider_ref", "Value": REF}]
PID = "i-0123456789abcdef0"
VOL = "vol-0123456789abcdef0"
ENI = "eni-0123456789abcdef0"
SG = "sg-0123456789abcdef0"
EIP = "eipalloc-0123456789abcdef0"


def res(kind: ResourceKind, rid: str) -> Resource:
    return Resource(kind=kind, id=rid, region=REGION, tags={"provider_ref": REF})


def group(*members: Resource, primary: str | None = PID) -> ResourceGroup:
    return ResourceGroup(provider_ref=REF, region=REGION, primary_id=primary, resources=members)


def instance_reply(state: str, iid: str = PID, tags: list[dict[str, str]] = TAGS) -> dict[str, Any]:
    """The instance as EC2 describes it; ``PID`` uses ``VOL`` (kept on termination) and ``SG``."""
    code = {"running": 16, "shutting-down": 32, "terminated": 48, "stopped": 80}[state]
    uses: dict[str, Any] = {"BlockDeviceMappings": [], "NetworkInterfaces": []}
    if iid == PID and state != "terminated":
        uses |= {"BlockDeviceMappings": [{"DeviceName": "/dev/sdf",
                                          "Ebs": {"VolumeId": VOL, "DeleteOnTermination": False}}],
                 "SecurityGroups": [{"GroupId": SG, "GroupName": "g"}]}
    return {"Reservations": [{"Instances": [{"InstanceId": iid, "State": {"Name": state, "Code": code},
                                              "Tags": tags} | uses]}]}


def expect_instance(stub: Stubber, state: str, iid: str = PID) -> None:
    stub.add_response("describe_instances", instance_reply(state, iid), {"InstanceIds": [iid]})


def expect_attribute(stub: Stubber, value: Any, iid: str = PID) -> None:
    stub.add_response("describe_instance_attribute", {"InstanceId": iid, "DisableApiTermination": {"Value": value}},
                      {"InstanceId": iid, "Attribute": "disableApiTermination"})


def expect_attribute_denied(stub: Stubber, iid: str = PID) -> None:
    stub.add_client_error("describe_instance_attribute", "UnauthorizedOperation", "not authorized",
                          expected_params={"InstanceId": iid, "Attribute": "disableApiTermination"})


def expect_members(stub: Stubber, vol_tags: list[dict[str, str]] = TAGS) -> None:
    """The re-read of ``FULL``'s dependents by id before the terminate, once in the judgement
    and once more in the final one (a protect tag on any one protects the group)."""
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "in-use", "Tags": vol_tags}]},
                      {"Filters": [{"Name": "volume-id", "Values": [VOL]}]})
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"Filters": [{"Name": "group-id", "Values": [SG]}]})


def expect_final_read(stub: Stubber, state: str = "running", *, reply: dict[str, Any] | None = None,
                      attribute_denied: bool = False,
                      members: Callable[[Stubber], None] | None = expect_members) -> None:
    """The owner judged again right before ``TerminateInstances``: read once more by id
    (``reply``, else ``instance_reply(state)``), its protection read again (its
    ``disableApiTermination``: ``attribute_denied`` when that read is refused, as in the
    judgement), then every other member re-read by id (``members``: ``FULL``'s by default,
    None for a group of the instance alone). The call acts on what these reads show (its
    tags, state, protections, the members' tags and its blast must be what was judged), or
    not at all; a read in another state than the judged (running) one ends it there."""
    stub.add_response("describe_instances", reply or instance_reply(state), {"InstanceIds": [PID]})
    if state != "running":  # changed_since_read: nothing more is read
        return
    if attribute_denied:
        expect_attribute_denied(stub)
    else:
        expect_attribute(stub, False)
    if members is not None:
        members(stub)


def delete(client: Any, g: ResourceGroup):
    return stubbed_delete(client, g)


FULL = group(res(ResourceKind.INSTANCE, PID), res(ResourceKind.VOLUME, VOL), res(ResourceKind.SECURITY_GROUP, SG))


def test_shutting_down_after_terminate_is_deleting_and_leaves_dependents_for_later(ec2):
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, False)
    expect_members(stub)
    expect_final_read(stub)
    stub.add_response("terminate_instances", {}, {"InstanceIds": [PID]})
    expect_instance(stub, "shutting-down")

    result = delete(client, FULL)

    assert result.status is DeleteStatus.DELETING
    # the terminating owner is pending too: its deletion is under way, not finished
    assert result.deleted == (PID,) and set(result.pending) == {PID, VOL, SG}


def test_already_shutting_down_is_not_terminated_again(ec2):
    client, stub = ec2
    expect_instance(stub, "shutting-down")

    result = delete(client, FULL)

    assert result.status is DeleteStatus.DELETING and result.deleted == (PID,)


def test_termination_that_does_not_take_is_an_error(ec2):
    # seed 002: a successful terminate call is not proof; the re-read must show it.
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, False)
    expect_members(stub)
    expect_final_read(stub)
    stub.add_response("terminate_instances", {}, {"InstanceIds": [PID]})
    expect_instance(stub, "running")

    with pytest.raises(ProviderError, match="not shutting-down or terminated"):
        delete(client, FULL)


def test_terminated_owner_lets_dependents_go_in_the_same_call_and_in_use_is_pending(ec2):
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, False)
    expect_members(stub)
    expect_final_read(stub)
    stub.add_response("terminate_instances", {}, {"InstanceIds": [PID]})
    expect_instance(stub, "terminated")
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "in-use", "Tags": TAGS,
                                                        "Attachments": [{"InstanceId": PID}]}]},
                      {"VolumeIds": [VOL]})
    # the terminate acted since the members were read: the members still to go are read again
    # before anything is done to the next one (a protect tag put on one meanwhile stops it all)
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"GroupIds": [SG]})
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"GroupIds": [SG]})
    stub.add_response("delete_security_group", {}, {"GroupId": SG})

    result = delete(client, FULL)

    assert result.status is DeleteStatus.DELETING
    assert result.deleted == (PID, SG) and result.pending == (VOL,)


def test_dependency_violation_is_not_yet_and_blocks_what_depends_on_it(ec2):
    client, stub = ec2
    leftovers = group(res(ResourceKind.NETWORK_INTERFACE, ENI), res(ResourceKind.SECURITY_GROUP, SG), primary=None)
    # no owner: every member re-read by id before any of them is touched (a protect tag on one keeps the group)
    stub.add_response("describe_network_interfaces",
                      {"NetworkInterfaces": [{"NetworkInterfaceId": ENI, "Status": "available", "TagSet": TAGS}]},
                      {"Filters": [{"Name": "network-interface-id", "Values": [ENI]}]})
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"Filters": [{"Name": "group-id", "Values": [SG]}]})
    stub.add_response("describe_network_interfaces",  # the interface read again right before its own call
                      {"NetworkInterfaces": [{"NetworkInterfaceId": ENI, "Status": "available", "TagSet": TAGS}]},
                      {"NetworkInterfaceIds": [ENI]})
    stub.add_client_error("delete_network_interface", "InvalidNetworkInterface.InUse", expected_params={
        "NetworkInterfaceId": ENI})

    result = delete(client, leftovers)

    # The security group is not even tried while an interface of the group may still use it.
    assert result.status is DeleteStatus.DELETING and set(result.pending) == {ENI, SG}


def test_interface_on_a_live_instance_outside_the_group_is_never_detached(ec2):
    client, stub = ec2
    other = "i-0fedcba9876543210"
    for _ in ("the members' re-read", "the read right before its own call"):
        stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [{
            "NetworkInterfaceId": ENI, "Status": "in-use", "TagSet": TAGS,
            "Attachment": {"AttachmentId": "eni-attach-1", "InstanceId": other, "Status": "attached"}}]},
            {"NetworkInterfaceIds": [ENI]})
    expect_instance(stub, "shutting-down", other)  # outside the group, not terminated: not proof it is gone
    # no detach_network_interface answer: a detach would fail the test

    result = delete(client, group(res(ResourceKind.NETWORK_INTERFACE, ENI), primary=None))

    assert result.status is DeleteStatus.DELETING and result.pending == (ENI,)
    assert [(s.id, s.reason) for s in result.skipped] == [(ENI, "in_use")]


@pytest.mark.parametrize("interface_type", ["interface", "nat_gateway"])
def test_address_on_an_interface_that_is_not_ours_stays_associated(ec2, interface_type):
    # an interface outside the group (another ref's on a live instance, a NAT gateway's that no
    # instance holds), as read now, holds the address: in use, never disassociated, whatever
    # holds the interface
    client, stub = ec2
    not_ours = "eni-0notours0000000"
    for _ in ("the members' re-read", "the read right before its own call"):
        stub.add_response("describe_addresses", {"Addresses": [{
            "AllocationId": EIP, "AssociationId": "eipassoc-1", "NetworkInterfaceId": not_ours,
            "Tags": TAGS}]}, {"AllocationIds": [EIP]})
    if interface_type == "interface":
        eni = {"TagSet": [{"Key": "provider_ref", "Value": "bbbbbbbbbbbb"}],
               "Attachment": {"AttachmentId": "eni-attach-2", "InstanceId": "i-0fedcba9876543210",
                              "Status": "attached"}}
    else:
        eni = {"TagSet": [], "Attachment": {"AttachmentId": "ela-attach-1", "InstanceOwnerId": "amazon-aws",
                                            "Status": "attached"}}
    stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [{
        "NetworkInterfaceId": not_ours, "Status": "in-use", "InterfaceType": interface_type} | eni]},
        {"NetworkInterfaceIds": [not_ours]})  # the interface read by id: not ours, its holder is never read
    # no disassociate_address answer: a disassociate would fail the test

    result = delete(client, group(res(ResourceKind.ADDRESS, EIP), primary=None))

    assert result.status is DeleteStatus.DELETING and result.pending == (EIP,)
    assert [(s.id, s.reason) for s in result.skipped] == [(EIP, "in_use")]


def test_address_on_a_member_interface_ec2_does_not_answer_for_stays_associated(ec2):
    # the group's own interface answered not found (not proof that it is gone): not yet
    client, stub = ec2
    address = {"Addresses": [{"AllocationId": EIP, "AssociationId": "eipassoc-1", "NetworkInterfaceId": ENI,
                              "Tags": TAGS}]}
    # the members' re-read (no owner): the interface, left out of the filtered answer, is asked by id
    stub.add_response("describe_addresses", address, {"Filters": [{"Name": "allocation-id", "Values": [EIP]}]})
    stub.add_response("describe_network_interfaces", {"NetworkInterfaces": []},
                      {"Filters": [{"Name": "network-interface-id", "Values": [ENI]}]})
    stub.add_client_error("describe_network_interfaces", "InvalidNetworkInterfaceID.NotFound",
                          expected_params={"NetworkInterfaceIds": [ENI]})
    stub.add_response("describe_addresses", address, {"AllocationIds": [EIP]})  # right before its own call
    stub.add_client_error("describe_network_interfaces", "InvalidNetworkInterfaceID.NotFound",
                          expected_params={"NetworkInterfaceIds": [ENI]})
    # no disassociate_address answer: a disassociate would fail the test (the interface waits for it)

    result = delete(client, group(res(ResourceKind.ADDRESS, EIP), res(ResourceKind.NETWORK_INTERFACE, ENI),
                                  primary=None))

    assert set(result.pending) == {EIP, ENI} and result.deleted == ()


def test_gone_everywhere_is_deleted_without_acting(ec2):
    client, stub = ec2
    # the instance is gone: EC2 describes it terminated (for an hour); not found would be unread
    expect_instance(stub, "terminated")
    # the members' re-read (the owner gone): what the filtered answer leaves out is asked by id
    stub.add_response("describe_volumes", {"Volumes": []}, {"Filters": [{"Name": "volume-id", "Values": [VOL]}]})
    stub.add_client_error("describe_volumes", "InvalidVolume.NotFound", expected_params={"VolumeIds": [VOL]})
    stub.add_response("describe_security_groups", {"SecurityGroups": []},
                      {"Filters": [{"Name": "group-id", "Values": [SG]}]})
    stub.add_client_error("describe_security_groups", "InvalidGroup.NotFound", expected_params={"GroupIds": [SG]})
    # each member read again by id as a dependent
    stub.add_client_error("describe_volumes", "InvalidVolume.NotFound", expected_params={"VolumeIds": [VOL]})
    stub.add_client_error("describe_security_groups", "InvalidGroup.NotFound", expected_params={"GroupIds": [SG]})

    result = delete(client, FULL)

    assert result.status is DeleteStatus.DELETED and set(result.deleted) == {PID, VOL, SG}


def test_throttled_re_read_raises_our_type_with_the_region(ec2):
    client, stub = ec2
    stub.add_client_error("describe_instances", "RequestLimitExceeded", http_status_code=503)

    with pytest.raises(ProviderThrottled) as err:
        delete(client, FULL)

    assert err.value.region == REGION


# ---- SAFETY.md rule 14: controllers and termination protection on the re-read ----------

def test_termination_protection_read_first_is_protected_and_never_terminated(ec2):
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, True)  # no terminate_instances answer: a call would fail the test

    result = delete(client, FULL)

    assert result.status is DeleteStatus.PROTECTED and result.protection == "termination_protection"
    assert result.deleted == () and {s.id for s in result.skipped} == {PID, VOL, SG}
    assert PID in (result.protection_detail or "")


def test_operation_not_permitted_on_terminate_is_protection_not_failure(ec2):
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, False)  # raced: protected after the attribute read
    expect_members(stub)
    expect_final_read(stub)
    stub.add_client_error("terminate_instances", "OperationNotPermitted", "may not be terminated",
                          expected_params={"InstanceIds": [PID]})

    result = delete(client, FULL)

    assert result.status is DeleteStatus.PROTECTED and result.protection == "termination_protection"
    assert "OperationNotPermitted" in (result.protection_detail or "")


def test_an_attribute_read_denied_falls_back_to_the_terminate_refusal(ec2):
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute_denied(stub)
    expect_members(stub)
    expect_final_read(stub, attribute_denied=True)  # denied again in the final judgement
    stub.add_client_error("terminate_instances", "OperationNotPermitted", "may not be terminated")

    result = delete(client, FULL)

    assert result.status is DeleteStatus.PROTECTED and result.protection == "termination_protection"


def test_a_controller_tag_on_the_re_read_is_protected_and_never_terminated(ec2):
    client, stub = ec2
    tags = [*TAGS, {"Key": "aws:autoscaling:groupName", "Value": "web-asg"}]
    stub.add_response("describe_instances", instance_reply("running", tags=tags), {"InstanceIds": [PID]})

    result = stubbed_delete(client, FULL, controller_keys=("aws:autoscaling:groupName",))

    assert result.status is DeleteStatus.PROTECTED and result.protection == "managed_by_controller"
    assert "asg:web-asg" in (result.protection_detail or "")


@pytest.mark.parametrize("reply", [{}, {"DisableApiTermination": {}}], ids=["no-attribute", "no-value"])
def test_an_attribute_reply_that_does_not_say_false_is_protection(ec2, reply):
    client, stub = ec2
    expect_instance(stub, "running")
    stub.add_response("describe_instance_attribute", reply, {"InstanceId": PID, "Attribute": "disableApiTermination"})

    result = delete(client, FULL)

    assert result.status is DeleteStatus.PROTECTED and result.protection == "termination_protection"


# ---- SAFETY.md rules 12 and 15: what goes with the instance is what the re-read shows ----

def test_a_protect_tag_on_any_member_keeps_the_whole_group_and_nothing_is_terminated(ec2):
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, False)
    # the data volume (kept on termination) got the protect tag since the listing
    expect_members(stub, vol_tags=[*TAGS, {"Key": "orphan-cleanup-protect", "Value": "yes"}])
    # no terminate_instances answer: a call would fail the test

    result = delete(client, FULL)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert {(s.id, s.reason) for s in result.skipped} == {(VOL, "protected"), (PID, "group_protected"),
                                                          (SG, "group_protected")}


def test_a_member_the_instance_does_not_use_is_left_for_the_next_listing(ec2):
    client, stub = ec2
    loose = "vol-0fedcba9876543210"
    g = group(*FULL.resources, res(ResourceKind.VOLUME, loose))

    def members(stub: Stubber) -> None:  # g's dependents re-read by id: the loose volume too
        stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "in-use", "Tags": TAGS},
                                                           {"VolumeId": loose, "State": "available", "Tags": TAGS}]},
                          {"Filters": [{"Name": "volume-id", "Values": [VOL, loose]}]})
        stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                          {"Filters": [{"Name": "group-id", "Values": [SG]}]})

    expect_instance(stub, "running")
    expect_attribute(stub, False)
    members(stub)
    expect_final_read(stub, members=members)
    stub.add_response("terminate_instances", {}, {"InstanceIds": [PID]})
    expect_instance(stub, "terminated")
    def loose_read() -> None:
        stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": loose, "State": "available", "Tags": TAGS}]},
                          {"VolumeIds": [loose]})

    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "available", "Tags": TAGS}]},
                      {"VolumeIds": [VOL]})
    # the terminate acted since the members were read: the members still to go are read again
    # before anything is done to the first dependent (and again after each call that acted)
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"Filters": [{"Name": "group-id", "Values": [SG]}]})
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": loose, "State": "available", "Tags": TAGS}]},
                      {"Filters": [{"Name": "volume-id", "Values": [loose]}]})
    stub.add_response("delete_volume", {}, {"VolumeId": VOL})
    loose_read()  # re-read by id, not attached: left for the next listing
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"GroupIds": [SG]})
    loose_read()  # the delete of VOL acted: the member left (still the group's) read again
    stub.add_response("delete_security_group", {}, {"GroupId": SG})

    result = delete(client, g)

    assert set(result.deleted) == {PID, VOL, SG} and set(result.attached) == {VOL, SG}
    assert [(s.id, s.reason) for s in result.skipped] == [(loose, "not_attached")]
    assert result.status is DeleteStatus.DELETING  # not done: the loose volume is regrouped next time


def test_a_primary_gone_before_the_call_lets_only_what_an_earlier_call_saw_attached_go(ec2):
    client, stub = ec2
    expect_instance(stub, "terminated")  # gone (not found would be unread: the group skipped)
    # the members' re-read (the owner gone) before any of them is touched
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "available", "Tags": TAGS}]},
                      {"Filters": [{"Name": "volume-id", "Values": [VOL]}]})
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"Filters": [{"Name": "group-id", "Values": [SG]}]})
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": VOL, "State": "available", "Tags": TAGS}]},
                      {"VolumeIds": [VOL]})
    stub.add_response("delete_volume", {}, {"VolumeId": VOL})
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"GroupIds": [SG]})  # exists, never confirmed attached: not deleted

    result = stubbed_delete(client, FULL, known_attached=[VOL])

    assert set(result.deleted) == {PID, VOL}
    assert [(s.id, s.reason) for s in result.skipped] == [(SG, "primary_gone")]
    assert result.status is DeleteStatus.SKIPPED


# ---- the owner judged again on a read right before its call; not found is not gone -----------

OTHER_REF_TAGS = [{"Key": "provider_ref", "Value": "bbbbbbbbbbbb"}, {"Key": "orphan-cleanup-protect", "Value": "yes"}]
NEW_VOL = "vol-0aaaaaaaaaaaaaaa0"


def judged_once(stub: Stubber) -> None:
    """Everything of ``FULL``'s judgement before the final read: the owner, its attribute, the
    members (none of them goes with the terminate: ``VOL`` is kept on termination)."""
    expect_instance(stub, "running")
    expect_attribute(stub, False)
    expect_members(stub)


def skipped(result: Any) -> list[tuple[str, str]]:
    return [(s.id, s.reason) for s in result.skipped]


@pytest.mark.parametrize("change", ["new-foreign-volume", "member-flag-flipped"])
def test_a_final_read_showing_a_new_delete_on_termination_volume_is_not_terminated(ec2, change):
    # attached with DeleteOnTermination after the judgement (attack F3): the blast recomputed
    # from the final read is not the one judged and journaled
    client, stub = ec2
    judged_once(stub)
    final = instance_reply("running")
    devices = final["Reservations"][0]["Instances"][0]["BlockDeviceMappings"]
    if change == "new-foreign-volume":
        devices.append({"DeviceName": "/dev/sdg", "Ebs": {"VolumeId": NEW_VOL, "DeleteOnTermination": True}})
    else:
        devices[0]["Ebs"]["DeleteOnTermination"] = True
    expect_final_read(stub, reply=final)  # the instance, its attribute, the members
    if change == "new-foreign-volume":  # what the final read's blast names is read by its id
        stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": NEW_VOL, "State": "in-use",
                                                            "Tags": OTHER_REF_TAGS}]}, {"VolumeIds": [NEW_VOL]})
    # no terminate_instances answer: a call would fail the test

    result = delete(client, FULL)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == () and result.pending == ()
    if change == "new-foreign-volume":  # judged again on the final read: a protected volume blocks the call
        assert skipped(result) == [(PID, "blast_protected"), (NEW_VOL, "blast_protected"), (VOL, "owner_skipped"),
                                   (SG, "owner_skipped")]
    else:  # the member passes as a member, but the blast is not the one judged and journaled
        assert skipped(result) == [(PID, "changed_since_read"), (VOL, "owner_skipped"), (SG, "owner_skipped")]


@pytest.mark.parametrize(("tags", "reason"), [
    ([*TAGS, {"Key": "orphan-cleanup-protect", "Value": ""}], "protected"),
    ([{"Key": "provider_ref", "Value": "bbbbbbbbbbbb"}], "ref_changed"),
    ([], "ref_missing"),
], ids=["protect-tag", "another-ref", "no-ref"])
def test_a_final_read_showing_a_tag_that_is_not_the_judged_one_is_not_terminated(ec2, tags, reason):
    client, stub = ec2
    judged_once(stub)
    stub.add_response("describe_instances", instance_reply("running", tags=tags), {"InstanceIds": [PID]})
    # no terminate_instances answer: a call would fail the test

    result = delete(client, FULL)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert skipped(result) == [(PID, reason), (VOL, "owner_skipped"), (SG, "owner_skipped")]


@pytest.mark.parametrize(("answer", "reason"), [
    ("shutting-down", "changed_since_read"), ("not-found", "unreadable"),
])
def test_a_final_read_showing_another_state_or_nothing_is_not_terminated(ec2, answer, reason):
    client, stub = ec2
    judged_once(stub)
    if answer == "not-found":
        stub.add_client_error("describe_instances", "InvalidInstanceID.NotFound",
                              expected_params={"InstanceIds": [PID]})
    else:
        expect_final_read(stub, "shutting-down")

    result = delete(client, FULL)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert skipped(result)[0] == (PID, reason)


@pytest.mark.parametrize("known_attached", [(), (VOL,)], ids=["nothing-known", "volume-known-attached"])
def test_an_instance_ec2_answers_not_found_for_is_unread_and_nothing_else_is_called(ec2, known_attached):
    # EC2 describes a terminated instance for an hour: not found for a listed instance is not
    # proof that it is gone (eventual consistency), so not even what an earlier call saw
    # attached to it follows; no other read or call (the stubber has no answer for one)
    client, stub = ec2
    stub.add_client_error("describe_instances", "InvalidInstanceID.NotFound", expected_params={"InstanceIds": [PID]})

    result = stubbed_delete(client, FULL, known_attached=list(known_attached))

    assert result.status is DeleteStatus.SKIPPED and result.deleted == () and result.pending == ()
    assert skipped(result) == [(PID, "unreadable"), (VOL, "owner_skipped"), (SG, "owner_skipped")]


def test_a_member_the_instance_uses_that_reads_gone_is_unread_and_nothing_is_terminated(ec2):
    # the instance's own read names the volume as attached: its "not found" contradicts that
    client, stub = ec2
    expect_instance(stub, "running")
    expect_attribute(stub, False)
    stub.add_response("describe_volumes", {"Volumes": []}, {"Filters": [{"Name": "volume-id", "Values": [VOL]}]})
    stub.add_client_error("describe_volumes", "InvalidVolume.NotFound", expected_params={"VolumeIds": [VOL]})
    stub.add_response("describe_security_groups", {"SecurityGroups": [{"GroupId": SG, "Tags": TAGS}]},
                      {"Filters": [{"Name": "group-id", "Values": [SG]}]})
    # no terminate_instances answer: a call would fail the test

    result = delete(client, FULL)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert skipped(result) == [(PID, "member_unreadable"), (VOL, "unreadable"), (SG, "owner_skipped")]


# ---- a malformed id (a forged message) reads as nothing ---------------------------------------

def test_a_malformed_volume_id_reads_as_nothing_and_nothing_is_called(ec2):
    client, stub = ec2
    bad = "vol-not-an-id"
    for _ in ("the members' re-read", "the read right before its own call"):
        stub.add_client_error("describe_volumes", "InvalidVolumeID.Malformed", expected_params={"VolumeIds": [bad]})
    # no delete_volume answer: a call would fail the test

    result = delete(client, group(res(ResourceKind.VOLUME, bad), primary=None))

    # nothing of that id exists: done, without a call (never an error that fails the cycle)
    assert result.status is DeleteStatus.DELETED and result.deleted == (bad,) and result.skipped == ()


def test_a_malformed_instance_id_is_unread_and_its_group_is_left(ec2):
    client, stub = ec2
    bad = "i-not-an-id"
    stub.add_client_error("describe_instances", "InvalidInstanceID.Malformed", expected_params={"InstanceIds": [bad]})

    result = delete(client, group(res(ResourceKind.INSTANCE, bad), res(ResourceKind.VOLUME, VOL), primary=bad))

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert skipped(result) == [(bad, "unreadable"), (VOL, "owner_skipped")]


# ---- the final read's blast: its resources' tags as that read shows them ----------------------

ROOT = "vol-0bbbbbbbbbbbbbbb0"
LAUNCH = datetime(2026, 11, 1, tzinfo=UTC)


def rooted_instance() -> dict[str, Any]:
    """An on-demand instance whose own root volume (no ref tag, attached at launch) goes with it."""
    return {"Reservations": [{"Instances": [{
        "InstanceId": PID, "State": {"Name": "running", "Code": 16}, "Tags": TAGS, "LaunchTime": LAUNCH,
        "RootDeviceName": "/dev/xvda",
        "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {
            "VolumeId": ROOT, "DeleteOnTermination": True, "AttachTime": LAUNCH}}],
        "NetworkInterfaces": [{"NetworkInterfaceId": ENI, "Attachment": {
            "DeviceIndex": 0, "NetworkCardIndex": 0, "AttachTime": LAUNCH, "DeleteOnTermination": False}}]}]}]}


def expect_root(stub: Stubber, tags: list[dict[str, str]]) -> None:
    stub.add_response("describe_volumes", {"Volumes": [{"VolumeId": ROOT, "State": "in-use", "Tags": tags}]},
                      {"VolumeIds": [ROOT]})


def test_the_own_root_volume_goes_with_the_instance_as_the_final_read_shows_it(ec2):
    client, stub = ec2
    stub.add_response("describe_instances", rooted_instance(), {"InstanceIds": [PID]})
    expect_attribute(stub, False)
    expect_root(stub, [])  # the blast, judged
    expect_final_read(stub, reply=rooted_instance(), members=None)  # the instance alone: no member to read
    expect_root(stub, [])  # its blast, recomputed
    stub.add_response("terminate_instances", {}, {"InstanceIds": [PID]})
    expect_instance(stub, "shutting-down")

    result = delete(client, group(res(ResourceKind.INSTANCE, PID)))

    assert result.status is DeleteStatus.DELETING and result.deleted == (PID,)


def test_a_protect_tag_on_the_final_reads_blast_stops_the_terminate(ec2):
    # the root volume read for the final judgement carries a protect tag (set since the first
    # blast read): rule 15's blast_protected, yet TerminateInstances would take it along
    client, stub = ec2
    stub.add_response("describe_instances", rooted_instance(), {"InstanceIds": [PID]})
    expect_attribute(stub, False)
    expect_root(stub, [])  # the blast, judged: the own root, untagged
    expect_final_read(stub, reply=rooted_instance(), members=None)  # the instance alone: no member to read
    expect_root(stub, [{"Key": "orphan-cleanup-protect", "Value": "yes"}])  # its blast, read now
    # no terminate_instances answer: a terminate fails with the stubber's error

    try:
        result = delete(client, group(res(ResourceKind.INSTANCE, PID)))
    except ProviderError as exc:
        pytest.fail(f"TerminateInstances called though the final read shows {ROOT} protected: {exc}")

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert (ROOT, "blast_protected") in skipped(result)
