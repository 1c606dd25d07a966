"""Hostile provider replies fed to the adapters' pure parsing code (hypothesis).

The AWS adapter turns describe items into ``Resource`` with
``aws_resources.to_resource`` and links them with ``aws_resources.link_resources``;
``AwsProvider._list_region`` turns ``KeyError``/``TypeError``/``ValueError``
from that parsing into a failed region (fail closed). The GCP adapter parses
with ``gcp_kinds.to_resource`` and fails a zone on a pydantic
``ValidationError``. Whatever the reply, parsing must end in one of those
outcomes, and a resource never joins a group whose ref it does not carry.
"""

from __future__ import annotations

import string
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import RegionListing, ResourceKind, is_valid_ref
from orphan_cleanup.providers.aws import kinds as aws_kinds
from orphan_cleanup.providers.aws import listing as aws_resources
from orphan_cleanup.providers.aws.provider import AwsProvider
from orphan_cleanup.providers.base import group_resources
from orphan_cleanup.providers.gcp import kinds as gcp_kinds
from orphan_cleanup.providers.gcp import listing as gcp_listing
from orphan_cleanup.providers.gcp.snapshots import facts_of as gcp_snapshot_facts
from orphan_cleanup.providers.snapshots import expired

TAG = "provider_ref"
REFS = st.sampled_from(["abcdefgh1234", "zzzzzzzz9999", "", "ABCDEFGH1234", "short", "abcdefgh12345", "abc def 1234"])
IDS = st.one_of(st.sampled_from(["i-1", "i-2", "vol-1", "eni-1", "sg-1", "eipalloc-1"]), st.text(max_size=8),
                st.integers(), st.none())
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12),
                    st.datetimes(timezones=st.just(UTC)), st.datetimes())
JSONISH = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=3),
                                                   st.dictionaries(st.text(max_size=6), c, max_size=3)),
                       max_leaves=8)
TAGS = st.one_of(
    st.lists(st.fixed_dictionaries({"Key": st.just(TAG), "Value": REFS}), max_size=2),
    st.lists(st.dictionaries(st.sampled_from(["Key", "Value", "key"]), st.one_of(REFS, SCALARS), max_size=2),
             max_size=3),
    JSONISH,
)


@st.composite
def describe_item(draw: Any, spec: aws_kinds.AwsKind) -> dict[str, Any]:
    """A describe item of ``spec``: plausible keys with hostile values, some missing, some extra."""
    item: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        item[spec.id_field] = draw(IDS)
    if draw(st.booleans()):
        item[spec.tags_field] = draw(TAGS)
    for key in ("State", "Status", "LaunchTime", "CreateTime", "Attachment", "Attachments", "InstanceId",
                "NetworkInterfaceId", "AssociationId", "SecurityGroups", "Groups", "AllocationId"):
        if draw(st.integers(0, 3)) == 0:
            item[key] = draw(st.one_of(JSONISH, IDS, st.lists(st.dictionaries(
                st.sampled_from(["GroupId", "InstanceId", "Name", "AttachTime"]), IDS, max_size=2), max_size=2)))
    return item


REPLY = st.fixed_dictionaries({spec.kind: st.lists(describe_item(spec), max_size=3) for spec in aws_kinds.KINDS})


class FakeEc2:
    """The boto3 EC2 client's describe calls, answering hostile pages (an SDK
    double: the adapter under test is the real ``AwsProvider``)."""

    def __init__(self, raw: dict[ResourceKind, list[dict[str, Any]]]) -> None:
        self.raw = raw

    def can_paginate(self, _method: str) -> bool:
        return False

    def __getattr__(self, method: str) -> Any:
        if method == "describe_tags":  # ELBv2: the tags of each ARN asked for, hostile too
            items = [i for k in aws_kinds.KINDS if k.tags_by_arn for i in self.raw[k.kind]]
            return lambda ResourceArns, **_kw: {"TagDescriptions": [
                {"ResourceArn": arn, "Tags": next((i.get("Tags") for i in items if i.get(  # noqa: B023
                    "LoadBalancerArn", i.get("TargetGroupArn")) == arn), [])} for arn in ResourceArns]}
        spec = next(k for k in aws_kinds.KINDS if k.describe == method)
        items = self.raw[spec.kind]
        if spec.items_path == ("Reservations", "Instances"):
            return lambda **_kw: {"Reservations": [{"Instances": items}]}
        return lambda **_kw: {spec.items_path[0]: items}


