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
