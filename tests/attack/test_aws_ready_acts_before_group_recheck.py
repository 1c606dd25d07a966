"""G2 (P1/P2, a change to a protected group's member): the sibling re-check of the round-3
fix runs AFTER ``ops.ready`` has already acted. ``deletion.py: _Run._delete_dependent``
calls ``self.ops.ready(...)`` first (``aws/operations.py: _disassociate_address`` calls
``DisassociateAddress``, ``_detach_interface`` calls ``DetachNetworkInterface``, both
journaled straight to the run's journal, never through ``_Acted``) and only then
``_Run._siblings_still_the_groups``, which finds the member protected during the previous
call's wait and stops the deletion (``_GroupLeft``). The address has by then been freed
from the group's interface: the group was protected, yet a member was changed.

Rule 3: "in a group without an instance (or whose instance is gone) no member is touched,
none of them freed from another"; rule 15: "nothing outside the group is changed to make
the group deletable" (here: nothing of a protected group)."""

from __future__ import annotations

from typing import Any

import pytest

from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import EAST, PROTECT, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_address_not_disassociated_once_a_sibling_was_protected(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{EAST}a")["Subnet"]["SubnetId"]
    ref = {"provider_ref": REF}
    vol = client.create_volume(AvailabilityZone=f"{EAST}a", Size=1, TagSpecifications=spec("volume", ref))["VolumeId"]
    eni = client.create_network_interface(SubnetId=subnet, TagSpecifications=spec("network-interface", ref))[
        "NetworkInterface"]["NetworkInterfaceId"]
    sg = client.create_security_group(GroupName="g2-sg", Description="x", VpcId=vpc,
                                      TagSpecifications=spec("security-group", ref))["GroupId"]
    alloc = client.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip", ref))
    client.associate_address(AllocationId=alloc["AllocationId"], NetworkInterfaceId=eni)

    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id is None
    assert sorted(group.resource_ids()) == sorted([vol, eni, sg, alloc["AllocationId"]])

    def hook(params: dict[str, Any], **_: Any) -> None:  # during the volume's delete: the operator protects the SG
        if params.get("VolumeId") == vol:
            client.create_tags(Resources=[sg], Tags=[{"Key": PROTECT, "Value": "keep"}])

    provider.ec2(EAST).meta.events.register("before-parameter-build.ec2.DeleteVolume", hook)
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    calls = journal.calls()
    assert result.status is DeleteStatus.SKIPPED  # the re-check did see the protection...
    address = client.describe_addresses(AllocationIds=[alloc["AllocationId"]])["Addresses"][0]
    assert not any(c == "ec2:DisassociateAddress" for c, _ in calls) and address.get("NetworkInterfaceId") == eni, (
        f"{sg} was tagged {PROTECT} (the group protected) while {vol} was being deleted; the group's address"
        f" was then disassociated from {eni} before the re-check stopped the deletion: calls {calls},"
        f" address now {address.get('NetworkInterfaceId')}, skipped {[(s.id, s.reason) for s in result.skipped]}")
