"""The AWS adapter against a moto server over HTTP (listing, deletion, wiring).

Resources are created with plain boto3 against the server, the adapter is
exercised, and the outcome is checked with boto3 again. API calls made by the
adapter are recorded with botocore event hooks on the session it was built with.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.errors import ProviderError, ProviderUnavailable
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.providers.aws.provider import AwsProvider, build_aws_provider, client_config, session_client_factory
from tests.support.aws_calls import CallLog
from tests.support.listing import collect

pytestmark = pytest.mark.usefixtures("moto_reset")

EAST, WEST, DEAD = "us-east-1", "eu-west-1", "ap-south-1"
NOWHERE = "xx-nowhere-1"  # moto has no EC2 there and answers an HTML 500 page
REF_A, REF_B = "aaaaaaaaaaa1", "bbbbbbbbbbb2"
TAG, PROTECT = "provider_ref", "orphan-cleanup-protect"
AMI = "ami-12c6146b"
DESCRIBES = {
    "DescribeInstances": "InstanceIds",
    "DescribeVolumes": "VolumeIds",
    "DescribeNetworkInterfaces": "NetworkInterfaceIds",
    "DescribeSecurityGroups": "GroupIds",
    "DescribeAddresses": "AllocationIds",
    "DescribeSpotInstanceRequests": "SpotInstanceRequestIds",
    "DescribeLaunchTemplates": "LaunchTemplateIds",
    "DescribeKeyPairs": "KeyPairIds",
    "DescribePlacementGroups": "GroupIds",
    "DescribeLoadBalancers": "LoadBalancerArns",
    "DescribeTargetGroups": "TargetGroupArns",
    "DescribeSnapshots": "SnapshotIds",
}
ACTIONS = {
    "TerminateInstances": "InstanceIds",
    "DeleteVolume": "VolumeId",
    "DeleteNetworkInterface": "NetworkInterfaceId",
    "DeleteSecurityGroup": "GroupId",
    "ReleaseAddress": "AllocationId",
    "CancelSpotInstanceRequests": "SpotInstanceRequestIds",
    "DeleteSnapshot": "SnapshotId",
}
MUTATING = set(ACTIONS) | {"DetachNetworkInterface", "DisassociateAddress"}


# -- given: helpers that build a fleet with plain boto3 -------------------------------------------------


def ec2(region: str = EAST) -> Any:
    return boto3.client("ec2", region_name=region)


def tags(resource_type: str, ref: str | None, **extra: str) -> list[dict[str, Any]]:
    pairs = ({TAG: ref} if ref is not None else {}) | extra
    if not pairs:
        return []
    return [{"ResourceType": resource_type, "Tags": [{"Key": k, "Value": v} for k, v in pairs.items()]}]


def run_instance(client: Any, ref: str | None, *, sg: str | None = None, **extra: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"ImageId": AMI, "MinCount": 1, "MaxCount": 1}
    if sg:
        kwargs["SecurityGroupIds"] = [sg]
    spec = tags("instance", ref, **extra)
    if spec:
        kwargs["TagSpecifications"] = spec
    return client.run_instances(**kwargs)["Instances"][0]


def create_volume(client: Any, ref: str | None, *, attach_to: dict[str, Any] | None = None,
                  device: str = "/dev/sdf", **extra: str) -> str:
    az = attach_to["Placement"]["AvailabilityZone"] if attach_to else client.meta.region_name + "a"
    kwargs: dict[str, Any] = {"AvailabilityZone": az, "Size": 1}
    if spec := tags("volume", ref, **extra):
        kwargs["TagSpecifications"] = spec
    vol = client.create_volume(**kwargs)["VolumeId"]
    if attach_to:
        client.attach_volume(VolumeId=vol, InstanceId=attach_to["InstanceId"], Device=device)
    return vol


def default_subnet(client: Any) -> str:
    return client.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]["SubnetId"]


def create_eni(client: Any, ref: str | None, *, sg: str | None = None, attach_to: dict[str, Any] | None = None,
               index: int = 1, **extra: str) -> str:
    subnet = attach_to["SubnetId"] if attach_to else default_subnet(client)
    kwargs: dict[str, Any] = {"SubnetId": subnet}
    if sg:
        kwargs["Groups"] = [sg]
    if spec := tags("network-interface", ref, **extra):
        kwargs["TagSpecifications"] = spec
    eni = client.create_network_interface(**kwargs)["NetworkInterface"]["NetworkInterfaceId"]
    if attach_to:
        client.attach_network_interface(NetworkInterfaceId=eni, InstanceId=attach_to["InstanceId"], DeviceIndex=index)
    return eni


def create_sg(client: Any, name: str, ref: str | None, **extra: str) -> str:
    kwargs: dict[str, Any] = {"GroupName": name, "Description": name}
    if spec := tags("security-group", ref, **extra):
        kwargs["TagSpecifications"] = spec
    return client.create_security_group(**kwargs)["GroupId"]


def allocate_eip(client: Any, ref: str | None, *, instance: dict[str, Any] | None = None, **extra: str) -> str:
    kwargs: dict[str, Any] = {"Domain": "vpc"}
    if spec := tags("elastic-ip", ref, **extra):
        kwargs["TagSpecifications"] = spec
    alloc = client.allocate_address(**kwargs)["AllocationId"]
    if instance:
        client.associate_address(AllocationId=alloc, InstanceId=instance["InstanceId"])
    return alloc


def orphan_fleet(client: Any, ref: str, name: str) -> dict[str, Any]:
    """One instance with all four dependent kinds attached, all tagged ``ref``."""
    sg = create_sg(client, name, ref)
    inst = run_instance(client, ref, sg=sg)
    return {
        "instance": inst["InstanceId"],
        "volume": create_volume(client, ref, attach_to=inst),
        "eni": create_eni(client, ref, sg=sg, attach_to=inst),
        "sg": sg,
        "eip": allocate_eip(client, ref, instance=inst),
        "raw": inst,
    }


def set_tags(client: Any, resource_id: str, **pairs: str) -> None:
    client.create_tags(Resources=[resource_id], Tags=[{"Key": k, "Value": v} for k, v in pairs.items()])


def exists(client: Any, kind: str, resource_id: str) -> bool:
    """Is it still there (an instance: not terminated)?"""
    call, param = {
        "instance": ("describe_instances", "InstanceIds"),
        "volume": ("describe_volumes", "VolumeIds"),
        "eni": ("describe_network_interfaces", "NetworkInterfaceIds"),
        "sg": ("describe_security_groups", "GroupIds"),
        "eip": ("describe_addresses", "AllocationIds"),
    }[kind]
    try:
        reply = getattr(client, call)(**{param: [resource_id]})
    except ClientError as exc:
        if exc.response["Error"]["Code"].endswith(".NotFound"):
            return False
        raise
    if kind == "instance":
        states = [i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]]
        return bool(states) and states[0] not in ("shutting-down", "terminated")
    return True


# -- the adapter under test, with its API calls recorded ----------------------------------------------


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    """A bound port nobody listens on: connections are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def backend(regions: tuple[str, ...], **settings: Any) -> Backend:
    return Backend(id="aws-test", provider="aws", account="123456789012", regions=regions,
                   settings=BackendSettings(**settings))


