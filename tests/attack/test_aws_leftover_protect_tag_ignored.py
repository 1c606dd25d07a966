"""A1 (P1): a protect tag on one member of a primary-less group (or of a group whose
instance is already gone) does not protect the group: the deleter judges every leftover
alone, so an Elastic IP of the group is disassociated from the group's PROTECTED interface
and released, taking that interface's public address.

Rule 3: "A protect tag on any member protects the whole group, as in a listing"; the
classifier does exactly that for every group (``core/classify.py: _orphan_unless_recent``,
``protect_tag``), but the deleter only applies it in ``deletion.py: _Run.owner_step`` via
``_members_before_delete``. ``deletion.py: delete_group`` with ``primary_id is None`` (and
``owner_step`` when the owner reads as gone) goes straight to ``_Run.dependents_step``, where
``_delete_dependent`` judges each member alone (``not_ours``): the protected interface is
skipped, but the address comes first in the delete order and ``aws/operations.py:
_disassociate_address`` breaks its association with that interface because the interface's
id is in ``member_ids`` (a listing's membership) and no instance holds it. Rule 15: "nothing
outside the group is changed"; a protected member is not the group's to change either.

The second test shows the same hole with a forged batch (rule 21): naming a tracked ref's
standby interface as a member makes ``_disassociate_address`` trust the listing's
membership (``eni_id in member_ids``) without the interface's re-read tags."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from tests.attack.helpers import EAST, OTHER, PROTECT, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


def _eni_with_eip(client, eni_tags: dict[str, str], eip_ref: str = REF) -> tuple[str, dict]:
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{EAST}a")["Subnet"]["SubnetId"]
    eni = client.create_network_interface(SubnetId=subnet, TagSpecifications=spec("network-interface", eni_tags))
    eni_id = eni["NetworkInterface"]["NetworkInterfaceId"]
    alloc = client.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip", {"provider_ref": eip_ref}))
    client.associate_address(AllocationId=alloc["AllocationId"], NetworkInterfaceId=eni_id)
    return eni_id, alloc


def test_protect_tag_on_a_leftover_interface_protects_its_address(moto_reset: str) -> None:
    client = ec2(moto_reset)
    eni_id, alloc = _eni_with_eip(client, {"provider_ref": REF})
    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id is None and sorted(group.resource_ids()) == sorted([eni_id, alloc["AllocationId"]])

    # after the listing, an operator protects the interface (keep it, with its public address)
    client.create_tags(Resources=[eni_id], Tags=[{"Key": PROTECT, "Value": "keep"}])
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    eni = client.describe_network_interfaces(NetworkInterfaceIds=[eni_id])["NetworkInterfaces"][0]
    assert journal.calls() == [], (
        f"a group with a protected member: the deleter called {journal.calls()} (status {result.status},"
        f" skipped {[(s.id, s.reason) for s in result.skipped]})")
    assert eni.get("Association", {}).get("PublicIp") == alloc["PublicIp"]


def test_forged_member_interface_of_a_tracked_ref_keeps_its_address(moto_reset: str) -> None:
    client = ec2(moto_reset)
    # a tracked ref's standby interface (OTHER), serving an address of the orphan ref REF
    eni_id, alloc = _eni_with_eip(client, {"provider_ref": OTHER})
    forged = ResourceGroup(provider_ref=REF, region=EAST, primary_id=None, resources=(
        Resource(kind=ResourceKind.ADDRESS, id=alloc["AllocationId"], region=EAST, tags={"provider_ref": REF}),
        Resource(kind=ResourceKind.NETWORK_INTERFACE, id=eni_id, region=EAST, tags={"provider_ref": REF}),
    ))
    journal = RecordingJournal()
    result = aws_provider(moto_reset).delete_resource_group(forged, journal)

    eni = client.describe_network_interfaces(NetworkInterfaceIds=[eni_id])["NetworkInterfaces"][0]
    assert [c for c, _ in journal.calls()] == [], (
        f"{OTHER}'s interface lost its address: calls {journal.calls()},"
        f" skipped {[(s.id, s.reason) for s in result.skipped]}")
    assert eni.get("Association", {}).get("PublicIp") == alloc["PublicIp"]