def list_region(raw: dict[ResourceKind, list[dict[str, Any]]]) -> list[RegionListing]:
    backend = Backend(id="aws-prod", provider="aws", account="123456789012", regions=("us-east-1",))
    return list(AwsProvider(backend, lambda _service, _region: FakeEc2(raw)).iter_listing())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=REPLY)
def test_an_aws_reply_of_any_shape_lists_groups_or_fails_the_region(
        raw: dict[ResourceKind, list[dict[str, Any]]]) -> None:
    # when the adapter lists a region whose describe calls answer anything at all
    [region] = list_region(raw)

    # then the region failed (skipped, unsettled), or every group is well formed
    for group in region.groups:
        assert is_valid_ref(group.provider_ref) != group.malformed_ref  # a bad value is marked, never passed on
        for res in group.resources:
            assert res.tags.get(TAG) == group.provider_ref, "a resource joined a group whose ref it does not carry"
            assert res.id and res.region == group.region
        if group.primary_id is not None:
            assert group.primary is not None and group.primary.kind is ResourceKind.INSTANCE


def test_a_malformed_security_group_entry_fails_the_region_not_the_listing() -> None:
    """An instance naming a security group without ``GroupId`` (found by the test above)."""
    raw: dict[ResourceKind, list[dict[str, Any]]] = {spec.kind: [] for spec in aws_kinds.KINDS}
    raw[ResourceKind.INSTANCE] = [{"InstanceId": "i-1", "State": {"Name": "running"},
                                   "Tags": [{"Key": TAG, "Value": "abcdefgh1234"}],
                                   "SecurityGroups": [{"GroupName": "default"}]}]

    [region] = list_region(raw)

    assert region.failure is not None and "unexpected describe reply" in region.failure


LABELS = st.dictionaries(st.sampled_from([TAG, "other", "", "orphan-cleanup-protect"]), REFS, max_size=3)


@st.composite
def gcp_item(draw: Any) -> SimpleNamespace:
    """A Compute item as the client returns it: typed fields, hostile values."""
    return SimpleNamespace(
        id=draw(st.one_of(st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.text(max_size=5))),
        name=draw(st.text(max_size=10)),
        labels=draw(LABELS),
        status=draw(st.one_of(st.sampled_from(["RUNNING", "STOPPING", "TERMINATED", "READY", "IN_USE", "DELETING"]),
                              st.text(max_size=6))),
        creation_timestamp=draw(st.one_of(st.just(""), st.text(max_size=30),
                                          st.datetimes().map(lambda d: d.isoformat()))),
        self_link=draw(st.text(alphabet=string.ascii_lowercase + "/:.", max_size=40)),
        users=draw(st.lists(st.text(max_size=40), max_size=2)),
    )


@settings(max_examples=300, deadline=None)
@given(spec=st.sampled_from(gcp_kinds.KINDS), items=st.lists(gcp_item(), min_size=1, max_size=4))
def test_a_gcp_item_of_any_content_parses_or_fails_its_zone(spec: gcp_kinds.GcpKind,
                                                            items: list[SimpleNamespace]) -> None:
    instance_ids = {gcp_kinds.link_key(i.self_link): str(i.id) for i in items}
    parsed = []
    for item in items:
        try:
            parsed.append(gcp_listing.to_resource(spec, "us-central1-a", item, instance_ids))
        except ValidationError:
            continue  # the adapter fails that zone: skipped and unsettled
    for group in group_resources(parsed, TAG):
        assert all(r.tags.get(TAG) == group.provider_ref for r in group.resources)
        assert all(isinstance(r.created_at, (datetime, type(None))) for r in group.resources)


# ---- SAFETY.md rule 14: controller and protection fields of any shape fail closed -------

NS = SimpleNamespace
MIG_LINK = "projects/p/zones/us-central1-a/instanceGroupManagers/web"


def gcp_instance(**fields: Any) -> SimpleNamespace:
    base = dict(id=4100000000000000001, name="vm", labels={TAG: "abcdefgh1234"}, status="RUNNING",
                creation_timestamp="2026-01-01T00:00:00+00:00", self_link="projects/p/zones/z/instances/vm", users=[])
    return SimpleNamespace(**{**base, **fields})


def listed(item: SimpleNamespace) -> Any:
    return gcp_listing.to_resource(gcp_kinds.KINDS[0], "us-central1-a", item, {})