def make_provider(session: boto3.Session, regions: tuple[str, ...] = (EAST,), **settings: Any) -> AwsProvider:
    return build_aws_provider(backend(regions, **settings), connect_timeout=2, read_timeout=10, session=session)


def group_map(groups: tuple[ResourceGroup, ...] | list[ResourceGroup]) -> dict[tuple[str, str, str | None], set[str]]:
    return {(g.provider_ref, g.region, g.primary_id): set(g.resource_ids()) for g in groups}


def group_of(provider: AwsProvider, primary_id: str) -> ResourceGroup:
    [group] = [g for g in collect(provider).groups if g.primary_id == primary_id]
    return group


def assert_reread_before_acting(log: CallLog, group: ResourceGroup) -> None:
    """Every terminate/delete targets an id of the group that was described by id earlier in this call."""
    described: set[str] = set()
    for _, op, params in log.calls:
        if op in DESCRIBES:
            described.update(params.get(DESCRIBES[op], []))
        elif op in ACTIONS:
            value = params[ACTIONS[op]]
            ids = set(value if isinstance(value, list) else [value])
            assert ids <= set(group.resource_ids()), (op, ids)
            assert ids <= described, f"{op} {ids} without a re-read"


# -- listing ---------------------------------------------------------------------------------------------


def test_listing_groups_two_regions_and_reports_the_failing_one(session, dead_endpoint):
    east, west = ec2(EAST), ec2(WEST)
    a1 = orphan_fleet(east, REF_A, "a1")
    a2 = run_instance(east, REF_A)  # same ref, second instance: a group of its own
    b1 = run_instance(east, REF_B)
    untagged = run_instance(east, None)
    untagged_vol = create_volume(east, None, attach_to=a1["raw"], device="/dev/sdg")
    a_on_untagged = create_volume(east, REF_A, attach_to=untagged)  # ref A, attached to a non-A instance
    b_leftover = create_volume(east, REF_B)
    b_leftover_eip = allocate_eip(east, REF_B)
    bad_ref_vol = create_volume(east, "NOT-A-REF")  # invalid value: its own malformed_ref group
    gone = run_instance(east, REF_A)
    east.terminate_instances(InstanceIds=[gone["InstanceId"]])
    w1 = run_instance(west, REF_A)
    w1_vol = create_volume(west, REF_A, attach_to=w1)
    w1_eni = create_eni(west, REF_B, attach_to=w1)  # other ref than its instance: primary-less B group

    config = client_config(connect_timeout=2, read_timeout=10)
    dead_config = client_config(connect_timeout=0.2, read_timeout=0.2, max_attempts=1)
    good = session_client_factory(session, config)

    def factory(service: str, region: str) -> Any:
        if region == DEAD:
            return session.client(service, region_name=region, endpoint_url=dead_endpoint, config=dead_config)
        return good(service, region)

    provider = AwsProvider(backend((EAST, DEAD, WEST, NOWHERE)), factory)
    listing = collect(provider)

    assert sorted((f.region, f.error.split(":")[0]) for f in listing.failures) == [
        (DEAD, "ProviderUnavailable"), (NOWHERE, "ProviderUnavailable")]
    assert group_map(listing.groups) == {
        (REF_A, EAST, a1["instance"]): {a1["instance"], a1["volume"], a1["eni"], a1["sg"], a1["eip"]},
        (REF_A, EAST, a2["InstanceId"]): {a2["InstanceId"]},
        (REF_B, EAST, b1["InstanceId"]): {b1["InstanceId"]},
        (REF_A, EAST, None): {a_on_untagged},
        (REF_B, EAST, None): {b_leftover, b_leftover_eip},
        (REF_A, WEST, w1["InstanceId"]): {w1["InstanceId"], w1_vol},
        (REF_B, WEST, None): {w1_eni},
        ("NOT-A-REF", EAST, None): {bad_ref_vol},
    }
    assert [g.malformed_ref for g in listing.groups if g.provider_ref == "NOT-A-REF"] == [True]
    assert not any(g.malformed_ref for g in listing.groups if g.provider_ref != "NOT-A-REF")
    resources = {r.id: r for g in listing.groups for r in g.resources}
    assert untagged_vol not in resources and untagged["InstanceId"] not in resources
    inst = resources[a1["instance"]]
    assert inst.kind is ResourceKind.INSTANCE and inst.state is ResourceState.ACTIVE
    assert inst.tags == {TAG: REF_A} and inst.created_at is not None and inst.created_at.tzinfo is not None
    assert resources[a1["volume"]].state is ResourceState.ACTIVE
    assert resources[a1["volume"]].attached_to == a1["instance"]
    assert resources[a_on_untagged].attached_to == untagged["InstanceId"]
    assert resources[b_leftover].state is ResourceState.AVAILABLE and resources[b_leftover].attached_to is None
    assert resources[b_leftover_eip].state is ResourceState.AVAILABLE
    assert resources[a1["eip"]].state is ResourceState.ACTIVE
    assert {resources[a1[k]].attached_to for k in ("eni", "sg", "eip")} == {a1["instance"]}


