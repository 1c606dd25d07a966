"""GcpProvider deletion: the real google-cloud-compute client against the fake Compute server."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ProviderError, ProviderUnavailable
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.provider import GcpProvider
from tests.support.gcp_fake import FakeCompute
from tests.support.listing import collect

REF, OTHER = "aaaaaaaaaaa1", "bbbbbbbbbbb2"
ZONE, REGION = "us-central1-a", "us-central1"


def provider(gcp: FakeCompute, **kw: object) -> GcpProvider:
    backend = Backend(id="gcp-test", provider="gcp", account=gcp.project, regions=[REGION, "europe-west1"])
    kw.setdefault("timeout", 5.0)
    kw.setdefault("poll_interval", 0.01)
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url), **kw)  # type: ignore[arg-type]


def owner_group(gcp: FakeCompute, *, auto_delete: bool = False, **instance_kw: object) -> dict[str, dict]:
    made = {
        "vm": gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF}, **instance_kw),  # type: ignore[arg-type]
        "boot": gcp.add_disk("vm-boot", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm",
                             auto_delete=auto_delete, boot=True),
        "data": gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm"),
        "ip": gcp.add_address("vm-ip", region=REGION, labels={"provider_ref": REF}, attached_to="vm"),
    }
    return made


def listed_group(p: GcpProvider, primary_id: str | None = None) -> ResourceGroup:
    groups = [g for g in collect(p).groups if primary_id is None or g.primary_id == primary_id]
    assert len(groups) == 1, groups
    return groups[0]


def test_orphan_group_is_deleted_over_two_calls(gcp: FakeCompute) -> None:
    # Given: an instance that stays STOPPING for one read after its delete
    made = owner_group(gcp, stopping_gets=1)
    p = provider(gcp)
    group = listed_group(p)
    # When / Then: first call confirms the instance shutting down, dependents wait
    first = p.delete_resource_group(group)
    assert first.status is DeleteStatus.DELETING
    assert first.deleted == (made["vm"]["id"],)
    assert set(first.pending) == {made[k]["id"] for k in made}
    assert gcp.get("disks", ZONE, "vm-data") is not None
    # second call finds it gone and deletes the disks and the address the first saw attached
    assert set(first.attached) == {made[k]["id"] for k in made if k != "vm"}
    second = p.delete_resource_group(group, known_attached=first.attached)
    assert second.status is DeleteStatus.DELETED and second.pending == ()
    assert set(second.deleted) == {made[k]["id"] for k in made}
    assert gcp.names("instances") == gcp.names("disks") == gcp.names("addresses") == set()
    assert gcp.count("DELETE", "/instances/vm") == 1
    assert gcp.count("POST", "/zones/us-central1-a/operations/") >= 1  # polled at the fake, not googleapis
    assert gcp.count("POST", "/regions/us-central1/operations/") == 1


def test_immediate_delete_with_auto_delete_disk_finishes_in_one_call(gcp: FakeCompute) -> None:
    made = owner_group(gcp, auto_delete=True)
    p = provider(gcp)
    result = p.delete_resource_group(listed_group(p))
    assert result.status is DeleteStatus.DELETED
    assert set(result.deleted) == {made[k]["id"] for k in made}
    assert gcp.count("DELETE", "/disks/vm-boot") == 0  # went with the instance: 404 = done


def test_second_delete_of_a_deleted_group_changes_nothing(gcp: FakeCompute) -> None:
    owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    assert p.delete_resource_group(group).status is DeleteStatus.DELETED
    gcp.clear_calls()
    again = p.delete_resource_group(group)
    assert again.status is DeleteStatus.DELETED
    assert {c.method for c in gcp.calls} == {"GET"}


def test_name_reused_after_listing_is_never_deleted(gcp: FakeCompute) -> None:
    made = owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    # the platform deleted "vm" and created a new "vm" with the same labels
    new = gcp.replace("instances", ZONE, "vm")
    result = p.delete_resource_group(group)
    # Read by its id (SAFETY.md rule 21), the listed VM is gone (the deleter never learns the
    # name the listing recorded): its members, never seen attached to it, are left alone.
    assert result.status is DeleteStatus.SKIPPED and made["vm"]["id"] in result.deleted
    assert {s.reason for s in result.skipped} == {"primary_gone"}
    assert gcp.get("instances", ZONE, "vm")["id"] == new["id"]  # type: ignore[index]
    assert gcp.names("disks") == {"vm-boot", "vm-data"}
    assert gcp.count("DELETE") == 0


def test_replaced_dependent_survives_while_the_rest_goes(gcp: FakeCompute) -> None:
    made = owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    gcp.remove("addresses", REGION, "vm-ip")
    spare = gcp.add_address("vm-ip", region=REGION, labels={"provider_ref": REF})  # same name, new id
    result = p.delete_resource_group(group)
    # Read by its id (SAFETY.md rule 21), the listed address is gone; the new one of its name is not it.
    assert result.status is DeleteStatus.DELETED and made["ip"]["id"] in result.deleted
    assert result.skipped == () and spare["id"] not in result.deleted
    assert gcp.get("addresses", REGION, "vm-ip")["id"] == spare["id"]  # type: ignore[index]


@pytest.mark.parametrize("target", [("instances", ZONE, "vm"), ("disks", ZONE, "vm-data")])
def test_protect_label_anywhere_leaves_the_group_alone(gcp: FakeCompute, target: tuple[str, str, str]) -> None:
    owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    labels = dict(gcp.get(*target)["labels"], **{"orphan-cleanup-protect": "yes"})  # type: ignore[index]
    gcp.set_labels(*target, labels)
    result = p.delete_resource_group(group)
    assert result.status is DeleteStatus.SKIPPED and "protected" in {s.reason for s in result.skipped}
    assert gcp.count("DELETE") == 0 and gcp.names("instances") == {"vm"}


@pytest.mark.parametrize("labels", [{"provider_ref": OTHER}, {}])
def test_ref_label_changed_after_listing_survives(gcp: FakeCompute, labels: dict[str, str]) -> None:
    owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    gcp.set_labels("instances", ZONE, "vm", labels)
    result = p.delete_resource_group(group)
    assert result.status is DeleteStatus.SKIPPED
    assert gcp.count("DELETE") == 0 and gcp.names("instances") == {"vm"}


def test_stopped_instance_is_deleted_not_taken_for_gone(gcp: FakeCompute) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF}, status="TERMINATED")
    p = provider(gcp)
    assert p.delete_resource_group(listed_group(p)).status is DeleteStatus.DELETED
    assert gcp.names("instances") == set() and gcp.count("DELETE", "/instances/vm") == 1


def test_delete_that_does_not_take_effect_is_an_error(gcp: FakeCompute) -> None:
    owner_group(gcp, ignore_delete=True)
    p = provider(gcp)
    with pytest.raises(ProviderError, match="still RUNNING"):
        p.delete_resource_group(listed_group(p))
    assert gcp.names("disks") == {"vm-boot", "vm-data"}


def test_disk_used_by_a_foreign_instance_is_pending_not_failed(gcp: FakeCompute) -> None:
    gcp.add_instance("foreign", zone=ZONE)
    disk = gcp.add_disk("left", zone=ZONE, labels={"provider_ref": REF}, attached_to="foreign")
    p = provider(gcp)
    result = p.delete_resource_group(listed_group(p))
    assert (result.status, result.pending) == (DeleteStatus.DELETING, (disk["id"],))
    assert gcp.count("DELETE") == 0


def test_in_use_answer_from_the_api_is_pending(gcp: FakeCompute) -> None:
    # the disk gets attached between our re-read and our delete: the API says "in use"
    disk = gcp.add_disk("left", zone=ZONE, labels={"provider_ref": REF})
    p = provider(gcp)
    group = listed_group(p)
    gcp.add_fault("DELETE", "/disks/left", status=400, reason="resourceInUseByAnotherResource", times=1)
    result = p.delete_resource_group(group)
    assert (result.status, result.pending) == (DeleteStatus.DELETING, (disk["id"],))
    assert gcp.names("disks") == {"left"}


def test_leftover_group_is_deleted(gcp: FakeCompute) -> None:
    disk = gcp.add_disk("left", zone="europe-west1-b", labels={"provider_ref": REF})
    ip = gcp.add_address("left-ip", region="europe-west1", labels={"provider_ref": REF})
    p = provider(gcp)
    results = [p.delete_resource_group(g) for g in collect(p).groups]
    assert {r.status for r in results} == {DeleteStatus.DELETED}
    assert {i for r in results for i in r.deleted} == {disk["id"], ip["id"]}


def test_resources_gone_since_listing_are_done_without_deletes(gcp: FakeCompute) -> None:
    owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    for coll, loc, name in [("instances", ZONE, "vm"), ("disks", ZONE, "vm-boot"), ("disks", ZONE, "vm-data"),
                            ("addresses", REGION, "vm-ip")]:
        gcp.remove(coll, loc, name)
    assert p.delete_resource_group(group).status is DeleteStatus.DELETED
    assert gcp.count("DELETE") == 0


def test_failing_region_raises_unavailable_with_region(gcp: FakeCompute) -> None:
    owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    gcp.fail_region(REGION)
    with pytest.raises(ProviderUnavailable) as info:
        p.delete_resource_group(group)
    assert info.value.region == ZONE
    assert gcp.names("instances") == {"vm"}


def test_slow_operation_is_confirmed_by_rereading(gcp: FakeCompute) -> None:
    made = owner_group(gcp, auto_delete=True)
    gcp.operation_polls = 10_000
    p = provider(gcp, operation_timeout=0.2)
    result = p.delete_resource_group(listed_group(p))
    assert result.status is DeleteStatus.DELETED
    assert made["vm"]["id"] in result.deleted


@pytest.mark.parametrize("boot", [False, True])
def test_an_unlabeled_auto_delete_disk_goes_with_the_instance_only_as_its_boot_disk(gcp: FakeCompute,
                                                                                   boot: bool) -> None:
    # Given: an orphan instance and a disk carrying no label at all, attached with autoDelete:
    # someone else's data disk attached later (boot false), or the instance's own boot disk
    vm = gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    other = gcp.add_disk("other-data", zone=ZONE, labels={}, attached_to="vm", auto_delete=True, boot=boot)
    p = provider(gcp)
    group = listed_group(p)

    result = p.delete_resource_group(group)

    if boot:  # SAFETY.md rule 15: the boot disk is the instance's own, it goes with it
        assert result.status is DeleteStatus.DELETED and gcp.names("instances") == gcp.names("disks") == set()
        return
    # Then: only the boot disk is excepted; any other unlabeled disk blocks the call
    assert result.status is DeleteStatus.SKIPPED
    assert {(s.id, s.reason) for s in result.skipped} >= {(vm["id"], "blast_foreign"), (other["id"], "blast_foreign")}
    assert gcp.count("DELETE") == 0
    assert gcp.names("instances") == {"vm"} and gcp.names("disks") == {"other-data"}


FAR = "europe-west1-b"


def backend_of(gcp: FakeCompute, *regions: str) -> GcpProvider:
    backend = Backend(id=f"gcp-{len(regions)}", provider="gcp", account=gcp.project, regions=list(regions))
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url), timeout=5.0,
                       poll_interval=0.01)


def far_orphan(gcp: FakeCompute) -> ResourceGroup:
    """An orphan VM in a zone that only another backend of the project (``europe-west1``) lists."""
    gcp.add_instance("far", zone=FAR, labels={"provider_ref": REF})
    gcp.add_disk("far-boot", zone=FAR, labels={"provider_ref": REF}, attached_to="far", auto_delete=True, boot=True)
    return listed_group(backend_of(gcp, "europe-west1"))


def test_a_group_outside_the_backends_zones_and_regions_is_refused(gcp: FakeCompute) -> None:
    # Given: a group a forged batch hands to the backend of us-central1 only (SAFETY.md rule 12)
    group = far_orphan(gcp)
    p = backend_of(gcp, REGION)

    # When / Then: refused as it is, and with its region forged to one of the backend's zones
    with pytest.raises(ProviderError, match=FAR):
        p.delete_resource_group(group)
    forged = group.model_copy(update={"region": ZONE})
    with pytest.raises(ProviderError, match=FAR):
        p.delete_resource_group(forged)
    moved = forged.model_copy(update={"resources": tuple(r.model_copy(update={"region": ZONE})
                                                          for r in group.resources)})
    # Every place forged into the backend: the deleter looks each id up where the group says
    # (rule 21: the only place it takes from a listing) and finds nothing there to delete.
    assert p.delete_resource_group(moved).status is DeleteStatus.DELETED
    assert gcp.count("DELETE") == 0 and gcp.names("instances") == {"far"} and gcp.names("disks") == {"far-boot"}
    # the backend that lists that zone deletes it
    assert backend_of(gcp, "europe-west1").delete_resource_group(group).status is DeleteStatus.DELETED


def test_holds_instance_only_in_the_zone_asked_and_only_in_the_backends_entries(gcp: FakeCompute) -> None:
    far = far_orphan(gcp).primary_id
    assert far is not None
    near = backend_of(gcp, REGION)
    both = backend_of(gcp, REGION, "europe-west1")

    assert both.holds_instance(FAR, far, REF)  # control: there, and the backend lists it
    assert not both.holds_instance(ZONE, far, REF)  # not in the zone asked
    assert not near.holds_instance(FAR, far, REF)  # in a zone the backend does not list
    assert not near.holds_instance(ZONE, far, REF)


def test_instance_created_at_is_the_listed_time_by_zone_and_name_and_only_of_that_id(gcp: FakeCompute) -> None:
    group = far_orphan(gcp)
    primary = group.primary
    assert primary is not None and primary.created_at is not None
    both = backend_of(gcp, REGION, "europe-west1")

    assert both.instance_created_at(primary) == primary.created_at  # the listing's creationTimestamp
    gcp.set_labels("instances", FAR, "far", {})
    assert both.instance_created_at(primary) == primary.created_at  # whatever its labels (the delete judges them)
    with pytest.raises(ProviderError, match=FAR):  # a zone the backend does not list
        backend_of(gcp, REGION).instance_created_at(primary)
    gcp.remove("instances", FAR, "far")
    assert both.instance_created_at(primary) is None  # gone
    gcp.add_instance("far", zone=FAR, labels={"provider_ref": REF})
    assert both.instance_created_at(primary) is None  # another instance of that name: a replacement


#: An attached local SSD as instances.get shows it: no ``source`` (there is no disk resource).
LOCAL_SSD = {"kind": "compute#attachedDisk", "type": "SCRATCH", "mode": "READ_WRITE", "autoDelete": True,
             "boot": False, "interface": "NVME", "deviceName": "local-ssd-0", "index": 1, "diskSizeGb": "375"}


@pytest.mark.parametrize("disk_type", ["SCRATCH", "PERSISTENT"])
def test_a_local_ssd_goes_with_its_instance_another_disk_without_source_blocks(gcp: FakeCompute,
                                                                            disk_type: str) -> None:
    # Given: an orphan instance with its boot disk and an attached disk that names no source
    vm = gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    boot = gcp.add_disk("vm-boot", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", auto_delete=True,
                        boot=True)
    disks = gcp.get("instances", ZONE, "vm")["disks"]  # type: ignore[index]
    gcp.set_field("instances", ZONE, "vm", "disks", [*disks, dict(LOCAL_SSD, type=disk_type)])
    p = provider(gcp)
    group = listed_group(p)

    result = p.delete_resource_group(group)

    if disk_type == "SCRATCH":  # a local SSD exists only with its instance: never blocks it
        assert result.status is DeleteStatus.DELETED and set(result.deleted) == {vm["id"], boot["id"]}
        assert gcp.names("instances") == gcp.names("disks") == set()
        return
    # a persistent disk the re-read cannot name stays unverifiable: the group is left (fail closed)
    assert result.status is DeleteStatus.SKIPPED and "blast_unreadable" in {s.reason for s in result.skipped}
    assert gcp.count("DELETE") == 0 and gcp.names("instances") == {"vm"}
