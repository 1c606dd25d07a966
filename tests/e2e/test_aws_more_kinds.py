"""The EC2 kinds an instance names, end to end on real parts: a real Postgres ledger, EC2 on the
moto server (in this process, over HTTP), the in-process runner (``delete_cycle``). Each kind is
listed with its own describe filtered on the ref tag key, joins the group of the one instance of
its ref that names it (``AwsKind.named_by``), is classified with that group (tracked with a
tracked VM, orphan with an orphan one, a primary-less leftover when no listed instance names it),
and is deleted after the instance (``depends_on``), by its id, journaled; what its delete would
reach outside the group leaves it alone (SAFETY.md rule 15).

Launch templates. EC2 tags an instance launched from a template ``aws:ec2launchtemplate:id`` (moto
5.2 does too): that is how an instance names its template. Deleting a template deletes its
versions, which are part of it; an instance launched from it keeps running, so nothing outside the
group goes with it. Moto answers ``DescribeLaunchTemplates`` of an id that is gone with an empty
list where EC2 answers ``InvalidLaunchTemplateId.NotFound``: the deleter then reads it as
unreadable (never gone), which no test here reaches.

Key pairs. An instance names its key pair by name (``KeyName``); the deleter deletes by the id
(``DeleteKeyPair(KeyPairId=...)``). Moto 5.2.5 ignores ``KeyPairId`` (it deletes nothing and
answers every key pair to ``DescribeKeyPairs(KeyPairIds=...)``): the tests' moto server answers
those two calls as EC2 documents (``orphan_cleanup.demo.moto_gaps``, filled in for the session). Deleting a
key pair takes only EC2's copy of the public key: an instance launched with it keeps running.

Placement groups. Moto 5.2.5 has none (its EC2 raises ``NotImplementedError`` for every
placement-group call, ignores ``Placement.GroupName`` and has no ``placement-group-name`` filter):
the tests' moto server has them filled in as EC2 documents them (``orphan_cleanup.demo.moto_gaps``,
the same for the demo's moto), so what is tested here is the product against that minimal model of
EC2's placement groups, not against moto's own. An instance names its group by name
(``Placement.GroupName``); ``DeletePlacementGroup`` takes the name, so the deleter reads the group by
id, checks right before the call that the name still names that id, and never asks while an
instance outside the group is in it (``in_use``).

ELBv2 load balancers and target groups (moto's elbv2, which has them). Their describes have no tag
filter: the listing describes them all and reads their tags with ``DescribeTags``, 20 ARNs a call.
No listing call ties them to an instance, so a ref's load balancers and target groups are a
primary-less group of that ref: protected while its owner lives (``unattached_of_live_owner``),
deleted once it is gone, the load balancer before the target group. Deleting a load balancer
deletes its listeners: one forwarding to a target group outside the group blocks it
(``blast_foreign``); a target group with a target outside the group registered is ``in_use``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.client import aws_tag_specifications
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.e2e.test_seams_attack_aws import delete_cycle
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.ledger_helpers import add_backend
from tests.support.seams import GONE, delete_results, query, skip_reasons
from tests.support.sqs_harness import AMI, MotoPlatform

pytestmark = pytest.mark.usefixtures("moto_reset")
BACKEND = "aws-prod"
TAG = "provider_ref"
PROTECT = "orphan-cleanup-protect"


# ---- helpers ---------------------------------------------------------------------------------------

def platform_of(db: Database) -> MotoPlatform:
    add_backend(db, BACKEND, mode="delete")
    return MotoPlatform(db, BACKEND)


def tagged(kind: str, ref: str | None, *, protect: bool = False) -> list[dict[str, Any]]:
    tags = ([{"Key": TAG, "Value": ref}] if ref else []) + ([{"Key": PROTECT, "Value": "yes"}] if protect else [])
    return [{"ResourceType": kind, "Tags": tags}] if tags else []


def template(platform: MotoPlatform, name: str, ref: str | None, *, protect: bool = False) -> str:
    spec = tagged("launch-template", ref, protect=protect)
    reply = platform.ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={"ImageId": AMI},
                                                **({"TagSpecifications": spec} if spec else {}))
    return str(reply["LaunchTemplate"]["LaunchTemplateId"])


def vm(platform: MotoPlatform, ref: str | None, **launch: Any) -> str:
    """An instance (and its root volume) carrying ``ref`` (none: someone else's), launched with ``launch``."""
    specs = aws_tag_specifications(ref, resource_types=("instance", "volume")) if ref else []
    [inst] = platform.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, TagSpecifications=specs,
                                        **launch)["Instances"]
    return str(inst["InstanceId"])