def test_listing_follows_pages_of_more_than_100_reservations(session):
    client = ec2(EAST)
    ids = {run_instance(client, REF_A)["InstanceId"] for _ in range(105)}
    pages: list[str] = []
    session.events.register("before-call.ec2.DescribeInstances", lambda **kw: pages.append("page"))
    # EC2 may answer fewer items than MaxResults (the adapter asks for 1,000, issue #17):
    # pages of 100 on the wire, so the adapter must follow NextToken.
    session.events.register("before-parameter-build.ec2.DescribeInstances",
                            lambda params, **kw: params.update(MaxResults=100))

    groups = collect(make_provider(session)).groups

    assert {g.primary_id for g in groups} == ids
    assert len(pages) >= 2


def test_listing_uses_only_each_services_describe_call(session, calls):
    fleet = orphan_fleet(ec2(EAST), REF_A, "x")
    elsewhere = CallLog()  # a client made outside the injected session would show up here
    boto3.setup_default_session()
    elsewhere.attach(boto3.DEFAULT_SESSION)
    provider = make_provider(session, (EAST, WEST))

    groups = collect(provider).groups

    assert fleet["instance"] in {g.primary_id for g in groups}
    assert elsewhere.calls == []
    assert {svc for svc, _, _ in calls.calls} == {"ec2", "elbv2"}
    assert set(calls.ops()) == set(DESCRIBES) - {"DescribeSnapshots"}  # listed only with retain_snapshots_days
    for svc, op, params in calls.calls:
        if svc == "ec2":
            assert {"Name": "tag-key", "Values": [TAG]} in params["Filters"], op
        else:  # ELBv2's describes have no tag filter: their tags are read by ARN (none here)
            assert op in ("DescribeLoadBalancers", "DescribeTargetGroups"), op
    assert "terminated" not in next(
        f["Values"] for _, op, p in calls.calls if op == "DescribeInstances"
        for f in p["Filters"] if f["Name"] == "instance-state-name"
    )


