"""The fake Compute server's reads by id and attached-disk calls, spoken by the real
google-cloud-compute client (REST transport) as the product and an attacker would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from orphan_cleanup.core.backends import BackendSettings
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from tests.support.gcp_fake import FakeCompute

ZONE = "us-central1-a"


@pytest.fixture
def clients(gcp: FakeCompute) -> dict[str, Any]:
    return build_gcp_clients(BackendSettings(), endpoint=gcp.url)


def test_instances_list_by_id_finds_the_instance_whatever_its_labels(gcp: FakeCompute,
                                                                     clients: dict[str, Any]) -> None:
    vm = gcp.add_instance("vm", zone=ZONE)  # no label at all
    gcp.add_instance("other", zone=ZONE, labels={"provider_ref": "aaaaaaaaaaa1"})
    request = {"project": gcp.project, "zone": ZONE, "filter": f"id = {vm['id']}"}

    [found] = list(clients["instances"].list(request=request))
    aggregated = [i for _, scoped in clients["instances"].aggregated_list(
        request={"project": gcp.project, "filter": f"id = {vm['id']}"}) for i in scoped.instances]

    assert (str(found.id), found.name) == (vm["id"], "vm")
    assert [str(i.id) for i in aggregated] == [vm["id"]]
    with pytest.raises(gexc.BadRequest):  # neither label term nor id: refused, as before
        list(clients["instances"].list(request={"project": gcp.project, "zone": ZONE, "filter": "name = vm"}))


def test_a_stopped_vms_boot_disk_is_swapped_through_the_api(gcp: FakeCompute, clients: dict[str, Any]) -> None:
    # Given: a stopped VM with its boot disk, and a disk created a day earlier
    gcp.add_instance("vm", zone=ZONE, status="TERMINATED")
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", boot=True, auto_delete=True)
    foreign = gcp.add_disk("foreign", zone=ZONE, created=datetime.now(UTC) - timedelta(days=1))
    instances, ops = clients["instances"], clients["zone_operations"]
    where = {"project": gcp.project, "zone": ZONE, "instance": "vm"}

    # When: detach the boot disk, attach the foreign one as boot with autoDelete (waiting for each)
    for op in (instances.detach_disk_unary(request={**where, "device_name": "vm-boot"}),
               instances.attach_disk_unary(request={**where, "attached_disk_resource": {
                   "source": foreign["selfLink"], "boot": True, "auto_delete": True}})):
        done = ops.wait(request={"project": gcp.project, "zone": ZONE, "operation": op.name})
        assert done.status == done.Status.DONE

    # Then: the instance's re-read shows the foreign disk as its boot disk
    vm = instances.get(request=where)
    assert [(d.source, d.boot, d.auto_delete, d.index) for d in vm.disks] == [(foreign["selfLink"], True, True, 0)]
    assert list(clients["disks"].get(request={"project": gcp.project, "zone": ZONE, "disk": "foreign"}).users) == [
        vm.self_link]


def test_a_boot_disk_of_a_running_vm_cannot_be_detached(gcp: FakeCompute, clients: dict[str, Any]) -> None:
    gcp.add_instance("vm", zone=ZONE)
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", boot=True, auto_delete=True)
    with pytest.raises(gexc.BadRequest):
        clients["instances"].detach_disk_unary(
            request={"project": gcp.project, "zone": ZONE, "instance": "vm", "device_name": "vm-boot"})
    assert gcp.get("disks", ZONE, "vm-boot")["users"]  # type: ignore[index]


def test_a_hook_acts_while_the_clients_delete_is_still_in_flight(gcp: FakeCompute, clients: dict[str, Any]) -> None:
    gcp.add_disk("disk-a", zone=ZONE)
    gcp.add_disk("disk-b", zone=ZONE)
    gcp.on_operation("/disks/disk-a", lambda: gcp.remove("disks", ZONE, "disk-b"), method="DELETE")

    op = clients["disks"].delete_unary(request={"project": gcp.project, "zone": ZONE, "disk": "disk-a"})

    assert op.status == op.Status.RUNNING and gcp.names("disks") == set()


def test_forwarding_rules_over_the_api_hold_their_address_until_deleted(gcp: FakeCompute,
                                                                        clients: dict[str, Any]) -> None:
    # Given: a static address, and a labelled forwarding rule inserted on it through the client
    region = "us-central1"
    ip = gcp.add_address("ip", region=region)
    rules, ops = clients["forwarding_rules"], clients["region_operations"]
    op = rules.insert_unary(request={"project": gcp.project, "region": region, "forwarding_rule_resource": {
        "name": "fr", "I_p_address": ip["address"], "target": "projects/p/regions/us-central1/targetPools/tp",
        "labels": {"provider_ref": "aaaaaaaaaaa1"}}})
    assert ops.wait(request={"project": gcp.project, "region": region, "operation": op.name}).status == op.Status.DONE
    gcp.add_forwarding_rule("unlabelled", region=region)

    # When: listed by label (aggregated: every region's scope) and read by id
    scopes = dict(rules.aggregated_list(request={"project": gcp.project, "filter": "labels.provider_ref:*"}))
    [listed] = scopes[f"regions/{region}"].forwarding_rules
    [by_id] = rules.list(request={"project": gcp.project, "region": region, "filter": f"id = {listed.id}"})

    # Then: the wire fields are Compute's, the address is in use by it; empty scopes warn
    assert (listed.name, listed.I_p_address, listed.target, dict(listed.labels)) == (
        "fr", ip["address"], "projects/p/regions/us-central1/targetPools/tp", {"provider_ref": "aaaaaaaaaaa1"})
    assert listed.id > 0 and listed.creation_timestamp and listed.self_link.endswith("/forwardingRules/fr")
    assert by_id.id == listed.id
    assert all(s.warning.code == "NO_RESULTS_ON_PAGE" for k, s in scopes.items() if k != f"regions/{region}")
    address = clients["addresses"].get(request={"project": gcp.project, "region": region, "address": "ip"})
    assert (address.status, list(address.users)) == ("IN_USE", [listed.self_link])
    # the address cannot go while the rule holds it; once the rule is deleted, it is free
    with pytest.raises(gexc.BadRequest):
        clients["addresses"].delete_unary(request={"project": gcp.project, "region": region, "address": "ip"})
    rules.delete_unary(request={"project": gcp.project, "region": region, "forwarding_rule": "fr"})
    address = clients["addresses"].get(request={"project": gcp.project, "region": region, "address": "ip"})
    assert (address.status, list(address.users)) == ("RESERVED", [])
    with pytest.raises(gexc.NotFound):
        rules.get(request={"project": gcp.project, "region": region, "forwarding_rule": "fr"})


def test_images_over_the_api(gcp: FakeCompute, clients: dict[str, Any]) -> None:
    # Given: a labelled image inserted from a disk through the client, and an unlabelled one
    disk = gcp.add_disk("d", zone=ZONE)
    images, ops = clients["images"], clients["global_operations"]
    op = images.insert_unary(request={"project": gcp.project, "image_resource": {
        "name": "img", "source_disk": disk["selfLink"], "labels": {"provider_ref": "aaaaaaaaaaa1"}}})
    assert ops.wait(request={"project": gcp.project, "operation": op.name}).status == op.Status.DONE
    gcp.add_image("unlabelled", disk=disk)

    # When: listed by label and read by id
    [listed] = images.list(request={"project": gcp.project, "filter": "labels.provider_ref:*"})
    [by_id] = images.list(request={"project": gcp.project, "filter": f"id = {listed.id}"})

    # Then: its source disk is named; a delete by name removes it
    assert (listed.name, listed.status, listed.source_disk, str(listed.source_disk_id)) == (
        "img", "READY", disk["selfLink"], disk["id"])
    assert by_id.id == listed.id and listed.creation_timestamp
    with pytest.raises(gexc.BadRequest):  # the label filter is required, as for every list
        list(images.list(request={"project": gcp.project}))
    images.delete_unary(request={"project": gcp.project, "image": "img"})
    assert gcp.image_names() == {"unlabelled"}