def orphan(platform: MotoPlatform) -> str:
    """A ref whose placeholder owner row was hard-deleted (aged past the margin by the caller)."""
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    platform.ledger.hard_delete(issued.owner_id)
    return issued.provider_ref


def report_groups(db: Database, endpoint: str) -> dict[str, dict[str, Any]]:
    """One report cycle; each group's members (id -> kind) with its verdict and reason, by group key."""
    settings = Settings.explicit(confirm_seconds=0, margin_seconds=0, aws_endpoint_url=endpoint)
    pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                        delete_queue=InProcessQueue())
    doc = run_cycle(pipeline, BACKEND, mode="report").c3()
    return {f"{g['provider_ref']}/{g['primary_id']}": {"members": {r["id"]: r["kind"] for r in g["resources"]},
                                                      "verdict": g["verdict"], "reason": g["reason"]}
            for g in doc["groups"]}


def group_of(groups: dict[str, dict[str, Any]], member: str) -> dict[str, Any]:
    [group] = [g for g in groups.values() if member in g["members"]]
    return group


def intents(db: Database) -> list[tuple[str, str]]:
    """Every journaled intent, in order: (call, target)."""
    return [(c, t) for c, t in query(db, "SELECT call, target FROM provider_journal WHERE phase = 'intent'"
                                         " ORDER BY id")]


def templates(platform: MotoPlatform) -> set[str]:
    return {t["LaunchTemplateId"] for t in platform.ec2.describe_launch_templates()["LaunchTemplates"]}


# ---- launch templates ---------------------------------------------------------------------------------

def test_a_launch_template_is_listed_in_the_group_of_the_vm_launched_from_it(emptied_db, moto_reset):
    """Given a tracked VM and an orphan VM, each launched from its own ref-tagged template, and a
    leftover template of an orphan ref; when a report cycle lists them; then each VM's template is
    in its group (tracked with the tracked VM, orphan with the orphan), the leftover is a
    primary-less orphan group, and someone's untagged template is not listed."""
    db = emptied_db
    platform = platform_of(db)
    live = platform.ledger.issue_ref(owner_name="live")
    live_lt = template(platform, "live", live.provider_ref)
    live_vm = vm(platform, live.provider_ref, LaunchTemplate={"LaunchTemplateId": live_lt})
    platform.ledger.mark_provisioning(live.owner_id, backend_id=BACKEND, primary_id=live_vm,
                                      region=platform.region, status=OwnerStatus.BUSY)
    lost = orphan(platform)
    lost_lt = template(platform, "lost", lost)
    lost_vm = vm(platform, lost, LaunchTemplate={"LaunchTemplateId": lost_lt})
    left = orphan(platform)
    left_lt = template(platform, "left", left)
    foreign_lt = template(platform, "foreign", None)
    platform.age_ledger()

    groups = report_groups(db, moto_reset)

    assert group_of(groups, live_lt)["members"].items() >= {live_vm: "instance", live_lt: "launch-template"}.items()
    assert group_of(groups, live_lt)["verdict"] == "tracked"
    assert group_of(groups, lost_lt)["members"].items() >= {lost_vm: "instance", lost_lt: "launch-template"}.items()
    assert group_of(groups, lost_lt)["verdict"] == "orphan"
    assert group_of(groups, left_lt) == {"members": {left_lt: "launch-template"}, "verdict": "orphan",
                                         "reason": "owner_deleted"}
    assert not [g for g in groups.values() if foreign_lt in g["members"]]


def test_an_orphan_vms_launch_template_is_deleted_after_the_vm(emptied_db, moto_reset):
    """Given an orphan VM launched from its ref's template, a tracked VM with its own, and an
    instance of someone else launched from the orphan's template; when a delete cycle runs; then
    the orphan VM is terminated, its template left ``in_use`` (an instance outside the group was
    launched from it: SAFETY.md rule 21), the tracked VM and its template untouched; once that
    instance is gone, the next delete cycle deletes the template (journaled, by id), after the VM."""
    db = emptied_db
    platform = platform_of(db)
    kept = platform.tracked(data_volume=False)
    kept_lt = template(platform, "kept", kept.ref)
    ref = orphan(platform)
    lt = template(platform, "lost", ref)
    lost_vm = vm(platform, ref, LaunchTemplate={"LaunchTemplateId": lt})
    bystander = vm(platform, None, LaunchTemplate={"LaunchTemplateId": lt})
    platform.age_ledger()

    first = delete_cycle(db, moto_reset)

    assert platform.instance_state(lost_vm) in GONE and platform.instance_state(bystander) == "running"
    assert lt in templates(platform) and ("ec2:DeleteLaunchTemplate", lt) not in intents(db)
    assert any(skip_reasons(r).get(lt) == "in_use" for r in delete_results(db, first))
    assert outcome(db, first) == "unsettled"
    platform.ec2.terminate_instances(InstanceIds=[bystander])
    delete_cycle(db, moto_reset)

    assert lt not in templates(platform)
    assert kept_lt in templates(platform) and platform.instance_state(kept.instance_id or "") == "running"
    calls = intents(db)
    assert calls.index(("ec2:TerminateInstances", lost_vm)) < calls.index(("ec2:DeleteLaunchTemplate", lt))
    assert {t for _, t in calls} <= {lost_vm, lt, *platform.volumes_of(ref)}