def test_listing_honours_a_custom_tag_key(session):
    client = ec2(EAST)
    custom = run_instance(client, None, owner_ref=REF_A)
    run_instance(client, REF_B)

    groups = collect(make_provider(session, tag_key="owner_ref")).groups

    assert group_map(groups) == {(REF_A, EAST, custom["InstanceId"]): {custom["InstanceId"]}}


def test_instance_created_at_is_the_listed_launch_time_of_that_id(session):
    client = ec2(EAST)
    vm = run_instance(client, REF_A)["InstanceId"]
    provider = make_provider(session)
    primary = group_of(provider, vm).primary
    assert primary is not None and primary.created_at is not None

    assert provider.instance_created_at(primary) == primary.created_at  # the listing's LaunchTime
    set_tags(client, vm, provider_ref=REF_B)
    assert provider.instance_created_at(primary) == primary.created_at  # whatever its tags (the delete judges them)
    with pytest.raises(ProviderError, match=WEST):  # a region the backend does not list
        provider.instance_created_at(primary.model_copy(update={"region": WEST}))
    client.terminate_instances(InstanceIds=[vm])
    assert provider.instance_created_at(primary) is None  # terminated


# -- deletion --------------------------------------------------------------------------------------------


def delete_until_done(provider: AwsProvider, group: ResourceGroup, calls: CallLog) -> list[Any]:
    """Call again while ``DELETING``, with what the earlier call saw attached (as the
    deleter does, from the ledger)."""
    results: list[Any] = []
    for _ in range(2):
        calls.clear()
        known = results[-1].attached if results else ()
        results.append(provider.delete_resource_group(group, known_attached=known))
        assert_reread_before_acting(calls, group)
        if results[-1].status is not DeleteStatus.DELETING:
            break
    return results


def test_orphan_group_with_all_kinds_is_deleted_and_leaves_the_rest(session, calls):
    client = ec2(EAST)
    fleet = orphan_fleet(client, REF_A, "orphan")
    untagged_vol = create_volume(client, None, attach_to=fleet["raw"], device="/dev/sdg")
    neighbour = run_instance(client, REF_A)
    provider = make_provider(session)
    group = group_of(provider, fleet["instance"])
    assert untagged_vol not in group.resource_ids()

    results = delete_until_done(provider, group, calls)

    assert results[-1].status is DeleteStatus.DELETED
    for kind in ("instance", "volume", "eni", "sg", "eip"):
        assert not exists(client, kind, fleet[kind]), kind
    assert exists(client, "volume", untagged_vol)
    assert exists(client, "instance", neighbour["InstanceId"])
    assert results[-1].skipped == ()
    assert set(results[-1].deleted) >= {fleet[k] for k in ("volume", "eni", "sg", "eip")}

    calls.clear()
    again = provider.delete_resource_group(group)

    assert again.status is DeleteStatus.DELETED
    assert not MUTATING & set(calls.ops())


