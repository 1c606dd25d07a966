"""F1 (P1): an Elastic IP of an orphan ref that is associated with an interface OUTSIDE the
group which no instance holds (a detached standby ENI, or a requester-managed one: NAT
gateway, load balancer, Lambda) is disassociated from that foreign interface and released.

Rule 21: "A resource something outside the group uses (... an address ...) is ``in_use``:
left alone"; rule 15: "nothing outside the group is changed to make the group deletable";
``_disassociate_address``'s own docstring: "Break an association only from things that are
gone: an instance EC2 answers terminated, or an interface whose own instance is". An ENI
without an instance is neither: ``_holder(None)`` answers READY."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_eip_associated_with_a_foreign_detached_interface_is_left_in_use(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{EAST}a")["Subnet"]["SubnetId"]
    # another team's standby interface (not ours: no ref tag), attached to no instance
    foreign_eni = client.create_network_interface(SubnetId=subnet)["NetworkInterface"]["NetworkInterfaceId"]
    # an EIP the platform once allocated for REF (its owner is gone), now serving that interface
    alloc = client.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip", {"provider_ref": REF}))
    client.associate_address(AllocationId=alloc["AllocationId"], NetworkInterfaceId=foreign_eni)

    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id is None and group.resource_ids() == [alloc["AllocationId"]]

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    # what actually happened: the foreign interface lost its public address, and the address is gone
    calls = [c for c, _ in journal.calls()]
    eni = client.describe_network_interfaces(NetworkInterfaceIds=[foreign_eni])["NetworkInterfaces"][0]
    # expected: left alone as in_use (something outside the group uses it), nothing called
    assert calls == [], f"deleter called {calls} on an address a foreign interface uses"
    assert eni.get("Association", {}).get("PublicIp") == alloc["PublicIp"]
    assert result.status is not DeleteStatus.DELETED
    assert any(s.reason == "in_use" for s in result.skipped)
