"""The declarative kind table: item parsing, state mapping, attachment links, delete order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.providers.aws.kinds import (
    ADDRESS,
    BY_KIND,
    INSTANCE,
    KEY_PAIR,
    KINDS,
    LAUNCH_TEMPLATE,
    LOAD_BALANCER,
    NETWORK_INTERFACE,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    TARGET_GROUP,
    VOLUME,
)
from orphan_cleanup.providers.aws.listing import describe_tagged_by_arn, link_resources, to_resource
from orphan_cleanup.providers.base import group_resources
from orphan_cleanup.providers.operations import delete_order

REF = "abcdefabcdef"
T = [{"Key": "provider_ref", "Value": REF}]


def instance(iid: str, *, state: str = "running", sgs: tuple[str, ...] = (), tags=T) -> dict:
    return {
        "InstanceId": iid,
        "State": {"Name": state, "Code": 16},
        "LaunchTime": datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2))),
        "Tags": tags,
        "SecurityGroups": [{"GroupId": g} for g in sgs],
        "Placement": {"AvailabilityZone": "us-east-1a"},
    }


def test_every_kind_has_one_row_and_the_delete_order_respects_dependencies():
    assert set(BY_KIND) == {ResourceKind.INSTANCE, ResourceKind.VOLUME, ResourceKind.NETWORK_INTERFACE,
                            ResourceKind.SECURITY_GROUP, ResourceKind.ADDRESS, ResourceKind.SPOT_REQUEST,
                            ResourceKind.SNAPSHOT, ResourceKind.LAUNCH_TEMPLATE, ResourceKind.KEY_PAIR,
                            ResourceKind.PLACEMENT_GROUP, ResourceKind.LOAD_BALANCER, ResourceKind.TARGET_GROUP}
    order = list(delete_order(KINDS))
    for spec in KINDS:
        for dep in spec.depends_on:
            assert order.index(dep) < order.index(spec.kind), (spec.kind, dep)
    assert order[0] is ResourceKind.INSTANCE
    assert order.index(ResourceKind.SECURITY_GROUP) > order.index(ResourceKind.NETWORK_INTERFACE)
    assert order.index(ResourceKind.TARGET_GROUP) > order.index(ResourceKind.LOAD_BALANCER)


def test_instances_are_listed_without_terminated_ones():
    [state_filter] = INSTANCE.list_filters

    assert state_filter["Name"] == "instance-state-name"
    assert set(state_filter["Values"]) == {"pending", "running", "stopping", "stopped", "shutting-down"}


@pytest.mark.parametrize(
    "spec, item, state",
    [
        (INSTANCE, instance("i-1", state="pending"), ResourceState.ACTIVE),
        (INSTANCE, instance("i-1", state="stopped"), ResourceState.ACTIVE),
        (INSTANCE, instance("i-1", state="shutting-down"), ResourceState.TERMINATING),
        (INSTANCE, instance("i-1", state="terminated"), ResourceState.TERMINATED),
        (INSTANCE, instance("i-1", state="some-new-state"), ResourceState.ACTIVE),
        (VOLUME, {"VolumeId": "vol-1", "State": "in-use"}, ResourceState.ACTIVE),
        (VOLUME, {"VolumeId": "vol-1", "State": "available"}, ResourceState.AVAILABLE),
        (NETWORK_INTERFACE, {"NetworkInterfaceId": "eni-1", "Status": "available"}, ResourceState.AVAILABLE),
        (NETWORK_INTERFACE, {"NetworkInterfaceId": "eni-1", "Status": "in-use"}, ResourceState.ACTIVE),
        (ADDRESS, {"AllocationId": "eipalloc-1", "AssociationId": "eipassoc-1"}, ResourceState.ACTIVE),
        (ADDRESS, {"AllocationId": "eipalloc-1"}, ResourceState.AVAILABLE),
        (SECURITY_GROUP, {"GroupId": "sg-1"}, ResourceState.ACTIVE),
    ],
)
def test_state_mapping(spec, item, state):
    assert spec.state(item) is state


def test_instance_item_becomes_a_resource():
    res = to_resource(INSTANCE, instance("i-1"), "us-east-1")

    assert (res.kind, res.id, res.region, res.state) == (ResourceKind.INSTANCE, "i-1", "us-east-1",
                                                        ResourceState.ACTIVE)
    assert res.tags == {"provider_ref": REF}
    assert res.created_at == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert res.attached_to is None and res.details["state"] == "running"


def test_dependents_take_their_attachment_and_times():
    vol = to_resource(VOLUME, {"VolumeId": "vol-1", "State": "in-use", "Tags": T,
                               "CreateTime": datetime(2024, 1, 1),
                               "Attachments": [{"InstanceId": "i-1", "State": "attached"}]}, "r")
    eni = to_resource(NETWORK_INTERFACE, {"NetworkInterfaceId": "eni-1", "Status": "in-use", "TagSet": T,
                                          "Attachment": {"InstanceId": "i-1",
                                                         "AttachTime": datetime(2024, 1, 2, tzinfo=UTC)}},
                      "r")
    loose = to_resource(VOLUME, {"VolumeId": "vol-2", "State": "available", "Attachments": []}, "r")

    assert vol.attached_to == "i-1" and vol.created_at == datetime(2024, 1, 1, tzinfo=UTC)
    assert eni.attached_to == "i-1" and eni.tags == {"provider_ref": REF} and eni.created_at is not None
    assert loose.attached_to is None and loose.created_at is None and loose.tags == {}


def test_reservations_are_flattened():
    page = {"Reservations": [{"Instances": [instance("i-1"), instance("i-2")]}, {"Instances": [instance("i-3")]}]}

    assert [INSTANCE.item_id(i) for i in INSTANCE.items(page)] == ["i-1", "i-2", "i-3"]


def _linked(raw):
    resources = [to_resource(BY_KIND[kind], item, "r") for kind, items in raw.items() for item in items]
    return {r.id: r.attached_to for r in link_resources(raw, resources, "provider_ref")}


def test_security_group_used_by_one_same_ref_instance_joins_its_group():
    raw = {
        ResourceKind.INSTANCE: [instance("i-1", sgs=("sg-1", "sg-shared")), instance("i-2", sgs=("sg-shared",)),
                                instance("i-3", sgs=("sg-other",), tags=[{"Key": "provider_ref",
                                                                           "Value": "zzzzzzzzzzzz"}])],
        ResourceKind.NETWORK_INTERFACE: [],
        ResourceKind.SECURITY_GROUP: [{"GroupId": g, "Tags": T} for g in ("sg-1", "sg-shared", "sg-other")],
    }

    links = _linked(raw)

    assert links["sg-1"] == "i-1"
    assert links["sg-shared"] is None  # two instances use it: primary-less group
    assert links["sg-other"] is None  # used only by an instance of another ref


def test_security_group_of_an_attached_interface_counts_as_used_by_its_instance():
    raw = {
        ResourceKind.INSTANCE: [instance("i-1")],
        ResourceKind.NETWORK_INTERFACE: [{"NetworkInterfaceId": "eni-1", "Status": "in-use", "TagSet": T,
                                          "Groups": [{"GroupId": "sg-1"}], "Attachment": {"InstanceId": "i-1"}}],
        ResourceKind.SECURITY_GROUP: [{"GroupId": "sg-1", "Tags": T}],
    }

    assert _linked(raw)["sg-1"] == "i-1"


def test_address_on_an_interface_is_attached_to_that_interfaces_instance():
    raw = {
        ResourceKind.INSTANCE: [instance("i-1")],
        ResourceKind.NETWORK_INTERFACE: [{"NetworkInterfaceId": "eni-1", "Status": "in-use", "TagSet": T,
                                          "Attachment": {"InstanceId": "i-1"}}],
        ResourceKind.ADDRESS: [
            {"AllocationId": "eipalloc-1", "AssociationId": "a", "NetworkInterfaceId": "eni-1", "Tags": T},
            {"AllocationId": "eipalloc-2", "AssociationId": "b", "NetworkInterfaceId": "eni-unlisted", "Tags": T},
        ],
    }

    links = _linked(raw)

    assert links["eipalloc-1"] == "i-1" and links["eipalloc-2"] is None


def test_linked_resources_fold_into_groups():
    raw = {
        ResourceKind.INSTANCE: [instance("i-1", sgs=("sg-1",))],
        ResourceKind.SECURITY_GROUP: [{"GroupId": "sg-1", "Tags": T}],
        ResourceKind.VOLUME: [{"VolumeId": "vol-9", "State": "available", "Tags": T}],
    }
    resources = [to_resource(BY_KIND[k], item, "r") for k, items in raw.items() for item in items]

    groups = group_resources(link_resources(raw, resources, "provider_ref"), "provider_ref")

    assert {(g.primary_id, tuple(g.resource_ids())) for g in groups} == {("i-1", ("i-1", "sg-1")),
                                                                         (None, ("vol-9",))}


def lt_tags(template_id: str) -> list[dict]:
    return [*T, {"Key": "aws:ec2launchtemplate:id", "Value": template_id},
            {"Key": "aws:ec2launchtemplate:version", "Value": "1"}]


def test_launch_template_item_becomes_a_resource_with_its_creation_time_and_no_state():
    item = {"LaunchTemplateId": "lt-1", "LaunchTemplateName": "job-1", "Tags": T,
            "CreateTime": datetime(2024, 5, 1, 12, 0, tzinfo=UTC)}

    res = to_resource(LAUNCH_TEMPLATE, item, "r")

    assert (res.kind, res.id, res.state) == (ResourceKind.LAUNCH_TEMPLATE, "lt-1", ResourceState.ACTIVE)
    assert res.created_at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert res.details["LaunchTemplateName"] == "job-1" and res.attached_to is None
    assert LAUNCH_TEMPLATE.id_filter is None  # DescribeLaunchTemplates has no id filter: read one by one
    assert LAUNCH_TEMPLATE.depends_on == (ResourceKind.INSTANCE,)


def test_launch_template_joins_the_one_same_ref_instance_launched_from_it():
    raw = {
        ResourceKind.INSTANCE: [instance("i-1", tags=lt_tags("lt-1")), instance("i-2", tags=lt_tags("lt-shared")),
                                instance("i-3", tags=lt_tags("lt-shared")),
                                instance("i-4", tags=[{"Key": "provider_ref", "Value": "zzzzzzzzzzzz"},
                                                      {"Key": "aws:ec2launchtemplate:id", "Value": "lt-other"}])],
        ResourceKind.LAUNCH_TEMPLATE: [{"LaunchTemplateId": t, "Tags": T}
                                       for t in ("lt-1", "lt-shared", "lt-other", "lt-unused")],
    }

    links = _linked(raw)

    assert links["lt-1"] == "i-1"
    assert links["lt-shared"] is None  # two instances launched from it: primary-less group
    assert links["lt-other"] is None  # only an instance of another ref uses it
    assert links["lt-unused"] is None


def test_key_pair_joins_the_one_same_ref_instance_naming_it():
    named = [instance("i-1"), instance("i-2"), instance("i-3")]
    named[0]["KeyName"], named[1]["KeyName"], named[2]["KeyName"] = "job-1", "shared", "shared"
    raw = {
        ResourceKind.INSTANCE: named,
        ResourceKind.KEY_PAIR: [{"KeyPairId": "key-1", "KeyName": "job-1", "Tags": T},
                                {"KeyPairId": "key-2", "KeyName": "shared", "Tags": T},
                                {"KeyPairId": "key-3", "KeyName": "unused", "Tags": T}],
    }

    links = _linked(raw)

    assert (links["key-1"], links["key-2"], links["key-3"]) == ("i-1", None, None)
    assert to_resource(KEY_PAIR, raw[ResourceKind.KEY_PAIR][0], "r").details["KeyName"] == "job-1"
    assert KEY_PAIR.page_size is None and KEY_PAIR.delete_params("key-1") == {"KeyPairId": "key-1"}


def test_placement_group_joins_the_one_same_ref_instance_in_it_and_is_deleted_by_its_name():
    inside = [instance("i-1"), instance("i-2")]
    inside[0]["Placement"]["GroupName"] = "job-1"
    inside[1]["Placement"]["GroupName"] = ""
    item = {"GroupId": "pg-1", "GroupName": "job-1", "State": "available", "Strategy": "cluster", "Tags": T}
    raw = {ResourceKind.INSTANCE: inside, ResourceKind.PLACEMENT_GROUP: [item]}

    assert _linked(raw)["pg-1"] == "i-1"
    res = to_resource(PLACEMENT_GROUP, item, "r")
    assert (res.state, res.created_at, res.details["GroupName"]) == (ResourceState.AVAILABLE, None, "job-1")
    assert PLACEMENT_GROUP.delete_value(item) == "job-1"  # DeletePlacementGroup takes the name
    assert PLACEMENT_GROUP.delete_params("job-1") == {"GroupName": "job-1"}
    assert PLACEMENT_GROUP.state({**item, "State": "deleting"}) is ResourceState.TERMINATING


class FakeElb:
    """An ELBv2 client's two calls the listing makes (an SDK double), answering ``tags`` by ARN."""

    def __init__(self, arns: list[str], tags: dict[str, list[dict]]) -> None:
        self.arns, self.tags, self.asked = arns, tags, []

    def can_paginate(self, _method: str) -> bool:
        return False

    def describe_target_groups(self) -> dict:
        return {"TargetGroups": [{"TargetGroupArn": a} for a in self.arns]}

    def describe_tags(self, ResourceArns: list[str]) -> dict:  # noqa: N803 (boto3's name)
        self.asked.append(list(ResourceArns))
        return {"TagDescriptions": [{"ResourceArn": a, "Tags": self.tags[a]} for a in ResourceArns if a in self.tags]}