def test_protected_instance_keeps_its_whole_group(session, calls):
    client = ec2(EAST)
    fleet = orphan_fleet(client, REF_A, "protected")
    set_tags(client, fleet["instance"], **{PROTECT: ""})
    provider = make_provider(session)
    group = group_of(provider, fleet["instance"])
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert (fleet["instance"], "protected") in [(s.id, s.reason) for s in result.skipped]
    assert {s.id for s in result.skipped} == set(group.resource_ids())
    assert not MUTATING & set(calls.ops())
    for kind in ("instance", "volume", "eni", "sg", "eip"):
        assert exists(client, kind, fleet[kind]), kind


@pytest.mark.parametrize("change, reason", [({TAG: REF_B}, "ref_changed"), ({PROTECT: "1"}, "protected")])
def test_instance_changed_after_listing_is_not_touched(session, calls, change, reason):
    client = ec2(EAST)
    fleet = orphan_fleet(client, REF_A, "changed")
    provider = make_provider(session)
    group = group_of(provider, fleet["instance"])
    set_tags(client, fleet["instance"], **change)  # between listing and delete
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.SKIPPED
    assert (fleet["instance"], reason) in [(s.id, s.reason) for s in result.skipped]
    assert not MUTATING & set(calls.ops())
    assert exists(client, "instance", fleet["instance"]) and exists(client, "volume", fleet["volume"])


def test_dependents_changed_after_listing_survive(session, calls):
    client = ec2(EAST)
    fleet = orphan_fleet(client, REF_A, "deps")
    provider = make_provider(session)
    group = group_of(provider, fleet["instance"])
    set_tags(client, fleet["volume"], **{TAG: REF_B})
    client.delete_tags(Resources=[fleet["eip"]], Tags=[{"Key": TAG}])

    results = delete_until_done(provider, group, calls)

    assert results[-1].status is DeleteStatus.DELETED
    assert {(s.id, s.reason) for s in results[-1].skipped} == {
        (fleet["volume"], "ref_changed"), (fleet["eip"], "ref_missing")}
    assert not any(exists(client, k, fleet[k]) for k in ("instance", "eni", "sg"))
    assert all(exists(client, k, fleet[k]) for k in ("volume", "eip"))


@pytest.mark.parametrize("member", ["volume", "eni", "sg", "eip"])
def test_a_protect_tag_put_on_any_member_after_listing_keeps_the_whole_group(session, calls, member):
    # SAFETY.md rule 12, as the classifier reads a listing: the whole group, not just that member
    client = ec2(EAST)
    fleet = orphan_fleet(client, REF_A, "late-protect")
    provider = make_provider(session)
    group = group_of(provider, fleet["instance"])
    set_tags(client, fleet[member], **{PROTECT: "keep"})
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.SKIPPED and result.deleted == ()
    assert (fleet[member], "protected") in [(s.id, s.reason) for s in result.skipped]
    assert not MUTATING & set(calls.ops())
    assert all(exists(client, k, fleet[k]) for k in ("instance", "volume", "eni", "sg", "eip"))


def test_instance_is_kept_when_termination_would_delete_a_protected_volume(session, calls):
    client = ec2(EAST)
    inst = client.run_instances(
        ImageId=AMI, MinCount=1, MaxCount=1,
        # the root volume: protected, not a member of the group (no ref tag), deleted on termination
        TagSpecifications=tags("instance", REF_A) + tags("volume", None, **{PROTECT: "root"}),
    )["Instances"][0]
    provider = make_provider(session)
    group = group_of(provider, inst["InstanceId"])
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.SKIPPED
    # the blast of TerminateInstances is the group (SAFETY.md rule 15): the blocking volume is named
    assert (inst["InstanceId"], "blast_protected") in [(s.id, s.reason) for s in result.skipped]
    assert "TerminateInstances" not in calls.ops()
    assert exists(client, "instance", inst["InstanceId"])