def test_a_leftover_launch_template_of_an_orphan_ref_is_deleted(emptied_db, moto_reset):
    """Given a template of an orphan ref that no listed instance names; when a delete cycle runs;
    then it is deleted, and the group recorded deleted."""
    db = emptied_db
    platform = platform_of(db)
    lt = template(platform, "left", orphan(platform))
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert lt not in templates(platform)
    [recorded] = delete_results(db, cycle_id)
    assert recorded["result"]["status"] == "deleted" and recorded["result"]["deleted"] == [lt], recorded


def test_a_protect_tag_on_the_launch_template_keeps_the_whole_group(emptied_db, moto_reset):
    """Given an orphan VM launched from its ref's template that also carries the protect tag; when a
    delete cycle runs; then nothing is deleted: the protect tag on any member protects the group."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    lt = template(platform, "lost", ref, protect=True)
    lost_vm = vm(platform, ref, LaunchTemplate={"LaunchTemplateId": lt})
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert platform.instance_state(lost_vm) == "running" and lt in templates(platform)
    assert not intents(db)
    for recorded in delete_results(db, cycle_id):  # (the classifier protects it before any request)
        assert skip_reasons(recorded).get(lt) in (None, "protected"), recorded


# ---- key pairs ------------------------------------------------------------------------------------------

def key_pair(platform: MotoPlatform, name: str, ref: str | None, *, protect: bool = False) -> str:
    spec = tagged("key-pair", ref, protect=protect)
    return str(platform.ec2.create_key_pair(KeyName=name, **({"TagSpecifications": spec} if spec else {}))
               ["KeyPairId"])


def key_pairs(platform: MotoPlatform) -> set[str]:
    return {k["KeyPairId"] for k in platform.ec2.describe_key_pairs()["KeyPairs"]}


def test_a_key_pair_is_listed_in_the_group_of_the_one_vm_of_its_ref_using_it(emptied_db, moto_reset):
    """Given a tracked VM and an orphan VM, each launched with its ref's key pair, two orphan VMs of
    one ref sharing one key pair, and someone's untagged key pair; when a report cycle lists them;
    then each VM's key pair is in its group, the shared one is a primary-less group of its ref (no
    VM's deletion takes it), and the untagged one is not listed."""
    db = emptied_db
    platform = platform_of(db)
    live = platform.ledger.issue_ref(owner_name="live")
    live_kp = key_pair(platform, "live", live.provider_ref)
    live_vm = vm(platform, live.provider_ref, KeyName="live")
    platform.ledger.mark_provisioning(live.owner_id, backend_id=BACKEND, primary_id=live_vm,
                                      region=platform.region, status=OwnerStatus.BUSY)
    lost = orphan(platform)
    lost_kp = key_pair(platform, "lost", lost)
    lost_vm = vm(platform, lost, KeyName="lost")
    twins = orphan(platform)
    shared_kp = key_pair(platform, "shared", twins)
    vm(platform, twins, KeyName="shared")
    vm(platform, twins, KeyName="shared")
    foreign_kp = key_pair(platform, "foreign", None)
    platform.age_ledger()

    groups = report_groups(db, moto_reset)

    assert group_of(groups, live_kp)["members"].items() >= {live_vm: "instance", live_kp: "key-pair"}.items()
    assert group_of(groups, live_kp)["verdict"] == "tracked"
    assert group_of(groups, lost_kp)["members"].items() >= {lost_vm: "instance", lost_kp: "key-pair"}.items()
    assert group_of(groups, lost_kp)["verdict"] == "orphan"
    assert group_of(groups, shared_kp) == {"members": {shared_kp: "key-pair"}, "verdict": "orphan",
                                           "reason": "owner_deleted"}
    assert not [g for g in groups.values() if foreign_kp in g["members"]]