def test_elbv2_items_are_kept_by_their_tags_read_twenty_arns_a_call():
    arns = [f"arn:tg/{i}" for i in range(45)]
    elb = FakeElb(arns, {a: (T if i % 2 else []) for i, a in enumerate(arns)})

    kept = list(describe_tagged_by_arn(elb, TARGET_GROUP, "provider_ref"))

    assert [len(batch) for batch in elb.asked] == [20, 20, 5]
    assert [i["TargetGroupArn"] for i in kept] == arns[1::2] and all(i["Tags"] == T for i in kept)


def test_elbv2_tags_left_out_of_the_answer_fail_the_listing():
    elb = FakeElb(["arn:tg/1", "arn:tg/2"], {"arn:tg/1": T})

    with pytest.raises(ProviderError, match="did not answer for arn:tg/2"):
        list(describe_tagged_by_arn(elb, TARGET_GROUP, "provider_ref"))


def test_load_balancer_states_and_delete_order():
    item = {"LoadBalancerArn": "arn:lb/1", "State": {"Code": "provisioning"}, "Tags": T,
            "CreatedTime": datetime(2024, 5, 1, tzinfo=UTC)}
    res = to_resource(LOAD_BALANCER, item, "r")

    assert (res.state, res.created_at, res.attached_to) == (ResourceState.ACTIVE, datetime(2024, 5, 1, tzinfo=UTC),
                                                            None)
    assert LOAD_BALANCER.state({"State": {"Code": "failed"}}) is ResourceState.AVAILABLE
    assert TARGET_GROUP.depends_on == (ResourceKind.INSTANCE, ResourceKind.LOAD_BALANCER)
    assert LOAD_BALANCER.service == TARGET_GROUP.service == "elbv2"