@pytest.mark.parametrize("metadata", [
    NS(items={"key": "created-by", "value": MIG_LINK}),  # items not a list
    NS(items="created-by"),
    NS(items=7),
    NS(items=[NS(key="created-by", value=None)]),  # created-by not a string
    NS(items=[NS(key="created-by", value=["x"])]),
    NS(items=[NS(key=None, value=MIG_LINK)]),  # an item without a key: it may be created-by
    NS(items=[NS(key="created-by", value="projects/p/zones/z/instanceTemplates/t")]),  # names no group
    NS(items=[NS(key="ssh-keys", value="k"), NS(key="created-by", value=MIG_LINK)]),
    NS(items=[NS(key="created-by", value=f"https://www.googleapis.com/compute/v1/{MIG_LINK}")]),
], ids=["items-dict", "items-str", "items-int", "value-none", "value-list", "key-none", "not-a-mig", "mig",
        "mig-url"])
def test_a_created_by_of_any_shape_names_a_controller(metadata: Any) -> None:
    res = listed(gcp_instance(metadata=metadata))
    assert res.controller is not None  # protected / managed_by_controller, never an orphan


@pytest.mark.parametrize("metadata", [None, NS(), NS(items=None), NS(items=[]),
                                      NS(items=[NS(key="ssh-keys", value=None)])],
                         ids=["none", "no-items", "items-none", "items-empty", "other-key"])
def test_no_created_by_names_no_controller(metadata: Any) -> None:
    assert listed(gcp_instance(metadata=metadata)).controller is None


@pytest.mark.parametrize("value", [True, "yes", "false", 1, 0, [], {"x": 1}])
def test_a_deletion_protection_that_is_not_false_protects(value: Any) -> None:
    assert listed(gcp_instance(deletion_protection=value)).protection == "deletion_protection"


@pytest.mark.parametrize("fields", [{}, {"deletion_protection": False}, {"deletion_protection": None}],
                         ids=["missing", "false", "none"])
def test_a_missing_or_false_deletion_protection_does_not(fields: dict[str, Any]) -> None:
    assert listed(gcp_instance(**fields)).protection is None


@pytest.mark.parametrize("value", ["web-asg", "", " "])
def test_an_aws_controller_tag_of_any_value_names_a_controller(value: str) -> None:
    item = {"InstanceId": "i-1", "State": {"Name": "running"},
            "Tags": [{"Key": TAG, "Value": "abcdefgh1234"}, {"Key": "eks:nodegroup-name", "Value": value}]}
    res = aws_resources.to_resource(aws_kinds.INSTANCE, item, "us-east-1")
    assert res.controller is not None and res.controller.startswith("eks-nodegroup:")


def test_an_aws_controller_key_not_configured_is_not_a_controller() -> None:
    item = {"InstanceId": "i-1", "Tags": [{"Key": "aws:autoscaling:groupName", "Value": "web"}]}
    assert aws_resources.to_resource(aws_kinds.INSTANCE, item, "us-east-1", controller_keys=()).controller is None
    assert aws_resources.to_resource(aws_kinds.INSTANCE, item, "us-east-1").controller == "asg:web"


# ---- issue #15 item 4: a snapshot's placing and age, of any shape, fail closed -----------

ODD = st.one_of(st.none(), st.integers(), st.text(max_size=60), st.lists(st.text(max_size=5), max_size=2),
                st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
                st.sampled_from(["projects/p/zones/us-central1-a/disks/d", "2020-01-01T00:00:00+00:00",
                                 "2020-01-01T00:00:00"]))


@settings(max_examples=200, deadline=None)
@given(source=ODD, created=ODD)
def test_a_snapshot_of_any_shape_is_placed_in_a_zone_or_kept(source: Any, created: Any) -> None:
    item = SimpleNamespace(source_disk=source, creation_timestamp=created)
    zone = gcp_kinds.source_zone(item)
    assert zone is None or (isinstance(source, str) and f"/zones/{zone}/disks/" in f"/{source}")
    old = expired(gcp_snapshot_facts(item).created_at, retain_days=1, now=datetime(2030, 1, 1, tzinfo=UTC))
    assert old is (created == "2020-01-01T00:00:00+00:00")  # only a readable, aware, old time expires
    assert expired(gcp_snapshot_facts(SimpleNamespace()).created_at, retain_days=1,
                   now=datetime(2030, 1, 1, tzinfo=UTC)) is False
