"""The pure rules of the one deletion algorithm (``providers.deletion``), table-driven: what
may go with an owner's delete call (``blast_problem``, SAFETY.md rule 15), which device came
with its owner (``attached_at_launch``), the order the dependents go in (``delete_order``)
and the listed shapes the deleter refuses before any call (``targets_of``, rule 21)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from graphlib import CycleError

import pytest

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.providers.aws.kinds import BY_KIND as AWS_KINDS
from orphan_cleanup.providers.deletion import blast_problem, targets_of
from orphan_cleanup.providers.gcp.kinds import KIND_BY_RESOURCE as GCP_KINDS
from orphan_cleanup.providers.operations import AT_LAUNCH, Target, attached_at_launch, delete_order

REF = "abcdefabcdef"
OTHER = "bbbbbbbbbbbb"
KEY = "provider_ref"
PROTECT = frozenset({"orphan-cleanup-protect", "keep-me"})

# ---- blast_problem: every branch --------------------------------------------------------------

OURS = {KEY: REF}
THEIRS = {KEY: OTHER}


@pytest.mark.parametrize(("tags", "member", "own_device", "problem"), [
    # a protect tag blocks, whatever else is true (any of the protect keys, any value)
    ({**OURS, "orphan-cleanup-protect": ""}, True, False, "blast_protected"),
    ({**OURS, "keep-me": "yes"}, False, True, "blast_protected"),
    ({"orphan-cleanup-protect": "x"}, False, True, "blast_protected"),
    ({**THEIRS, "keep-me": ""}, False, False, "blast_protected"),
    # no ref tag key: only the owner's own device, not a member, goes along
    ({}, False, True, None),
    ({"Name": "root"}, False, True, None),
    ({}, False, False, "blast_foreign"),  # attached later by someone
    ({}, True, True, "blast_foreign"),  # a member that lost its ref
    ({}, True, False, "blast_foreign"),
    # another ref's, or the ref key with an empty value: never, member or own device or not
    (THEIRS, True, False, "blast_foreign"),
    (THEIRS, False, True, "blast_foreign"),
    (THEIRS, False, False, "blast_foreign"),
    ({KEY: ""}, False, True, "blast_foreign"),
    ({KEY: REF.upper()}, True, False, "blast_foreign"),
    # the group's ref: a member goes; a non-member is this ref's but unlisted, even its own device
    (OURS, True, False, None),
    (OURS, True, True, None),
    (OURS, False, False, "blast_unlisted"),
    (OURS, False, True, "blast_unlisted"),
])
def test_blast_problem(tags: dict[str, str], member: bool, own_device: bool, problem: str | None) -> None:
    assert blast_problem(tags, member=member, ref=REF, tag_key=KEY, protect_keys=PROTECT,
                         own_device=own_device) == problem


def test_blast_problem_reads_only_the_keys_it_is_given() -> None:
    # a tag named like a protect key of another backend is not one here
    assert blast_problem({**OURS, "other-protect": ""}, member=True, ref=REF, tag_key=KEY,
                         protect_keys=frozenset({"orphan-cleanup-protect"}), own_device=False) is None
    assert blast_problem({"orphan-cleanup-protect": ""}, member=False, ref=REF, tag_key=KEY,
                         protect_keys=frozenset(), own_device=True) is None


# ---- attached_at_launch ------------------------------------------------------------------------

LAUNCH = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.mark.parametrize(("attached", "launched", "at_launch"), [
    (LAUNCH, LAUNCH, True),
    (LAUNCH + 3 * SECOND, LAUNCH, True),
    (LAUNCH - 3 * SECOND, LAUNCH, True),  # either side: a boot disk is created just before its VM
    (LAUNCH + AT_LAUNCH, LAUNCH, True),
    (LAUNCH - AT_LAUNCH, LAUNCH, True),
    (LAUNCH + AT_LAUNCH + SECOND, LAUNCH, False),  # a root swapped in later
    (LAUNCH - AT_LAUNCH - SECOND, LAUNCH, False),  # a disk made long before, attached as root
    (LAUNCH + timedelta(days=30), LAUNCH, False),
    # the same instant in another zone is the same time
    (LAUNCH.astimezone(timezone(timedelta(hours=-5))), LAUNCH, True),
    (LAUNCH, LAUNCH.astimezone(timezone(timedelta(hours=9))) + AT_LAUNCH + SECOND, False),
    # what cannot be read is not attached at launch (fail closed)
    (None, LAUNCH, False),
    (LAUNCH, None, False),
    (None, None, False),
    (LAUNCH.replace(tzinfo=None), LAUNCH, False),
    (LAUNCH, LAUNCH.replace(tzinfo=None), False),
    (LAUNCH.replace(tzinfo=None), LAUNCH.replace(tzinfo=None), False),
], ids=["same", "3s-after", "3s-before", "at-limit-after", "at-limit-before", "past-limit-after",
        "past-limit-before", "a-month-later", "other-zone-same-instant", "other-zone-past-limit",
        "no-attach-time", "no-launch-time", "no-times", "naive-attach-time", "naive-launch-time", "both-naive"])
def test_attached_at_launch(attached: datetime | None, launched: datetime | None, at_launch: bool) -> None:
    assert attached_at_launch(attached, launched) is at_launch


def test_at_launch_is_minutes_not_hours() -> None:
    assert timedelta(seconds=30) < AT_LAUNCH <= timedelta(minutes=5)


# ---- delete_order ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    kind: ResourceKind
    depends_on: tuple[ResourceKind, ...] = ()


K = ResourceKind


@pytest.mark.parametrize("rows", [
    [Row(K.INSTANCE)],
    [Row(K.VOLUME, (K.INSTANCE,)), Row(K.INSTANCE)],
    [Row(K.SECURITY_GROUP, (K.INSTANCE, K.NETWORK_INTERFACE)), Row(K.NETWORK_INTERFACE, (K.INSTANCE, K.ADDRESS)),
     Row(K.ADDRESS, (K.INSTANCE,)), Row(K.INSTANCE)],
    [Row(K.SNAPSHOT, (K.INSTANCE, K.DISK)), Row(K.DISK, (K.INSTANCE,)), Row(K.ADDRESS, (K.INSTANCE,)),
     Row(K.INSTANCE)],
    list(AWS_KINDS.values()),
    list(GCP_KINDS.values()),
], ids=["one", "two-reversed", "chain", "gcp-like", "aws-table", "gcp-table"])
def test_delete_order_puts_every_kind_after_what_it_depends_on(rows: list[Row]) -> None:
    order = delete_order(rows)
    assert sorted(order) == sorted(r.kind for r in rows)  # each kind once, none added
    for row in rows:
        assert all(order.index(dep) < order.index(row.kind) for dep in row.depends_on), (row, order)


@pytest.mark.parametrize("table", [AWS_KINDS, GCP_KINDS], ids=["aws", "gcp"])
def test_every_kind_a_table_depends_on_has_its_own_row(table) -> None:
    # the dependents' pass looks each ordered kind up in the table: one named only in a
    # depends_on would have no row to look up
    assert {dep for row in table.values() for dep in row.depends_on} <= set(table)
    assert all(kind is row.kind for kind, row in table.items())


def test_a_dependency_cycle_is_refused() -> None:
    with pytest.raises(CycleError):
        delete_order([Row(K.VOLUME, (K.DISK,)), Row(K.DISK, (K.VOLUME,))])


# ---- targets_of: what the deleter takes from a listed group, and the shapes it refuses ----------

REGION = "us-east-1"


def res(kind: ResourceKind, rid: str, region: str = REGION, **extra) -> Resource:
    return Resource(kind=kind, id=rid, region=region, tags={KEY: REF}, **extra)


def grp(*resources: Resource, primary: str | None = "i-1") -> ResourceGroup:
    return ResourceGroup(provider_ref=REF, region=REGION, primary_id=primary, resources=resources)


AWS = list(AWS_KINDS)


def test_targets_of_takes_kind_id_and_place_only() -> None:
    # listed details, attachments, states and tags are not taken (rule 21)
    group = grp(res(K.INSTANCE, "i-1", details={"name": "x"}, attached_to="i-9", controller="asg:a"),
                res(K.VOLUME, "vol-1", state=ResourceState.TERMINATING), res(K.ADDRESS, "eipalloc-1"))
    assert targets_of(group, AWS) == {"i-1": Target(K.INSTANCE, "i-1", REGION),
                                      "vol-1": Target(K.VOLUME, "vol-1", REGION),
                                      "eipalloc-1": Target(K.ADDRESS, "eipalloc-1", REGION)}


def test_targets_of_a_leftover_group_without_a_primary() -> None:
    assert list(targets_of(grp(res(K.VOLUME, "vol-1"), primary=None), AWS)) == ["vol-1"]


def test_targets_of_a_volume_owners_group_whose_primary_is_its_volume() -> None:
    assert list(targets_of(grp(res(K.VOLUME, "vol-1"), primary="vol-1"), AWS)) == ["vol-1"]
    assert list(targets_of(grp(res(K.DISK, "7"), primary="7"), list(GCP_KINDS))) == ["7"]


@pytest.mark.parametrize(("group", "kinds", "problem"), [
    (grp(res(K.INSTANCE, "i-1"), res(K.DISK, "7")), AWS, "disk 7: not a kind this cloud lists"),
    (grp(res(K.INSTANCE, "1"), res(K.VOLUME, "vol-1"), primary="1"), list(GCP_KINDS),
     "volume vol-1: not a kind this cloud lists"),
    (grp(res(K.INSTANCE, "i-1"), res(K.INSTANCE, "i-2")), AWS, "instance i-2 is not the primary"),
    (grp(res(K.INSTANCE, "i-2"), res(K.VOLUME, "vol-1"), primary=None), AWS, "instance i-2 is not the primary"),
    (grp(res(K.VOLUME, "vol-1")), AWS, "primary i-1 is not an instance of the group"),
    (grp(res(K.ADDRESS, "i-1")), AWS, "primary i-1 is not an instance of the group"),
    # a volume is a primary only as a volume owner's group has it: alone (README, C1)
    (grp(res(K.VOLUME, "i-1"), res(K.NETWORK_INTERFACE, "eni-1")), AWS, "primary i-1 is not an instance of the group"),
    (grp(res(K.INSTANCE, "i-1"), res(K.VOLUME, "vol-1"), res(K.VOLUME, "vol-1")), AWS, "duplicate ids"),
    (grp(res(K.INSTANCE, "i-1"), res(K.INSTANCE, "i-1")), AWS, "duplicate ids"),
    (grp(res(K.INSTANCE, "i-1"), res(K.VOLUME, "i-1")), AWS, "duplicate ids"),
], ids=["aws-disk", "gcp-volume", "second-instance", "instance-without-primary", "primary-not-listed",
        "primary-not-an-instance", "volume-primary-not-alone", "duplicate-member", "duplicate-instance", "same-id-two-kinds"])
def test_targets_of_refuses_a_shape_no_listing_produces(group: ResourceGroup, kinds, problem: str) -> None:
    with pytest.raises(ProviderError, match=f"refusing group {group.key}: .*{problem}") as err:
        targets_of(group, kinds)
    assert err.value.region == REGION


def test_targets_of_names_every_problem() -> None:
    group = grp(res(K.VOLUME, "i-1"), res(K.DISK, "7"), res(K.DISK, "7"))
    with pytest.raises(ProviderError) as err:
        targets_of(group, AWS)
    message = str(err.value)
    assert "not a kind this cloud lists" in message and "primary i-1 is not an instance" in message
    assert "duplicate ids" in message