def test_an_orphan_vms_key_pair_is_deleted_by_id_after_the_vm(emptied_db, moto_reset):
    """Given an orphan VM launched with its ref's key pair, a tracked VM with its own, and someone's
    untagged instance launched with the orphan's key pair; when a delete cycle runs; then the VM is
    terminated and its key pair left ``in_use`` (an instance outside the group names it: SAFETY.md
    rule 21); once that instance is gone, the next cycle deletes the key pair, by id (journaled),
    after the VM; the tracked VM's key pair stays."""
    db = emptied_db
    platform = platform_of(db)
    kept = platform.tracked(data_volume=False)
    kept_kp = key_pair(platform, "kept", kept.ref)
    ref = orphan(platform)
    kp = key_pair(platform, "lost", ref)
    lost_vm = vm(platform, ref, KeyName="lost")
    bystander = vm(platform, None, KeyName="lost")
    platform.age_ledger()

    first = delete_cycle(db, moto_reset)

    assert platform.instance_state(lost_vm) in GONE and platform.instance_state(bystander) == "running"
    assert kp in key_pairs(platform) and ("ec2:DeleteKeyPair", kp) not in intents(db)
    assert any(skip_reasons(r).get(kp) == "in_use" for r in delete_results(db, first))
    platform.ec2.terminate_instances(InstanceIds=[bystander])
    delete_cycle(db, moto_reset)

    assert kp not in key_pairs(platform) and kept_kp in key_pairs(platform)
    calls = intents(db)
    assert calls.index(("ec2:TerminateInstances", lost_vm)) < calls.index(("ec2:DeleteKeyPair", kp))
    assert {t for _, t in calls} <= {lost_vm, kp, *platform.volumes_of(ref)}


def test_a_key_pair_whose_name_was_taken_by_another_is_not_deleted(emptied_db, moto_reset):
    """Given a leftover key pair of an orphan ref that is deleted, after the listing, and re-created
    under the same name by someone else (another id, no ref); when the deleter runs; then the new key
    pair survives: the deleter reads and deletes by the listed id, never by the name."""
    db = emptied_db
    platform = platform_of(db)
    old = key_pair(platform, "reused", orphan(platform))
    platform.age_ledger()
    new: list[str] = []

    def reuse_the_name() -> None:
        platform.ec2.delete_key_pair(KeyName="reused")
        new.append(key_pair(platform, "reused", None, protect=True))

    cycle_id = delete_cycle(db, moto_reset, reuse_the_name)

    assert new and new[0] != old and new[0] in key_pairs(platform)
    assert ("ec2:DeleteKeyPair", new[0]) not in intents(db)
    [recorded] = delete_results(db, cycle_id)
    assert old in recorded["result"]["deleted"]  # gone by its id: done


def test_a_protect_tag_on_the_key_pair_keeps_the_whole_group(emptied_db, moto_reset):
    """Given an orphan VM launched with its ref's key pair that also carries the protect tag; when a
    delete cycle runs; then nothing is deleted."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    kp = key_pair(platform, "lost", ref, protect=True)
    lost_vm = vm(platform, ref, KeyName="lost")
    platform.age_ledger()

    delete_cycle(db, moto_reset)

    assert platform.instance_state(lost_vm) == "running" and kp in key_pairs(platform)
    assert not intents(db)


# ---- placement groups ------------------------------------------------------------------------------------

def placement_group(platform: MotoPlatform, name: str, ref: str | None, *, protect: bool = False) -> str:
    spec = tagged("placement-group", ref, protect=protect)
    platform.ec2.create_placement_group(GroupName=name, Strategy="cluster",
                                        **({"TagSpecifications": spec} if spec else {}))
    [group] = platform.ec2.describe_placement_groups(GroupNames=[name])["PlacementGroups"]
    return str(group["GroupId"])


def placement_groups(platform: MotoPlatform) -> set[str]:
    return {g["GroupId"] for g in platform.ec2.describe_placement_groups()["PlacementGroups"]}


def outcome(db: Database, cycle_id: str) -> str:
    [[value]] = query(db, "SELECT outcome FROM cycles WHERE id = :c", c=cycle_id)
    return str(value)


def test_a_placement_group_is_listed_in_the_group_of_the_vm_in_it(emptied_db, moto_reset):
    """Given a tracked VM and an orphan VM, each in its ref's placement group, a leftover placement
    group of an orphan ref, and someone's untagged one; when a report cycle lists them; then each
    VM's placement group is in its group, the leftover is a primary-less orphan group, and the
    untagged one is not listed."""
    db = emptied_db
    platform = platform_of(db)
    live = platform.ledger.issue_ref(owner_name="live")
    live_pg = placement_group(platform, "live", live.provider_ref)
    live_vm = vm(platform, live.provider_ref, Placement={"GroupName": "live"})
    platform.ledger.mark_provisioning(live.owner_id, backend_id=BACKEND, primary_id=live_vm,
                                      region=platform.region, status=OwnerStatus.BUSY)
    lost = orphan(platform)
    lost_pg = placement_group(platform, "lost", lost)
    lost_vm = vm(platform, lost, Placement={"GroupName": "lost"})
    left_pg = placement_group(platform, "left", orphan(platform))
    foreign_pg = placement_group(platform, "foreign", None)
    platform.age_ledger()

    groups = report_groups(db, moto_reset)

    assert group_of(groups, live_pg)["members"].items() >= {live_vm: "instance", live_pg: "placement-group"}.items()
    assert group_of(groups, live_pg)["verdict"] == "tracked"
    assert group_of(groups, lost_pg)["members"].items() >= {lost_vm: "instance", lost_pg: "placement-group"}.items()
    assert group_of(groups, lost_pg)["verdict"] == "orphan"
    assert group_of(groups, left_pg) == {"members": {left_pg: "placement-group"}, "verdict": "orphan",
                                         "reason": "owner_deleted"}
    assert not [g for g in groups.values() if foreign_pg in g["members"]]


def test_an_orphan_vms_placement_group_is_deleted_after_the_vm(emptied_db, moto_reset):
    """Given an orphan VM in its ref's placement group and a tracked VM in its own; when a delete
    cycle runs; then the orphan VM is terminated first and its placement group deleted after it
    (journaled under its id), and the tracked VM's group stays."""
    db = emptied_db
    platform = platform_of(db)
    kept = platform.tracked(data_volume=False)
    kept_pg = placement_group(platform, "kept", kept.ref)
    ref = orphan(platform)
    pg = placement_group(platform, "lost", ref)
    lost_vm = vm(platform, ref, Placement={"GroupName": "lost"})
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert platform.instance_state(lost_vm) in GONE
    assert pg not in placement_groups(platform) and kept_pg in placement_groups(platform)
    calls = intents(db)
    assert calls.index(("ec2:TerminateInstances", lost_vm)) < calls.index(("ec2:DeletePlacementGroup", pg))
    assert outcome(db, cycle_id) == "clean"


