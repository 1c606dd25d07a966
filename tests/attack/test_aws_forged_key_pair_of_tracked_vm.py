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
at worst make the deleter look for an id where it is not, and find nothing to delete"."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.listing import ResourceGroup, ResourceKind
from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="open (rules 1, 12): a forged batch puts a live owner's"
                   " shared key pair into its retry leak's group; the deleter deletes it though the tracked VM uses it")
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
