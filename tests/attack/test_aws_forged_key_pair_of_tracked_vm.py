"""K2: a key pair (or launch template) of a LIVE owner's ref that its tracked VM uses is deleted
through a forged listing batch that puts it into the group of the owner's retry leak.

The listing keeps such a key pair out of any VM's group: ``aws/listing.py: link_resources``
attaches a named kind only to "the one listed instance of its ref that names it"; shared by the
tracked VM and the leak, it stays in the ref's primary-less group, which a live owner's
classification protects (``unattached_of_live_owner``). The deleter does not ask again: the
leak's group is a real ``primary_mismatch`` orphan, ``AwsOperations.uses`` finds that the leak
names the key pair (``KeyName``) and ``ready`` deletes it after the leak is gone, whatever else
names it. For a security group in the same forged place EC2 itself refuses
(``DependencyViolation``: "not yet"); for a key pair or a launch template nothing refuses.

Rule 12: "Messages are hints ... What a listing message says about attachment is not trusted
either" (the membership of a shared resource is such a claim); rule 1: never delete a tracked
resource (the live owner's key pair, in use by the VM it records); rule 21: a forged field "can
at worst make the deleter look for an id where it is not, and find nothing to delete".

Fixed: the deleter asks EC2 who uses a key pair or launch template (``DescribeInstances`` filtered
on ``key-name`` / the ``aws:ec2launchtemplate:id`` tag, as for a placement group) and leaves it
``in_use`` while any instance outside the group does, whatever group a message put it in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from orphan_cleanup.core.listing import RegionListing, ResourceGroup, ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of, spec
from tests.support.ledger_helpers import add_backend, add_instance, db_now, make_ref

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_key_pair_the_tracked_vm_uses_is_not_deleted_with_the_leak(moto_reset: str) -> None:
    client = ec2(moto_reset)
    kp = client.create_key_pair(KeyName="platform-key", TagSpecifications=spec("key-pair", {"provider_ref": REF}))
    run = {"ImageId": "ami-12345678", "MinCount": 1, "MaxCount": 1, "InstanceType": "t3.micro", "KeyName": "platform-key",
           "Placement": {"AvailabilityZone": f"{EAST}a"}, "TagSpecifications": spec("instance", {"provider_ref": REF})}
    leak = client.run_instances(**run)["Instances"][0]["InstanceId"]      # the first attempt, lost
    tracked = client.run_instances(**run)["Instances"][0]["InstanceId"]   # the owner's recorded primary

    provider = aws_provider(moto_reset)
    listed = {g.primary_id: g for g in groups_of(provider)}
    # the listing: the shared key pair is in no VM's group (two instances of the ref name it)
    assert kp["KeyPairId"] in listed[None].resource_ids()
    assert listed[leak].resource_ids() == [leak]

    # a forged batch: the leak's group with the shared key pair added (ids only, rule 21)
    forged = listed[leak].model_copy(update={"resources": (
        *listed[leak].resources, *(r for r in listed[None].resources if r.kind is ResourceKind.KEY_PAIR))})
    assert isinstance(forged, ResourceGroup)
    journal = RecordingJournal()
    result = provider.delete_resource_group(forged, journal)
    for _ in range(2):  # as the deleter goes on in later cycles, with what it saw attached
        if kp["KeyPairId"] in result.deleted or result.status.value != "deleting":
            break
        result = provider.delete_resource_group(forged, journal, known_attached=result.attached)

    still = client.describe_instances(InstanceIds=[tracked])["Reservations"][0]["Instances"][0]
    assert still["State"]["Name"] == "running" and still["KeyName"] == "platform-key"
    keys = [k["KeyPairId"] for k in client.describe_key_pairs()["KeyPairs"]]
    assert kp["KeyPairId"] in keys, (
        f"key pair {kp['KeyPairId']} of the live owner, used by its tracked VM {tracked}, was deleted with the"
        f" leak {leak} (calls {journal.calls()})")


class ForgingProvider:
    """The real AWS provider, whose listing moves the shared key pair into the leak's group, as a
    forged batch would (ids only: the kind and id of a resource the listing itself shows)."""

    def __init__(self, real: Any, leak: str) -> None:
        self._real, self._leak = real, leak

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def iter_listing(self) -> Iterator[RegionListing]:
        for region in self._real.iter_listing():
            groups = list(region.groups)
            keys = [r for g in groups if g.primary_id is None for r in g.resources if r.kind is ResourceKind.KEY_PAIR]
            out = []
            for g in groups:
                if g.primary_id == self._leak:
                    g = g.model_copy(update={"resources": (*g.resources, *keys)})
                elif g.primary_id is None:
                    rest = tuple(r for r in g.resources if r.kind is not ResourceKind.KEY_PAIR)
                    if not rest:
                        continue
                    g = g.model_copy(update={"resources": rest})
                out.append(g)
            yield region.model_copy(update={"groups": tuple(out)})


def test_a_delete_cycle_with_the_forged_batch_keeps_the_tracked_vms_key_pair(moto_reset: str, emptied_db) -> None:
    db = emptied_db
    client = ec2(moto_reset)
    ref = make_ref()
    kp = client.create_key_pair(KeyName="platform-key", TagSpecifications=spec("key-pair", {"provider_ref": ref}))
    run = {"ImageId": "ami-12345678", "MinCount": 1, "MaxCount": 1, "InstanceType": "t3.micro", "KeyName": "platform-key",
           "Placement": {"AvailabilityZone": f"{EAST}a"}, "TagSpecifications": spec("instance", {"provider_ref": ref})}
    leak = client.run_instances(**run)["Instances"][0]["InstanceId"]
    tracked = client.run_instances(**run)["Instances"][0]["InstanceId"]
    time.sleep(1.1)  # the owner's provisioning is recorded after the leak's launch (a lost attempt, rule 17)
    add_backend(db, "aws-kp", regions=(EAST,), mode="delete")
    add_instance(db, ref=ref, status="idle", backend_id="aws-kp", primary_id=tracked, region=EAST,
                 provisioned_at=db_now(db))
    time.sleep(1.1)
    pipe = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0, ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                    provider_for=lambda b: ForgingProvider(build_aws_provider(
                        b, connect_timeout=2, read_timeout=10, session=boto3.Session()), leak),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())

    reports = [run_cycle(pipe, "aws-kp")]
    verdicts = {g["primary_id"]: (g["verdict"], g["reason"], g["action"]) for g in reports[0].c3()["groups"]}
    assert verdicts[tracked][0] == "tracked" and verdicts[leak][:2] == ("orphan", "primary_mismatch")

    keys = [k["KeyPairId"] for k in client.describe_key_pairs()["KeyPairs"]]
    still = client.describe_instances(InstanceIds=[tracked])["Reservations"][0]["Instances"][0]
    assert still["State"]["Name"] == "running" and still["KeyName"] == "platform-key"
    assert kp["KeyPairId"] in keys, (
        f"key pair {kp['KeyPairId']} of live owner {ref}, used by its tracked VM {tracked}, was deleted by a delete"
        f" cycle with the leak {leak}: {verdicts}")