@pytest.mark.parametrize("with_vm", [True, False], ids=["vm-group", "leftover"])
def test_a_placement_group_with_an_instance_outside_the_group_in_it_is_left_in_use(emptied_db, moto_reset,
                                                                                   with_vm):
    """Given an orphan ref's placement group (with the orphan VM in it, or a leftover) that also
    holds someone's untagged running instance; when a delete cycle runs; then the placement group
    is not deleted (no DeletePlacementGroup is even asked), it is named ``in_use``, someone's
    instance runs on, and the cycle is unsettled, never failed; the orphan VM itself goes."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    pg = placement_group(platform, "shared", ref)
    lost_vm = vm(platform, ref, Placement={"GroupName": "shared"}) if with_vm else None
    bystander = vm(platform, None, Placement={"GroupName": "shared"})
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert pg in placement_groups(platform)
    assert platform.instance_state(bystander) == "running"
    assert ("ec2:DeletePlacementGroup", pg) not in intents(db)
    if lost_vm is not None:
        assert platform.instance_state(lost_vm) in GONE
    [recorded] = delete_results(db, cycle_id)
    assert skip_reasons(recorded)[pg] == "in_use", recorded
    assert outcome(db, cycle_id) == "unsettled"


def test_a_placement_group_name_taken_by_another_group_before_the_call_is_not_deleted(emptied_db, moto_reset):
    """Given a leftover placement group of an orphan ref; when a delete cycle runs and, after the
    deleter read it by id and while its check for instances inside is held at the proxy, the group
    is deleted and someone creates another under the same name (another id, no ref); then the
    deleter does not call DeletePlacementGroup (the name no longer names the id it read): the new
    group survives, and the old one is recorded as left (``replaced``), not deleted by name."""
    db = emptied_db
    platform = platform_of(db)
    old = placement_group(platform, "reused", orphan(platform))
    platform.age_ledger()
    new: list[str] = []
    with AwsProxy(moto_reset) as proxy:
        held = proxy.add_rule(Rule("DescribeInstances", match=lambda body: b"placement-group-name" in body,
                                   times=1, hold=True))

        def reuse_the_name() -> None:
            try:
                assert held.arrived.wait(30), "no check for instances inside was sent"
                platform.ec2.delete_placement_group(GroupName="reused")
                new.append(placement_group(platform, "reused", None))
            finally:
                held.release()

        meanwhile = threading.Thread(target=reuse_the_name)
        meanwhile.start()
        try:
            cycle_id = delete_cycle(db, proxy.url)
        finally:
            held.release()
            meanwhile.join(30)

    assert new and new[0] != old and new[0] in placement_groups(platform)
    assert not [c for c in intents(db) if c[0] == "ec2:DeletePlacementGroup"]
    [recorded] = delete_results(db, cycle_id)
    assert skip_reasons(recorded)[old] == "replaced", recorded
    assert outcome(db, cycle_id) == "unsettled"


def test_a_protect_tag_on_the_placement_group_keeps_the_whole_group(emptied_db, moto_reset):
    """Given an orphan VM in its ref's placement group that also carries the protect tag; when a
    delete cycle runs; then nothing is deleted."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    pg = placement_group(platform, "lost", ref, protect=True)
    lost_vm = vm(platform, ref, Placement={"GroupName": "lost"})
    platform.age_ledger()

    delete_cycle(db, moto_reset)

    assert platform.instance_state(lost_vm) == "running" and pg in placement_groups(platform)
    assert not intents(db)