def test_leftovers_without_an_instance_are_deleted_in_one_call(session, calls):
    client = ec2(EAST)
    sg = create_sg(client, "left", REF_A)
    ids = {create_volume(client, REF_A), create_eni(client, REF_A, sg=sg), allocate_eip(client, REF_A), sg}
    provider = make_provider(session)
    [group] = collect(provider).groups
    assert group.primary_id is None and set(group.resource_ids()) == ids

    results = delete_until_done(provider, group, calls)

    assert len(results) == 1 and results[0].status is DeleteStatus.DELETED
    assert set(results[0].deleted) == ids


def test_dependents_in_use_by_a_live_instance_are_pending_not_detached(session, calls):
    client = ec2(EAST)
    live = run_instance(client, None)  # not ours: must keep its volume, interface and address
    vol = create_volume(client, REF_A, attach_to=live)
    eni = create_eni(client, REF_A, attach_to=live)
    eip = allocate_eip(client, REF_A, instance=live)
    provider = make_provider(session)
    [group] = collect(provider).groups
    calls.clear()

    result = provider.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETING
    assert set(result.pending) == {vol, eni, eip} and result.deleted == ()
    assert not MUTATING & set(calls.ops())
    assert client.describe_volumes(VolumeIds=[vol])["Volumes"][0]["State"] == "in-use"
    assert client.describe_addresses(AllocationIds=[eip])["Addresses"][0].get("AssociationId")
    assert client.describe_network_interfaces(NetworkInterfaceIds=[eni])["NetworkInterfaces"][0]["Attachment"]


def test_group_the_adapter_could_not_have_listed_is_refused(session, calls):
    client = ec2(EAST)
    fleet = orphan_fleet(client, REF_A, "shape")
    provider = make_provider(session)
    group = group_of(provider, fleet["instance"])
    disk = Resource(kind=ResourceKind.DISK, id="123", region=EAST, tags={TAG: REF_A})
    calls.clear()

    with pytest.raises(ProviderError):
        provider.delete_resource_group(group.model_copy(update={"resources": group.resources + (disk,)}))
    with pytest.raises(ProviderError):
        provider.delete_resource_group(group.model_copy(update={"region": WEST}))

    assert calls.calls == []
    assert exists(client, "instance", fleet["instance"])


def test_deleting_in_an_unreachable_region_raises_unavailable(session, dead_endpoint):
    dead_config = client_config(connect_timeout=0.2, read_timeout=0.2, max_attempts=1)
    provider = AwsProvider(
        backend((DEAD,)),
        lambda service, region: session.client(service, region_name=region, endpoint_url=dead_endpoint,
                                               config=dead_config),
    )
    group = ResourceGroup(provider_ref=REF_A, region=DEAD, primary_id="i-0123456789abcdef0", resources=(
        Resource(kind=ResourceKind.INSTANCE, id="i-0123456789abcdef0", region=DEAD, tags={TAG: REF_A}),))

    with pytest.raises(ProviderUnavailable) as err:
        provider.delete_resource_group(group)

    assert err.value.region == DEAD and err.value.__cause__ is not None


# -- wiring ----------------------------------------------------------------------------------------------


def test_assumed_role_credentials_are_used_with_external_id(session, calls):
    role = "arn:aws:iam::111111111111:role/cleanup"
    assumed = boto3.client("sts").assume_role(RoleArn=role, RoleSessionName="setup")["Credentials"]
    other_account = boto3.client(
        "ec2", region_name=EAST, aws_access_key_id=assumed["AccessKeyId"],
        aws_secret_access_key=assumed["SecretAccessKey"], aws_session_token=assumed["SessionToken"])
    theirs = run_instance(other_account, REF_A)
    run_instance(ec2(EAST), REF_B)  # in the caller's own account: must not be listed

    provider = make_provider(session, role_arn=role, external_id="ext-123")
    groups = collect(provider).groups

    assert group_map(groups) == {(REF_A, EAST, theirs["InstanceId"]): {theirs["InstanceId"]}}
    [(_, _, params)] = [c for c in calls.calls if c[1] == "AssumeRole"]
    assert params == {"RoleArn": role, "RoleSessionName": "orphan-cleanup", "ExternalId": "ext-123"}
    arn = provider.client_factory("sts", EAST).get_caller_identity()["Arn"]
    assert arn.endswith(":assumed-role/cleanup/orphan-cleanup")
