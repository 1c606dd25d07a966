"""Safety seams of the AWS deleter that an attacker review found open, on real parts: a real
Postgres ledger, EC2 on the moto server, the in-process runner whose ``confirm`` callback acts
between classification and deletion, and the recording proxy of ``tests/support/aws_proxy.py``
for replies EC2 can send and moto does not (an answer that leaves an id out, a transient
``InvalidInstanceID.NotFound``). Each test failed on the code before its fix (SAFETY.md rules
3, 12 and 15) and asserts the behaviour now."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.plan import Plan
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.ledger_helpers import add_backend
from tests.support.seams import GONE, delete_results, skip_reasons
from tests.support.sqs_harness import AMI, MotoPlatform

pytestmark = pytest.mark.usefixtures("moto_reset")
BACKEND = "aws-prod"
TAG = "provider_ref"
PROTECT = "orphan-cleanup-protect"
# DescribeVolumes answering, without an error, with no volume at all
NO_VOLUMES = (200, [("Content-Type", "text/xml;charset=UTF-8")],
              b'<?xml version="1.0" encoding="UTF-8"?><DescribeVolumesResponse xmlns="http://ec2.amazonaws.com/doc/'
              b'2016-11-15/"><requestId>x</requestId><volumeSet/></DescribeVolumesResponse>')

# DescribeInstances answering InvalidInstanceID.NotFound, as EC2 does for an instance launched moments ago
INSTANCE_NOT_FOUND = (400, [("Content-Type", "text/xml;charset=UTF-8")],
                      b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InvalidInstanceID.NotFound'
                      b"</Code><Message>The instance ID does not exist</Message></Error></Errors><RequestID>x"
                      b"</RequestID></Response>")


@pytest.fixture
def proxy(moto_reset: str) -> Iterator[AwsProxy]:
    with AwsProxy(moto_reset) as p:
        yield p


def delete_cycle(db: Database, endpoint: str, between: Callable[[], None] = lambda: None) -> str:
    """One in-process delete cycle against ``endpoint``; ``between`` runs between classification
    and deletion. Returns the cycle id."""
    def confirm(plan: Plan) -> bool:
        between()
        return True

    settings = Settings.explicit(confirm_seconds=0, margin_seconds=0, aws_endpoint_url=endpoint)
    pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                        delete_queue=InProcessQueue())
    return run_cycle(pipeline, BACKEND, mode="delete", confirm=confirm).cycle_id


def orphan_vm(db: Database, **settings: Any) -> tuple[MotoPlatform, str]:
    """A delete-mode backend with one orphan VM (its placeholder owner row hard-deleted an hour
    ago; the instance and its root volume tagged with the ref). Returns (platform, VM id)."""
    add_backend(db, BACKEND, mode="delete", settings=settings or None)
    platform = MotoPlatform(db, BACKEND)
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    vm, _ = platform.launch(issued.provider_ref, data_volume=False)
    platform.ledger.hard_delete(issued.owner_id)
    platform.age_ledger()
    return platform, vm


def attach(platform: MotoPlatform, vm: str, tags: dict[str, str], *, device: str = "/dev/sdf",
           delete_on_termination: bool) -> str:
    """A volume carrying ``tags`` attached to ``vm`` at ``device``; returns its id."""
    [inst] = platform.ec2.describe_instances(InstanceIds=[vm])["Reservations"][0]["Instances"]
    spec = [{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    vol = platform.ec2.create_volume(AvailabilityZone=inst["Placement"]["AvailabilityZone"], Size=1,
                                     **({"TagSpecifications": spec} if tags else {}))["VolumeId"]
    platform.ec2.attach_volume(VolumeId=vol, InstanceId=vm, Device=device)
    if delete_on_termination:  # EC2 attaches a volume with DeleteOnTermination false unless asked
        platform.ec2.modify_instance_attribute(InstanceId=vm, BlockDeviceMappings=[
            {"DeviceName": device, "Ebs": {"DeleteOnTermination": True}}])
    return vol


def ref_of(platform: MotoPlatform, vm: str) -> str:
    [inst] = platform.ec2.describe_instances(InstanceIds=[vm])["Reservations"][0]["Instances"]
    return next(t["Value"] for t in inst["Tags"] if t["Key"] == TAG)


def only_result(db: Database, cycle_id: str) -> dict[str, Any]:
    [recorded] = delete_results(db, cycle_id)
    return recorded


# ---- F1. a member that lost its ref tag before the terminate ----------------------------------------

def test_a_member_whose_ref_tag_is_removed_before_the_delete_does_not_go_with_the_instance(emptied_db, moto_reset):
    """Setup: an orphan VM with a data volume of its ref attached with DeleteOnTermination; between
    classification and deletion someone removes the volume's ref tag (it is no longer the ref's).
    Shows: TerminateInstances is not called (it would delete the volume): the VM runs, the volume
    exists, and the result names the volume blast_foreign."""
    db = emptied_db
    platform, vm = orphan_vm(db)
    data = attach(platform, vm, {TAG: ref_of(platform, vm)}, delete_on_termination=True)

    cycle_id = delete_cycle(db, moto_reset, lambda: platform.ec2.delete_tags(Resources=[data], Tags=[{"Key": TAG}]))

    assert platform.instance_state(vm) not in GONE
    assert data in platform.all_volumes()
    recorded = only_result(db, cycle_id)
    assert recorded["state"] == "skipped" and skip_reasons(recorded)[data] == "blast_foreign", recorded


# ---- F2. an untagged volume attached later with DeleteOnTermination ---------------------------------

def test_an_untagged_volume_attached_later_with_delete_on_termination_keeps_the_instance(emptied_db, moto_reset):
    """Setup: an orphan VM to which someone attached their own volume (no tags at all) at /dev/sdg
    with DeleteOnTermination true. Shows: only the instance's root volume (its RootDeviceName) may
    go untagged; this one is blast_foreign: the VM is not terminated and the volume exists."""
    db = emptied_db
    platform, vm = orphan_vm(db)
    theirs = attach(platform, vm, {}, device="/dev/sdg", delete_on_termination=True)

    cycle_id = delete_cycle(db, moto_reset)

    assert platform.instance_state(vm) not in GONE
    assert theirs in platform.all_volumes()
    recorded = only_result(db, cycle_id)
    assert recorded["state"] == "skipped" and skip_reasons(recorded)[theirs] == "blast_foreign", recorded


# ---- F4. a member the re-read before the terminate does not answer for -------------------------------

@pytest.mark.parametrize("left_out", ["filtered", "filtered-and-by-id"])
def test_a_member_the_reread_leaves_out_keeps_the_instance(emptied_db, proxy, left_out):
    """Setup: an orphan VM with a data volume of its ref (DeleteOnTermination false: not in the
    terminate's blast); between classification and deletion the volume gets a protect tag, and
    DescribeVolumes leaves it out of its answer (no error): once (the members' filtered re-read),
    or also when asked by its id. Shows: the VM is not terminated: the member asked by id shows its
    protect tag (group_protected), or, never answered, is unreadable (member_unreadable), never
    taken for unprotected or gone."""
    db = emptied_db
    platform, vm = orphan_vm(db)
    data = attach(platform, vm, {TAG: ref_of(platform, vm)}, delete_on_termination=False)

    def between() -> None:
        platform.ec2.create_tags(Resources=[data], Tags=[{"Key": PROTECT, "Value": "yes"}])
        proxy.add_rule(Rule("DescribeVolumes", match=lambda body: data.encode() in body,
                            times=1 if left_out == "filtered" else None, reply=NO_VOLUMES))

    cycle_id = delete_cycle(db, proxy.url, between)

    assert platform.instance_state(vm) not in GONE
    assert "TerminateInstances" not in proxy.actions()
    recorded = only_result(db, cycle_id)
    reasons = skip_reasons(recorded)
    expected = {vm: "group_protected", data: "protected"} if left_out == "filtered" else \
        {vm: "member_unreadable", data: "unreadable"}
    assert recorded["state"] == "skipped" and {k: reasons[k] for k in expected} == expected, recorded


# ---- F11. a transient InvalidInstanceID.NotFound is not "gone" ----------------------------------------

@pytest.mark.parametrize("kind", ["address", "interface"])
def test_a_transient_not_found_never_detaches_a_dependent_from_a_live_instance(emptied_db, proxy, kind):
    """Setup: a leftover Elastic IP (or network interface) of a ref whose owner row was hard-deleted
    an hour ago, no instance of the ref; between classification and deletion someone associates
    it with (attaches it to) their new, untagged instance X, and EC2 answers the next
    DescribeInstances of X with InvalidInstanceID.NotFound (eventual consistency). Shows: nothing
    is disassociated or detached from X, which still runs with it; the dependent is pending
    (the group deleting), never taken for one of a gone instance."""
    db = emptied_db
    add_backend(db, BACKEND, mode="delete")
    platform = MotoPlatform(db, BACKEND)
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    platform.ledger.hard_delete(issued.owner_id)
    platform.age_ledger()
    ec2 = platform.ec2
    tagged = {"Tags": [{"Key": TAG, "Value": issued.provider_ref}]}
    [x] = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t3.micro")["Instances"]
    if kind == "address":
        dep = ec2.allocate_address(Domain="vpc", TagSpecifications=[{"ResourceType": "elastic-ip", **tagged}])[
            "AllocationId"]
    else:
        dep = ec2.create_network_interface(SubnetId=x["SubnetId"], TagSpecifications=[
            {"ResourceType": "network-interface", **tagged}])["NetworkInterface"]["NetworkInterfaceId"]

    def between() -> None:
        if kind == "address":
            ec2.associate_address(AllocationId=dep, InstanceId=x["InstanceId"])
        else:
            ec2.attach_network_interface(NetworkInterfaceId=dep, InstanceId=x["InstanceId"], DeviceIndex=1)
        proxy.add_rule(Rule("DescribeInstances", match=lambda body: x["InstanceId"].encode() in body, times=1,
                            reply=INSTANCE_NOT_FOUND))

    cycle_id = delete_cycle(db, proxy.url, between)

    assert not {"DisassociateAddress", "DetachNetworkInterface", "ReleaseAddress",
                "DeleteNetworkInterface"} & set(proxy.actions()), proxy.actions()
    if kind == "address":
        [address] = ec2.describe_addresses(AllocationIds=[dep])["Addresses"]
        assert address.get("InstanceId") == x["InstanceId"], address
    else:
        [eni] = ec2.describe_network_interfaces(NetworkInterfaceIds=[dep])["NetworkInterfaces"]
        assert eni["Attachment"]["InstanceId"] == x["InstanceId"], eni
    assert platform.instance_state(x["InstanceId"]) == "running"
    recorded = only_result(db, cycle_id)
    if kind == "address":
        assert recorded["state"] == "deleting" and dep in recorded["result"]["pending"], recorded
    else:  # attached since the listing: the interface's time as EC2 reports it now (its attach
        # time) is after the listing, so the deleter leaves it, before any call (SAFETY.md rule 21)
        assert (recorded["state"], recorded["skipped"]) == ("skipped", "owner_changed:recent_resource"), recorded


# ---- F6. a forged listing batch naming a snapshot its retention keeps ---------------------------------

@pytest.mark.parametrize("retain", [None, 7], ids=["retain-unset", "retain-7-days"])
def test_a_forged_batch_never_deletes_a_snapshot_its_retention_keeps(emptied_db, moto_reset, retain):
    """Setup: snapshot_before_delete, retain_snapshots_days unset (keep forever) or 7; a snapshot
    the deleter took of a volume of ref R (the ref and source tags; taken now), that volume gone, and
    a leftover volume of R (an orphan group). The listing batch is altered in the queue (SAFETY.md
    rule 12: a message is only a hint) to add that snapshot to R's group. Shows: the deleter deletes
    the leftover volume but not the snapshot (snapshot_retained), checked on its re-read values."""
    db = emptied_db
    settings: dict[str, Any] = {"snapshot_before_delete": True}
    if retain is not None:
        settings["retain_snapshots_days"] = retain
    add_backend(db, BACKEND, mode="delete", settings=settings)
    platform = MotoPlatform(db, BACKEND)
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    platform.ledger.hard_delete(issued.owner_id)
    platform.age_ledger()
    ref, ec2, region = issued.provider_ref, platform.ec2, platform.region
    taken_of = platform.volume(ref)
    snap = ec2.create_snapshot(VolumeId=taken_of, TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
        {"Key": TAG, "Value": ref}, {"Key": SNAPSHOT_SOURCE_KEY, "Value": taken_of}]}])["SnapshotId"]
    ec2.delete_volume(VolumeId=taken_of)
    leftover = platform.volume(ref)

    pipeline = bootstrap.build_pipeline(Settings.explicit(confirm_seconds=0,
                                                          margin_seconds=0, aws_endpoint_url=moto_reset), db=db,
                                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    cycle_id = pipeline.run_lister(BACKEND, mode="delete", manual=True).cycle_id
    while (body := pipeline.listing_queue.pop()) is not None:
        doc = json.loads(body)
        for group in doc["groups"]:
            if group["provider_ref"] == ref and group["primary_id"] is None:
                group["resources"].append({"kind": "snapshot", "id": snap, "region": region, "state": "available",
                                           "tags": {TAG: ref, SNAPSHOT_SOURCE_KEY: taken_of}})
        pipeline.handle_batch(ListingBatch.model_validate(doc))
    while (body := pipeline.delete_queue.pop()) is not None:
        pipeline.handle_delete(DeleteRequest.model_validate_json(body))

    assert snap in {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert leftover not in platform.all_volumes()
    recorded = only_result(db, cycle_id)
    assert skip_reasons(recorded).get(snap) == "snapshot_retained", recorded