# ---- ELBv2 load balancers and target groups ---------------------------------------------------------------

def elbv2() -> Any:
    import boto3

    return boto3.client("elbv2", region_name="us-east-1")


def subnets(platform: MotoPlatform) -> tuple[str, list[str]]:
    """The default VPC and two of its subnets (moto creates them)."""
    found = platform.ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return str(found[0]["VpcId"]), [str(s["SubnetId"]) for s in found[:2]]


def elb_tags(ref: str | None) -> dict[str, Any]:
    return {"Tags": [{"Key": TAG, "Value": ref}]} if ref else {}


def load_balancer(platform: MotoPlatform, name: str, ref: str | None, *, forward_to: str | None = None) -> str:
    _, nets = subnets(platform)
    arn = str(elbv2().create_load_balancer(Name=name, Subnets=nets, **elb_tags(ref))["LoadBalancers"][0]
              ["LoadBalancerArn"])
    if forward_to:
        elbv2().create_listener(LoadBalancerArn=arn, Protocol="HTTP", Port=80,
                                DefaultActions=[{"Type": "forward", "TargetGroupArn": forward_to}])
    return arn


def target_group(platform: MotoPlatform, name: str, ref: str | None, *, targets: tuple[str, ...] = ()) -> str:
    vpc, _ = subnets(platform)
    arn = str(elbv2().create_target_group(Name=name, Protocol="HTTP", Port=80, VpcId=vpc, **elb_tags(ref))
              ["TargetGroups"][0]["TargetGroupArn"])
    if targets:
        elbv2().register_targets(TargetGroupArn=arn, Targets=[{"Id": t} for t in targets])
    return arn


def balancers() -> set[str]:
    return {b["LoadBalancerArn"] for b in elbv2().describe_load_balancers()["LoadBalancers"]}


def target_groups() -> set[str]:
    return {g["TargetGroupArn"] for g in elbv2().describe_target_groups()["TargetGroups"]}


def test_a_refs_load_balancer_and_target_group_are_listed_as_its_leftovers(emptied_db, moto_reset):
    """Given an orphan ref's load balancer forwarding to its target group, a live owner's own pair,
    and someone's untagged load balancer; when a report cycle lists them; then the orphan ref's pair
    is one primary-less orphan group, the live owner's pair is protected (no listing ties it to the
    owner's instance), and the untagged load balancer is not listed."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    tg = target_group(platform, "lost-tg", ref)
    lb = load_balancer(platform, "lost-lb", ref, forward_to=tg)
    live = platform.tracked(data_volume=False)
    live_tg = target_group(platform, "live-tg", live.ref, targets=(live.instance_id or "",))
    live_lb = load_balancer(platform, "live-lb", live.ref, forward_to=live_tg)
    foreign = load_balancer(platform, "foreign-lb", None)
    platform.age_ledger()

    groups = report_groups(db, moto_reset)

    assert group_of(groups, lb) == {"members": {lb: "load-balancer", tg: "target-group"}, "verdict": "orphan",
                                    "reason": "owner_deleted"}
    assert group_of(groups, live_lb) == {"members": {live_lb: "load-balancer", live_tg: "target-group"},
                                         "verdict": "protected", "reason": "unattached_of_live_owner"}
    assert not [g for g in groups.values() if foreign in g["members"]]


def test_an_orphan_load_balancer_goes_before_its_target_group(emptied_db, moto_reset):
    """Given an orphan ref's load balancer whose listener forwards to the ref's target group; when a
    delete cycle runs; then the load balancer is deleted first, its listener named in the journaled
    intent as what the call takes along, the target group after it (both journaled by ARN), and
    the cycle is clean."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    tg = target_group(platform, "lost-tg", ref)
    lb = load_balancer(platform, "lost-lb", ref, forward_to=tg)
    listeners = [x["ListenerArn"] for x in elbv2().describe_listeners(LoadBalancerArn=lb)["Listeners"]]
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert lb not in balancers() and tg not in target_groups()
    calls = intents(db)
    assert calls.index(("elasticloadbalancing:DeleteLoadBalancer", lb)) \
        < calls.index(("elasticloadbalancing:DeleteTargetGroup", tg))
    assert outcome(db, cycle_id) == "clean"
    # what DeleteLoadBalancer takes along, its listener, is journaled as the call's blast (rule 19)
    [[blast]] = query(db, "SELECT blast::text FROM provider_journal WHERE phase = 'intent' AND target = :t", t=lb)
    assert json.loads(blast) == listeners and len(listeners) == 1


