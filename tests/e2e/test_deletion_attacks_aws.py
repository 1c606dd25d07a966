"""Attacks on the AWS deleter, written before the rewrite of deletion as one algorithm for both
clouds (it acts on ids alone, SAFETY.md rule 21, and takes an instance's root volume
for its own only when that volume was attached at launch). Real parts: a real Postgres ledger,
EC2 on the moto server (in this process, over HTTP), the in-process runner, and the recording
proxy of ``tests/support/aws_proxy.py`` for what moto does not do. A, A2, D and E failed on the
code before the fix (the foreign volume deleted by TerminateInstances; the in-use snapshot
failing every cycle; the volume held by another instance left pending, unnamed); the others
held before and must keep holding.

A. **Root swap.** A stopped orphan VM whose root volume someone detached, and whose root device
   (``RootDeviceName``, ``/dev/sda1`` on moto) now holds their own untagged volume with
   ``DeleteOnTermination`` on. The deleter takes whatever sits at ``RootDeviceName`` for the
   instance's own root, so ``TerminateInstances`` deletes the foreign volume. The variant after
   a start: EC2 moves ``LaunchTime`` to the start, so a swap shortly before a start is not
   told from the launch by ``LaunchTime``; the primary interface's attach time (device index 0
   cannot be detached) still dates the launch. Controls: an honest stopped VM's root volume,
   attached at launch, goes with it, also once the VM was restarted (its ``LaunchTime`` later
   than its root's ``AttachTime``).

   Time: moto stamps ``LaunchTime``, the root mapping's ``Ebs.AttachTime`` and the primary
   interface's ``Attachment.AttachTime`` with ``utcnow()`` at ``RunInstances`` (all three the
   same second), and a later ``AttachVolume`` with the time of that call. To make the launch
   look an hour old, moto's clock is set back an hour while the instance is launched only
   (``moto_clock_behind``: ``utcnow`` as ``moto.ec2.models.instances`` and
   ``moto.ec2.models.elastic_block_store`` imported it, which are where those stamps are
   taken; ``moto.core.utils.utcnow`` itself is not patched, since those modules hold their own
   reference). The launch is then dated by moto itself, the same in every reply. Moto never
   moves ``LaunchTime`` on a start, so where a test needs a restarted instance the proxy
   rewrites ``launchTime`` in ``DescribeInstances`` replies to the start's time (the one field
   moto does not update).
B. **Forged listing, every field but ids** (the twin of the GCP attack where a forged
   ``self_link`` made the deleter take a protected disk). An orphan VM with a data volume of
   its ref, plus someone's ``precious`` volume (protect tag, no ref) attached with
   ``DeleteOnTermination``. The listing batch is forged in the queue, one field of the VM's
   group at a time (details, ``attached_to``, ``created_at``, ``state``, ``tags``), and once by
   listing the precious volume as a member. Whatever the forgery, the precious volume survives
   and no call names anything outside the group; a group the forgery makes undeletable may be
   skipped (terminating this VM would take the precious volume: it is never terminated).
C. **A name reused during the window.** A primary-less orphan group of two tagged volumes; while
   the first ``DeleteVolume`` is held at the proxy, the second volume is deleted and a new one
   is created with its ``Name``, the ref tag and the protect tag. AWS acts on ids: the new
   volume survives and no journal intent names it.
D. **Snapshot in use.** A snapshot the deleter took (ref and source tags), past
   ``retain_snapshots_days`` (the proxy ages ``StartTime``: ``test_seams_aws.aged_snapshots``), from
   which someone registered an AMI. Moto's ``RegisterImage`` does not link the snapshot to
   the image (it answers ``InvalidSnapshot.InUse`` only for snapshots ``CreateImage`` made),
   so the proxy answers ``DeleteSnapshot`` of that snapshot as EC2 does. The error must not
   fail the group and the cycle every cycle: the snapshot is skipped ``in_use`` and the
   cycles are unsettled, the backend never held failed.
E. **A volume in use by a foreign instance.** A tagged volume of a primary-less orphan group
   attached to someone's running, untagged instance: it survives, is skipped ``in_use``, and
   the cycle is unsettled, never failed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import boto3
import moto.ec2.models.elastic_block_store as moto_ebs
import moto.ec2.models.instances as moto_instances
import pytest
from moto.core.utils import utcnow as moto_utcnow

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.e2e.test_seams_attack_aws import attach, delete_cycle, only_result, orphan_vm, ref_of
from tests.e2e.test_seams_aws import aged_snapshots
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.ledger_helpers import add_backend
from tests.support.seams import GONE, query, skip_reasons
from tests.support.sqs_harness import AMI, REGION, MotoPlatform

pytestmark = pytest.mark.usefixtures("moto_reset")
BACKEND = "aws-prod"
TAG = "provider_ref"
PROTECT = "orphan-cleanup-protect"
LAUNCHED_AGO = timedelta(hours=1)


@pytest.fixture
def proxy(moto_reset: str) -> Iterator[AwsProxy]:
    with AwsProxy(moto_reset) as p:
        yield p


# ---- helpers ---------------------------------------------------------------------------------------

@contextmanager
def moto_clock_behind(by: timedelta) -> Iterator[None]:
    """While the block runs, moto's EC2 stamps its launch and attach times ``by`` earlier (module
    docstring, A: moto runs in this process)."""
    def earlier() -> datetime:
        return moto_utcnow() - by

    with mock.patch.object(moto_instances, "utcnow", earlier), mock.patch.object(moto_ebs, "utcnow", earlier):
        yield


def orphan_ref(db: Database, **settings: Any) -> tuple[MotoPlatform, str]:
    """A delete-mode backend and a ref whose placeholder owner row was hard-deleted two hours ago."""
    add_backend(db, BACKEND, mode="delete", settings=settings or None)
    platform = MotoPlatform(db, BACKEND)
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    platform.ledger.hard_delete(issued.owner_id)
    platform.age_ledger(2 * 3600)
    return platform, issued.provider_ref


def stopped_orphan_vm(db: Database) -> tuple[MotoPlatform, str]:
    """An orphan VM launched an hour ago (moto's clock), only the instance tagged with the ref (its
    root volume, attached at launch with DeleteOnTermination, is untagged), now stopped."""
    platform, ref = orphan_ref(db)
    with moto_clock_behind(LAUNCHED_AGO):
        [inst] = platform.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": TAG, "Value": ref}]}])["Instances"]
    platform.ec2.stop_instances(InstanceIds=[inst["InstanceId"]])
    return platform, inst["InstanceId"]


def ec2_via(proxy: AwsProxy) -> Any:
    """An EC2 client whose calls go through the proxy (they see its rewrites)."""
    return boto3.client("ec2", region_name=REGION, endpoint_url=proxy.url)


def described(ec2: Any, vm: str) -> dict[str, Any]:
    [inst] = ec2.describe_instances(InstanceIds=[vm])["Reservations"][0]["Instances"]
    return inst


def root_mapping(inst: dict[str, Any]) -> dict[str, Any]:
    [mapping] = [b for b in inst["BlockDeviceMappings"] if b["DeviceName"] == inst["RootDeviceName"]]
    return mapping


def primary_eni_attached(inst: dict[str, Any]) -> datetime:
    [eni] = [n for n in inst["NetworkInterfaces"] if n["Attachment"]["DeviceIndex"] == 0]
    return eni["Attachment"]["AttachTime"]


def swap_root(platform: MotoPlatform, vm: str) -> tuple[str, str]:
    """Detach the stopped VM's root volume and attach someone's untagged volume at its
    ``RootDeviceName`` with DeleteOnTermination turned on. Returns (old root, foreign volume)."""
    inst = described(platform.ec2, vm)
    device, old_root = inst["RootDeviceName"], root_mapping(inst)["Ebs"]["VolumeId"]
    platform.ec2.detach_volume(VolumeId=old_root, InstanceId=vm)
    foreign = platform.ec2.create_volume(AvailabilityZone=inst["Placement"]["AvailabilityZone"], Size=8)["VolumeId"]
    platform.ec2.attach_volume(VolumeId=foreign, InstanceId=vm, Device=device)
    platform.ec2.modify_instance_attribute(InstanceId=vm, BlockDeviceMappings=[
        {"DeviceName": device, "Ebs": {"DeleteOnTermination": True, "VolumeId": foreign}}])
    return old_root, foreign


def launched_at(when: datetime) -> Callable[[bytes], bytes]:
    """A DescribeInstances reply naming ``when`` as the launch time, as EC2 does once a stopped
    instance was started again (moto keeps the first launch's)."""
    stamp = b"<launchTime>" + when.strftime("%Y-%m-%dT%H:%M:%S.000Z").encode() + b"</launchTime>"
    return lambda body: re.sub(rb"<launchTime>[^<]+</launchTime>", stamp, body)


def restarted(platform: MotoPlatform, proxy: AwsProxy, vm: str) -> datetime:
    """Start the stopped VM; from now on the proxy answers its LaunchTime as the start's."""
    platform.ec2.start_instances(InstanceIds=[vm])
    started = datetime.now(UTC).replace(microsecond=0)
    proxy.add_rule(Rule("DescribeInstances", rewrite=launched_at(started)))
    return started


def outcome(db: Database, cycle_id: str) -> str:
    [[value]] = query(db, "SELECT outcome FROM cycles WHERE id = :c", c=cycle_id)
    return str(value)


def journal_names(db: Database) -> set[str]:
    """Every id a journaled intent named: its target and what it said would go with it."""
    rows = query(db, "SELECT target, blast::text FROM provider_journal WHERE phase = 'intent'")
    return {target for target, _ in rows} | {i for _, blast in rows for i in json.loads(blast)}


# ---- A. root swap -------------------------------------------------------------------------------------

def test_control_an_honest_stopped_vm_goes_with_its_root_volume_attached_at_launch(emptied_db, moto_reset):
    """Given a stopped orphan VM launched an hour ago whose untagged root volume was attached at
    launch (DeleteOnTermination true); when a delete cycle runs; then the VM is terminated and its
    root volume goes with it (named in the terminate's journaled blast)."""
    db = emptied_db
    platform, vm = stopped_orphan_vm(db)
    inst = described(platform.ec2, vm)
    root = root_mapping(inst)
    assert root["Ebs"]["DeleteOnTermination"] is True
    # what moto reports: the launch, the root's attach and the primary interface's attach, one second
    assert root["Ebs"]["AttachTime"] == inst["LaunchTime"] == primary_eni_attached(inst)
    assert datetime.now(UTC) - inst["LaunchTime"] > LAUNCHED_AGO - timedelta(minutes=1)

    cycle_id = delete_cycle(db, moto_reset)

    assert platform.instance_state(vm) in GONE
    assert root["Ebs"]["VolumeId"] not in platform.all_volumes()
    assert root["Ebs"]["VolumeId"] in journal_names(db)
    recorded = only_result(db, cycle_id)
    assert recorded["result"]["status"] in ("deleting", "deleted"), recorded


def test_control_a_restarted_vm_still_goes_with_its_root_volume(emptied_db, proxy):
    """Given an honest orphan VM launched an hour ago, stopped and started again now: EC2 answers
    its LaunchTime as the start's, while its root volume's and primary interface's attach times
    stay at the launch; when a delete cycle runs; then its root volume is still its own: the VM is
    terminated and the root volume goes with it."""
    db = emptied_db
    platform, vm = stopped_orphan_vm(db)
    root = root_mapping(described(platform.ec2, vm))["Ebs"]["VolumeId"]
    started = restarted(platform, proxy, vm)
    inst = described(ec2_via(proxy), vm)
    assert inst["LaunchTime"] == started and started - primary_eni_attached(inst) > LAUNCHED_AGO - timedelta(minutes=1)
    assert root_mapping(inst)["Ebs"]["AttachTime"] == primary_eni_attached(inst)

    cycle_id = delete_cycle(db, proxy.url)

    assert platform.instance_state(vm) in GONE
    assert root not in platform.all_volumes()
    recorded = only_result(db, cycle_id)
    assert recorded["result"]["status"] in ("deleting", "deleted"), recorded


def test_a_foreign_volume_swapped_in_at_the_root_device_does_not_go_with_the_instance(emptied_db, moto_reset):
    """Given a stopped orphan VM launched an hour ago whose root volume was detached now, and someone's
    untagged volume attached at its RootDeviceName with DeleteOnTermination on; when a delete cycle
    runs; then the foreign volume is not the instance's own root (attached an hour after the launch):
    the VM is not terminated, both volumes exist, and the group is skipped naming it blast_foreign."""
    db = emptied_db
    platform, vm = stopped_orphan_vm(db)
    old_root, foreign = swap_root(platform, vm)
    inst = described(platform.ec2, vm)
    assert root_mapping(inst)["Ebs"]["VolumeId"] == foreign
    assert root_mapping(inst)["Ebs"]["AttachTime"] - primary_eni_attached(inst) > LAUNCHED_AGO - timedelta(minutes=1)

    cycle_id = delete_cycle(db, moto_reset)

    assert foreign in platform.all_volumes(), "the foreign volume was deleted with the instance"
    assert platform.instance_state(vm) not in GONE
    assert old_root in platform.all_volumes()
    recorded = only_result(db, cycle_id)
    assert recorded["state"] == "skipped" and skip_reasons(recorded).get(foreign) == "blast_foreign", recorded
    assert outcome(db, cycle_id) == "unsettled"


def test_a_root_swap_followed_by_a_start_is_still_foreign(emptied_db, proxy):
    """Given a stopped orphan VM launched an hour ago whose root volume was swapped for someone's
    untagged volume (DeleteOnTermination on), then started at once: EC2's LaunchTime is now the
    start's, seconds after the swap; when a delete cycle runs; then the launch is the primary
    interface's attach time (an hour before the swap): the foreign volume is blast_foreign, the VM
    is not terminated and the volume exists."""
    db = emptied_db
    platform, vm = stopped_orphan_vm(db)
    _, foreign = swap_root(platform, vm)
    started = restarted(platform, proxy, vm)
    inst = described(ec2_via(proxy), vm)
    assert abs(root_mapping(inst)["Ebs"]["AttachTime"] - inst["LaunchTime"]) < timedelta(minutes=1)
    assert started - primary_eni_attached(inst) > LAUNCHED_AGO - timedelta(minutes=1)

    cycle_id = delete_cycle(db, proxy.url)

    assert foreign in platform.all_volumes(), "the foreign volume was deleted with the instance"
    assert platform.instance_state(vm) not in GONE
    recorded = only_result(db, cycle_id)
    assert recorded["state"] == "skipped" and skip_reasons(recorded).get(foreign) == "blast_foreign", recorded


# ---- B. a forged listing batch, every field but ids ---------------------------------------------------

@dataclass(frozen=True)
class Scene:
    ref: str
    vm: str
    data: str
    precious: str
    bystander: str


def _edit(group: ResourceGroup, rid: str, change: Callable[[Resource], dict[str, Any]]) -> ResourceGroup:
    return group.model_copy(update={"resources": tuple(
        r.model_copy(update=change(r)) if r.id == rid else r for r in group.resources)})


def _precious_as_member(group: ResourceGroup, s: Scene) -> ResourceGroup:
    member = Resource(kind=ResourceKind.VOLUME, id=s.precious, region=group.region, tags={TAG: s.ref},
                      attached_to=s.vm, details={"state": "in-use", "Size": 1})
    return group.model_copy(update={"resources": (*group.resources, member)})


TWO_DAYS = timedelta(days=2)
FORGERIES: dict[str, Callable[[ResourceGroup, Scene], ResourceGroup]] = {
    "vm-details": lambda g, s: _edit(g, s.vm, lambda r: {"details": {
        "state": "stopped", "RootDeviceName": "/dev/sdg", "InstanceType": "t3.nano"}}),
    "vm-created-at": lambda g, s: _edit(g, s.vm, lambda r: {"created_at": r.created_at - TWO_DAYS}),
    "vm-state": lambda g, s: _edit(g, s.vm, lambda r: {"state": ResourceState.TERMINATING}),
    "vm-tags": lambda g, s: _edit(g, s.vm, lambda r: {"tags": {TAG: s.ref, "Name": "scratch"}}),
    "data-details": lambda g, s: _edit(g, s.data, lambda r: {"details": {
        "state": "available", "Size": 1000, "VolumeType": "io2", "Device": "/dev/sdg"}}),
    "data-attached-to-another-instance": lambda g, s: _edit(g, s.data, lambda r: {"attached_to": s.bystander}),
    "data-created-at": lambda g, s: _edit(g, s.data, lambda r: {"created_at": (r.created_at or
                                                                              datetime.now(UTC)) - TWO_DAYS}),
    "data-state": lambda g, s: _edit(g, s.data, lambda r: {"state": ResourceState.AVAILABLE}),
    "data-tags": lambda g, s: _edit(g, s.data, lambda r: {"tags": {TAG: s.ref, "Name": "precious"}}),
    "precious-listed-as-member": _precious_as_member,
}


def forged_cycle(db: Database, endpoint: str, forge: Callable[[ResourceGroup], ResourceGroup]) -> str:
    """One delete cycle whose listing batches are forged in the queue (SAFETY.md rule 12: a message
    is only a hint): each group goes through ``forge`` and the batch is sent as JSON again, so
    the forgery is what a writer to the queue could send. Returns the cycle id."""
    pipeline = bootstrap.build_pipeline(Settings.explicit(confirm_seconds=0,
                                                          margin_seconds=0, aws_endpoint_url=endpoint), db=db,
                                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    cycle_id = pipeline.run_lister(BACKEND, mode="delete", manual=True).cycle_id
    while (body := pipeline.listing_queue.pop()) is not None:
        batch = ListingBatch.model_validate_json(body)
        forged = batch.model_copy(update={"groups": tuple(forge(g) for g in batch.groups)})
        pipeline.handle_batch(ListingBatch.model_validate_json(forged.model_dump_json()))
    while (body := pipeline.delete_queue.pop()) is not None:
        pipeline.handle_delete(DeleteRequest.model_validate_json(body))
    return cycle_id


# The axis where the group is deletable (each forgery a whole cycle that terminates the VM)
# runs in the slow suite; the dangerous axis, precious on the terminate's blast, in the default.
@pytest.mark.parametrize("precious_goes_on_termination", [
    True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["precious-deleted-on-termination", "precious-kept-on-termination"])
@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_forged_listing_never_takes_a_protected_volume_or_anything_outside_the_group(
        emptied_db, moto_reset, forgery, precious_goes_on_termination):
    """Given an orphan VM (its root volume and interface tagged with its ref) with a data volume of
    its ref (DeleteOnTermination), someone's precious volume (protect tag, no ref) attached to it
    with DeleteOnTermination on (the VM may not be terminated) or off (the group is deletable), and
    someone's running instance nearby; when a delete cycle runs on a listing batch forged in one
    field of the VM's group; then the precious volume exists, nothing outside the group was
    deleted or stopped, no journaled call named anything outside the group, and a VM whose
    termination would take the precious volume is not terminated."""
    db = emptied_db
    platform, vm = orphan_vm(db)
    ref = ref_of(platform, vm)
    data = attach(platform, vm, {TAG: ref}, device="/dev/sdf", delete_on_termination=True)
    precious = attach(platform, vm, {PROTECT: "yes", "Name": "precious"}, device="/dev/sdg",
                      delete_on_termination=precious_goes_on_termination)
    [bystander] = platform.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1)["Instances"]
    scene = Scene(ref=ref, vm=vm, data=data, precious=precious, bystander=bystander["InstanceId"])
    members = {vm, *platform.volumes_of(ref)} | {n["NetworkInterfaceId"] for n in described(platform.ec2, vm)[
        "NetworkInterfaces"]}
    outside = platform.all_volumes() - members

    def forge(group: ResourceGroup) -> ResourceGroup:
        return FORGERIES[forgery](group, scene) if group.primary_id == vm else group

    cycle_id = forged_cycle(db, moto_reset, forge)

    assert precious in platform.all_volumes()
    assert outside <= platform.all_volumes(), outside - platform.all_volumes()
    assert platform.instance_state(scene.bystander) == "running"
    assert journal_names(db) <= members, journal_names(db) - members
    if precious_goes_on_termination:
        assert platform.instance_state(vm) not in GONE
        assert outcome(db, cycle_id) != "clean"


# ---- C. a name reused while a delete is in flight ----------------------------------------------------

def test_a_name_reused_while_a_delete_is_in_flight_is_never_touched(emptied_db, proxy):
    """Given a primary-less orphan group of two available volumes of one ref, named data-a and
    data-b; when a delete cycle runs and, while its first DeleteVolume is held at the proxy, the
    other volume is deleted and a new one is created with its Name, the ref tag and the protect
    tag; then both old volumes are gone, the new one exists, and no journaled call names it."""
    db = emptied_db
    platform, ref = orphan_ref(db)
    named: dict[str, str] = {}
    for name in ("data-a", "data-b"):
        vol = platform.ec2.create_volume(AvailabilityZone=f"{platform.region}a", Size=1, TagSpecifications=[
            {"ResourceType": "volume", "Tags": [{"Key": TAG, "Value": ref}, {"Key": "Name", "Value": name}]}])
        named[vol["VolumeId"]] = name
    bodies: list[bytes] = []
    held = proxy.add_rule(Rule("DeleteVolume", match=lambda body: bodies.append(body) is None, times=1, hold=True))
    reused: list[str] = []

    def reuse_the_other_name() -> None:
        try:
            assert held.arrived.wait(30), "no DeleteVolume was sent"
            [other] = [v for v in named if v.encode() not in bodies[0]]
            platform.ec2.delete_volume(VolumeId=other)
            reused.append(platform.ec2.create_volume(AvailabilityZone=f"{platform.region}a", Size=1, TagSpecifications=[
                {"ResourceType": "volume", "Tags": [{"Key": TAG, "Value": ref}, {"Key": "Name", "Value": named[other]},
                                                    {"Key": PROTECT, "Value": "yes"}]}])["VolumeId"])
        finally:
            held.release()

    meanwhile = threading.Thread(target=reuse_the_other_name)
    meanwhile.start()
    try:
        cycle_id = delete_cycle(db, proxy.url)
    finally:
        held.release()
        meanwhile.join(30)

    [new] = reused
    assert new in platform.all_volumes()
    assert not set(named) & platform.all_volumes()
    assert new not in journal_names(db)
    recorded = only_result(db, cycle_id)
    assert new not in json.dumps(recorded), recorded


# ---- D. a snapshot of ours that an AMI uses --------------------------------------------------------------

# DeleteSnapshot answered as EC2 does for a snapshot an AMI uses (snapshot id, AMI id to fill in)
SNAPSHOT_IN_USE = (400, [("Content-Type", "text/xml;charset=UTF-8")],
                   b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InvalidSnapshot.InUse'
                   b"</Code><Message>The snapshot %s is currently in use by %s</Message></Error></Errors>"
                   b"<RequestID>x</RequestID></Response>")


def test_a_snapshot_an_ami_uses_is_skipped_in_use_and_never_fails_the_cycle(emptied_db, proxy):
    """Given retain_snapshots_days 7 and a snapshot the deleter took of a volume of an orphan ref
    (the ref and source tags), taken ten days ago, its volume gone, from which someone registered
    an AMI (EC2 answers its DeleteSnapshot InvalidSnapshot.InUse); when two delete cycles run;
    then the snapshot exists, each cycle skips it in_use and is unsettled, never failed, and the
    backend is not backing off."""
    db = emptied_db
    platform, ref = orphan_ref(db, retain_snapshots_days=7)
    ec2 = platform.ec2
    taken_of = platform.volume(ref)
    snap = ec2.create_snapshot(VolumeId=taken_of, TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
        {"Key": TAG, "Value": ref}, {"Key": SNAPSHOT_SOURCE_KEY, "Value": taken_of}]}])["SnapshotId"]
    ec2.delete_volume(VolumeId=taken_of)
    ami = ec2.register_image(Name="golden", RootDeviceName="/dev/sda1", BlockDeviceMappings=[
        {"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": snap}}])["ImageId"]
    status, headers, body = SNAPSHOT_IN_USE
    proxy.add_rule(Rule("DeleteSnapshot", match=lambda b: snap.encode() in b,
                        reply=(status, headers, body % (snap.encode(), ami.encode()))))
    proxy.add_rule(Rule("DescribeSnapshots", rewrite=aged_snapshots(10)))

    cycles = [delete_cycle(db, proxy.url) for _ in range(2)]

    assert snap in {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert [outcome(db, c) for c in cycles] == ["unsettled", "unsettled"]
    for cycle_id in cycles:
        recorded = only_result(db, cycle_id)
        # in use is a verdict, never a failure: named, and not finished (the group stays unsettled)
        assert recorded["state"] == "deleting" and skip_reasons(recorded).get(snap) == "in_use", recorded
        assert snap in recorded["result"]["pending"], recorded
    assert query(db, "SELECT last_outcome, retry_delay_seconds FROM cleanup WHERE backend_id = :b",
                 b=BACKEND) == [["unsettled", 0]]


# ---- E. a volume of ours in use by someone's instance -------------------------------------------------

def test_a_volume_in_use_by_a_foreign_instance_is_skipped_in_use(emptied_db, moto_reset):
    """Given a volume of an orphan ref (no instance of the ref) attached to someone's running,
    untagged instance; when a delete cycle runs; then the volume exists and stays attached, the
    instance runs, the volume is named in_use and still pending (the group not done), and the
    cycle is unsettled."""
    db = emptied_db
    platform, ref = orphan_ref(db)
    [theirs] = platform.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1)["Instances"]
    vol = platform.volume(ref, az=theirs["Placement"]["AvailabilityZone"])
    platform.ec2.attach_volume(VolumeId=vol, InstanceId=theirs["InstanceId"], Device="/dev/sdf")

    cycle_id = delete_cycle(db, moto_reset)

    [volume] = platform.ec2.describe_volumes(VolumeIds=[vol])["Volumes"]
    assert [a["InstanceId"] for a in volume["Attachments"]] == [theirs["InstanceId"]]
    assert platform.instance_state(theirs["InstanceId"]) == "running"
    assert outcome(db, cycle_id) == "unsettled"
    recorded = only_result(db, cycle_id)
    # in use is a verdict, never a failure: named, and not finished (the group stays unsettled)
    assert recorded["state"] == "deleting" and skip_reasons(recorded).get(vol) == "in_use", recorded
    assert vol in recorded["result"]["pending"], recorded