def test_a_load_balancer_forwarding_to_a_target_group_outside_the_group_is_not_deleted(emptied_db, moto_reset):
    """Given an orphan ref's load balancer whose listener forwards to someone's untagged target
    group; when a delete cycle runs; then the load balancer is not deleted (its listener, which its
    delete would take, serves a target group outside the group): skipped ``blast_foreign``, the
    cycle unsettled, someone's target group and the listener intact."""
    db = emptied_db
    platform = platform_of(db)
    foreign_tg = target_group(platform, "their-tg", None)
    lb = load_balancer(platform, "lost-lb", orphan(platform), forward_to=foreign_tg)
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert lb in balancers() and foreign_tg in target_groups()
    assert elbv2().describe_listeners(LoadBalancerArn=lb)["Listeners"]
    assert not [c for c in intents(db) if c[0].startswith("elasticloadbalancing:")]
    [recorded] = delete_results(db, cycle_id)
    assert skip_reasons(recorded)[lb] == "blast_foreign", recorded
    assert outcome(db, cycle_id) == "unsettled"


def test_a_target_group_with_a_target_outside_the_group_is_left_in_use(emptied_db, moto_reset):
    """Given an orphan ref's target group in which someone's running (untagged) instance is
    registered; when a delete cycle runs; then the target group is not deleted: skipped ``in_use``,
    the cycle unsettled, never failed, the instance running and still registered."""
    db = emptied_db
    platform = platform_of(db)
    bystander = vm(platform, None)
    tg = target_group(platform, "lost-tg", orphan(platform), targets=(bystander,))
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert tg in target_groups() and platform.instance_state(bystander) == "running"
    assert ("elasticloadbalancing:DeleteTargetGroup", tg) not in intents(db)
    [recorded] = delete_results(db, cycle_id)
    assert skip_reasons(recorded)[tg] == "in_use", recorded
    assert outcome(db, cycle_id) == "unsettled"


def test_a_load_balancer_with_deletion_protection_is_left(emptied_db, moto_reset):
    """Given an orphan ref's load balancer with deletion protection on; when a delete cycle runs; then
    it is not deleted (no call is made), it is named ``deletion_protection``, the cycle unsettled."""
    db = emptied_db
    platform = platform_of(db)
    lb = load_balancer(platform, "kept-lb", orphan(platform))
    elbv2().modify_load_balancer_attributes(LoadBalancerArn=lb, Attributes=[
        {"Key": "deletion_protection.enabled", "Value": "true"}])
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert lb in balancers()
    assert not [c for c in intents(db) if c[0].startswith("elasticloadbalancing:")]
    [recorded] = delete_results(db, cycle_id)
    assert skip_reasons(recorded)[lb] == "deletion_protection", recorded


def test_elbv2_tags_are_read_twenty_arns_a_call(emptied_db, moto_reset):
    """Given 25 target groups of an orphan ref and 5 of someone else (30 in all); when a report cycle
    lists the region through a counting proxy; then one DescribeTargetGroups page lists them all and
    their tags take 2 DescribeTags calls (20 ARNs a call, the API's maximum); the 25 are one group."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    ours = {target_group(platform, f"ours-{i}", ref) for i in range(25)}
    for i in range(5):
        target_group(platform, f"theirs-{i}", None)
    platform.age_ledger()

    with AwsProxy(moto_reset) as proxy:
        groups = report_groups(db, proxy.url)
        counts = proxy.action_counts()

    assert counts["DescribeTargetGroups"] == 1 and counts["DescribeLoadBalancers"] == 1
    assert counts["DescribeTags"] == 2
    assert set(group_of(groups, next(iter(ours)))["members"]) == ours


def test_a_rule_forwarding_to_a_target_group_outside_the_group_blocks_the_load_balancer(emptied_db, moto_reset):
    """Given an orphan ref's load balancer whose default action forwards to the ref's target group
    but one of whose rules forwards (a weighted ``ForwardConfig``) to someone's target group too;
    when a delete cycle runs; then neither the load balancer nor, after it, its target group is
    deleted: the load balancer is skipped ``blast_foreign``."""
    db = emptied_db
    platform = platform_of(db)
    ref = orphan(platform)
    tg = target_group(platform, "lost-tg", ref)
    theirs = target_group(platform, "their-tg", None)
    lb = load_balancer(platform, "lost-lb", ref, forward_to=tg)
    [listener] = elbv2().describe_listeners(LoadBalancerArn=lb)["Listeners"]
    elbv2().create_rule(ListenerArn=listener["ListenerArn"], Priority=10,
                        Conditions=[{"Field": "path-pattern", "Values": ["/theirs/*"]}],
                        Actions=[{"Type": "forward", "ForwardConfig": {"TargetGroups": [
                            {"TargetGroupArn": tg, "Weight": 1}, {"TargetGroupArn": theirs, "Weight": 1}]}}])
    platform.age_ledger()

    cycle_id = delete_cycle(db, moto_reset)

    assert {lb} <= balancers() and {tg, theirs} <= target_groups()
    assert not [c for c in intents(db) if c[0].startswith("elasticloadbalancing:")]
    [recorded] = delete_results(db, cycle_id)
    assert skip_reasons(recorded)[lb] == "blast_foreign", recorded
    assert tg in recorded["result"]["pending"]


# ---- gateway owners: the load balancer after the VM ----------------------------------------------------

def gateway(platform: MotoPlatform, *, protect: bool = False) -> tuple[str, str]:
    """A gateway owner (``owner_type`` ``gateway``: an instances row) whose termination gave up: the
    owner is terminated, its VM still runs. Returns (ref, VM id)."""
    issued = platform.ledger.issue_ref(owner_name="gateway", owner_type="gateway")
    iid, _ = platform.launch(issued.provider_ref, protect=protect, data_volume=False)
    platform.ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=iid, region=platform.region,
                                      status=OwnerStatus.BUSY)
    platform.ledger.mark_terminated(issued.owner_id)
    return issued.provider_ref, iid


def test_a_gateways_load_balancer_is_deleted_only_after_its_vm(emptied_db, moto_reset):
    """Given a gateway owner that ended with its VM still running, registered in the gateway's
    target group behind its load balancer (all three carrying its ref); when delete cycles run until
    one is clean; then the VM, the load balancer and the target group are gone, and the VM's
    termination was called before the load balancer's delete (a load balancer goes only once the
    targets it serves are gone or terminating)."""
    db = emptied_db
    platform = platform_of(db)
    ref, iid = gateway(platform)
    tg = target_group(platform, "gw-tg", ref, targets=(iid,))
    lb = load_balancer(platform, "gw-lb", ref, forward_to=tg)
    platform.age_ledger()

    groups = report_groups(db, moto_reset)
    assert group_of(groups, iid)["verdict"] == "orphan" and group_of(groups, lb)["verdict"] == "orphan"
    for _ in range(3):
        if outcome(db, delete_cycle(db, moto_reset)) == "clean":
            break

    assert platform.instance_state(iid) in ("shutting-down", "terminated")
    assert lb not in balancers() and tg not in target_groups()
    calls = intents(db)
    assert calls.index(("ec2:TerminateInstances", iid)) < calls.index(("elasticloadbalancing:DeleteLoadBalancer", lb))


def test_a_gateways_load_balancer_is_never_deleted_while_its_protected_vm_runs(emptied_db, moto_reset):
    """Given an ended gateway owner whose VM carries the protect tag (kept by its operator) and is
    registered behind the gateway's load balancer; when delete cycles run; then the VM runs, and the
    load balancer and its target group are left (``in_use``: a target it serves still runs), the
    cycles unsettled, never failed."""
    db = emptied_db
    platform = platform_of(db)
    ref, iid = gateway(platform, protect=True)
    tg = target_group(platform, "gw-tg", ref, targets=(iid,))
    lb = load_balancer(platform, "gw-lb", ref, forward_to=tg)
    platform.age_ledger()

    cycles = [delete_cycle(db, moto_reset) for _ in range(2)]

    assert platform.instance_state(iid) == "running"
    assert lb in balancers() and tg in target_groups()
    assert not [c for c in intents(db) if c[0].startswith("elasticloadbalancing:Delete")]
    recorded = delete_results(db, cycles[-1])
    assert any(skip_reasons(r).get(lb) == "in_use" for r in recorded), recorded
    assert [outcome(db, c) for c in cycles] == ["unsettled", "unsettled"]
