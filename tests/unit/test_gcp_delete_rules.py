"""Decision rules of GCP group deletion on a stubbed call layer (no sockets): the one
deletion algorithm (``providers.deletion``) over ``GcpOperations`` and a stand-in for
``GcpCalls``. The deleter takes from a listing only the group's ref, each member's kind,
numeric id and zone (SAFETY.md rule 21): every other fact is its own fresh read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from google.cloud.compute_v1.types import compute

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus
from orphan_cleanup.providers.deletion import delete_group
from orphan_cleanup.providers.gcp.kinds import GcpKind
from orphan_cleanup.providers.gcp.operations import GcpOperations

PROJECT = "p"
ZONE = "us-central1-a"
REF = "aaaaaaaaaaa1"
TAGS = {"provider_ref": REF}
VM_LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/vm"
DISK_LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/disks/data"


class StubCalls:
    """Stands in for ``GcpCalls``: the live items by name. ``find`` reads by numeric id
    (a list filtered on ``id``), ``get`` by name; ``effects`` says what a delete of a name
    leaves (name -> the item now under that name, None: gone); by default the deleted name
    is gone. Every call is recorded."""

    project = PROJECT

    def __init__(self, items: Mapping[str, Any], effects: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.items = dict(items)
        self.effects = dict(effects or {})
        self.finds: list[tuple[str, str]] = []
        self.gets: list[tuple[str, str]] = []
        self.deletes: list[str] = []

    def find(self, spec: GcpKind, location: str, resource_id: str) -> list[Any]:
        self.finds.append((location, resource_id))
        return [i for i in self.items.values() if str(i.id) == resource_id]

    def get(self, spec: GcpKind, location: str, name: str) -> Any | None:
        self.gets.append((location, name))
        return self.items.get(name)

    def delete(self, spec: GcpKind, location: str, name: str, **_journaled: Any) -> None:
        self.deletes.append(name)
        for left, item in self.effects.get(name, {name: None}).items():
            if item is None:
                self.items.pop(left, None)
            else:
                self.items[left] = item


def vm(status: str = "RUNNING", id_: int = 1, labels: dict[str, str] | None = None,
       disks: tuple[compute.AttachedDisk, ...] = ()) -> compute.Instance:
    return compute.Instance(id=id_, name="vm", status=status, labels=TAGS if labels is None else labels,
                            self_link=VM_LINK, disks=list(disks))


def data_disk(users: tuple[str, ...] = (VM_LINK,)) -> compute.Disk:
    return compute.Disk(id=7, name="data", status="READY", labels=TAGS, self_link=DISK_LINK, users=list(users))


def instance_res(tags: dict[str, str] | None = None, **details: Any) -> Resource:
    return Resource(kind=ResourceKind.INSTANCE, id="1", region=ZONE, tags=TAGS if tags is None else tags,
                    details={"name": "vm", "zone": ZONE, **details})


def run(calls: StubCalls, *resources: Resource, primary: str | None = "1") -> DeleteResult:
    group = ResourceGroup(provider_ref=REF, region=ZONE, primary_id=primary, resources=resources)
    return delete_group(GcpOperations(calls), group, tag_key="provider_ref",  # type: ignore[arg-type]
                        protect_keys={"orphan-cleanup-protect"})


def test_stopped_vm_still_listed_after_its_delete_is_deleting() -> None:
    calls = StubCalls({"vm": vm("TERMINATED")}, effects={"vm": {"vm": vm("TERMINATED")}})
    result = run(calls, instance_res())
    assert (result.status, result.deleted, result.pending) == (DeleteStatus.DELETING, ("1",), ("1",))
    assert calls.deletes == ["vm"]


@pytest.mark.parametrize("status", ["RUNNING", "STAGING", "PROVISIONING", "SUSPENDED", "REPAIRING"])
def test_vm_not_shutting_down_after_delete_is_an_error(status: str) -> None:
    calls = StubCalls({"vm": vm(status)}, effects={"vm": {"vm": vm(status)}})
    with pytest.raises(ProviderError, match=f"still {status}"):
        run(calls, instance_res())


def test_already_stopping_vm_is_not_deleted_twice() -> None:
    calls = StubCalls({"vm": vm("STOPPING")})
    assert run(calls, instance_res()).status is DeleteStatus.DELETING
    assert calls.deletes == []


def test_the_vm_is_read_by_its_id_and_its_name_checked_right_before_the_delete() -> None:
    calls = StubCalls({"vm": vm()})
    result = run(calls, instance_res())
    assert (result.status, result.deleted) == (DeleteStatus.DELETED, ("1",))
    # read by id, judged again on a read by id right before the call, the name checked by a
    # get, deleted, confirmed gone by id
    assert calls.finds == [(ZONE, "1")] * 3 and calls.gets == [(ZONE, "vm")] and calls.deletes == ["vm"]


def test_a_name_that_now_names_another_vm_is_not_deleted() -> None:
    calls = StubCalls({"vm": vm()})
    calls.get = lambda spec, location, name: vm(id_=2)  # type: ignore[method-assign]  # reused since the read
    result = run(calls, instance_res())
    assert result.status is DeleteStatus.SKIPPED and calls.deletes == []
    assert ("1", "replaced") in {(s.id, s.reason) for s in result.skipped}


def answers(*replies: Any) -> Any:
    """A stand-in for ``find`` or ``get`` answering ``replies`` in turn (the last one after)."""
    left = list(replies)

    def answer(*_: Any) -> Any:
        return left.pop(0) if len(left) > 1 else left[0]
    return answer


PROTECTED = {**TAGS, "orphan-cleanup-protect": ""}
AUTO_DELETE = compute.AttachedDisk(source=DISK_LINK, auto_delete=True, boot=False)


@pytest.mark.parametrize(("now", "what"), [
    (vm(labels=PROTECTED), "a protect label"), (vm(labels={**TAGS, "team": "b"}), "another label"),
    (vm(disks=(AUTO_DELETE,)), "a disk attached with autoDelete"),
], ids=["protect-label", "label", "auto-delete-disk"])
def test_a_name_whose_read_differs_from_the_judged_one_is_not_deleted(now: compute.Instance, what: str) -> None:
    # the get by name right before the call shows the same id, changed since the read by id
    calls = StubCalls({"vm": vm()})
    calls.get = answers(now)  # type: ignore[method-assign]
    result = run(calls, instance_res())
    assert result.status is DeleteStatus.SKIPPED and calls.deletes == [], what
    assert [(s.id, s.reason) for s in result.skipped] == [("1", "changed_since_read")]


def test_a_vm_renamed_since_its_read_is_left_not_taken_for_gone() -> None:
    calls = StubCalls({"vm": vm()})
    calls.get = answers(None)  # type: ignore[method-assign]  # no longer under that name; still found by id
    result = run(calls, instance_res())
    assert result.status is DeleteStatus.SKIPPED and result.deleted == () and calls.deletes == []
    assert [(s.id, s.reason) for s in result.skipped] == [("1", "changed_since_read")]


def test_a_vm_gone_under_its_name_and_by_its_id_is_deleted_without_a_call() -> None:
    calls = StubCalls({"vm": vm()})
    calls.get = answers(None)  # type: ignore[method-assign]
    calls.find = answers([vm()], [vm()], [])  # type: ignore[method-assign]  # read, judged again, gone
    result = run(calls, instance_res())
    assert (result.status, result.deleted) == (DeleteStatus.DELETED, ("1",)) and calls.deletes == []


@pytest.mark.parametrize(("again", "reason"), [
    (vm(labels=PROTECTED), "protected"), (vm(labels={"provider_ref": "zzzzzzzzzzzz"}), "ref_changed"),
    (vm("STOPPING"), "changed_since_read"), (vm(disks=(AUTO_DELETE,)), "blast_unlisted"),
], ids=["protect-label", "another-ref", "stopping", "auto-delete-disk"])
def test_a_vm_judged_again_on_a_read_by_id_right_before_the_call(again: compute.Instance, reason: str) -> None:
    # the second read by id (the owner judged again) shows it changed since its judgement
    calls = StubCalls({"vm": vm(), "data": data_disk()})
    calls.find = answers([vm()], [again])  # type: ignore[method-assign]
    result = run(calls, instance_res())
    assert result.status is DeleteStatus.SKIPPED and calls.deletes == []
    assert (ZONE, "vm") not in calls.gets  # left before its name is even checked
    assert [(s.id, s.reason) for s in result.skipped][0] == ("1", reason)


def test_a_read_by_id_that_answers_another_id_is_unreadable_not_gone() -> None:
    calls = StubCalls({"vm": vm()})
    calls.find = lambda spec, location, resource_id: [vm(id_=2)]  # type: ignore[method-assign]
    result = run(calls, instance_res())
    assert result.status is DeleteStatus.SKIPPED and result.deleted == () and calls.deletes == []
    assert ("1", "unreadable") in {(s.id, s.reason) for s in result.skipped}


# ---- what the deleter no longer takes from a listing (rule 21) ------------------------------


def test_a_listed_vm_without_a_name_is_still_found_by_its_id() -> None:
    # (was: ``missing_details`` skipped the group) the name a call takes comes from the read
    calls = StubCalls({"vm": vm()})
    result = run(calls, instance_res(name="", zone=""))
    assert (result.status, result.deleted) == (DeleteStatus.DELETED, ("1",))
    assert calls.gets == [(ZONE, "vm")] and calls.deletes == ["vm"]


def test_a_listed_disk_without_a_name_or_link_goes_after_its_vm_as_the_reads_show_it() -> None:
    # the disk's attachment comes from the VM's read and the disk's own (its self link), not the listing
    keep = compute.AttachedDisk(source=DISK_LINK, auto_delete=False, boot=False)
    calls = StubCalls({"vm": vm(disks=(keep,)), "data": data_disk()},
                      effects={"vm": {"vm": None, "data": data_disk(users=())}})
    disk = Resource(kind=ResourceKind.DISK, id="7", region=ZONE, tags=TAGS, details={})
    result = run(calls, instance_res(name=""), disk)
    assert (result.status, result.deleted, result.attached) == (DeleteStatus.DELETED, ("1", "7"), ("7",))
    assert calls.deletes == ["vm", "data"]


def test_a_listed_tag_of_another_ref_is_not_read_the_fresh_labels_are() -> None:
    # (was: ``ref_mismatch`` skipped the group on the listed tag) the VM as read now carries the group's ref
    calls = StubCalls({"vm": vm()})
    result = run(calls, instance_res(tags={"provider_ref": "zzzzzzzzzzzz"}))
    assert (result.status, result.deleted) == (DeleteStatus.DELETED, ("1",)) and calls.deletes == ["vm"]


@pytest.mark.parametrize(("labels", "reason"), [
    ({"provider_ref": "zzzzzzzzzzzz"}, "ref_changed"), ({}, "ref_missing"),
    ({**TAGS, "orphan-cleanup-protect": ""}, "protected"),
])
def test_a_listed_tag_of_the_group_does_not_save_a_vm_whose_fresh_labels_differ(labels: dict[str, str],
                                                                                reason: str) -> None:
    calls = StubCalls({"vm": vm(labels=labels)})
    result = run(calls, instance_res())
    assert result.status is DeleteStatus.SKIPPED and calls.deletes == []
    assert [(s.id, s.reason) for s in result.skipped] == [("1", reason)]


# ---- a shape no listing could produce: refused before any call -------------------------------


@pytest.mark.parametrize(
    ("resource", "primary", "problem"),
    [
        (instance_res(), "2", "primary 2 is not an instance of the group"),  # was: primary_missing
        (Resource(kind=ResourceKind.VOLUME, id="1", region=ZONE, tags=TAGS,
                  details={"name": "vm", "zone": ZONE}), "1", "not a kind this cloud lists"),  # was: unsupported_kind
    ],
    ids=["primary_missing", "unsupported_kind"],
)
def test_malformed_groups_touch_nothing(resource: Resource, primary: str, problem: str) -> None:
    calls = StubCalls({"vm": vm()})
    with pytest.raises(ProviderError, match=problem):
        run(calls, resource, primary=primary)
    assert calls.finds == [] and calls.gets == [] and calls.deletes == []


# ---- the final read's blast: its disks' labels as that read shows them -------------------------

BOOT_LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/disks/boot"
CREATED = "2026-11-01T00:00:00.000-07:00"


def booted_vm() -> compute.Instance:
    """A VM whose own boot disk (no labels, created with it) is deleted along with it."""
    boot = compute.AttachedDisk(source=BOOT_LINK, auto_delete=True, boot=True)
    return compute.Instance(id=1, name="vm", status="RUNNING", labels=TAGS, self_link=VM_LINK, disks=[boot],
                            creation_timestamp=CREATED)


def boot_disk(labels: dict[str, str]) -> compute.Disk:
    return compute.Disk(id=9, name="boot", status="READY", labels=labels, self_link=BOOT_LINK, users=[VM_LINK],
                        creation_timestamp=CREATED, last_attach_timestamp=CREATED)


def boot_reads(calls: StubCalls, *labels: dict[str, str]) -> None:
    """The boot disk read by name (the blast) with ``labels`` in turn: judged, then judged again."""
    disk = answers(*(boot_disk(lab) for lab in labels))
    by_name = calls.get
    calls.get = lambda spec, where, name: disk() if name == "boot" else by_name(spec, where, name)  # type: ignore


def test_the_own_boot_disk_goes_with_the_vm_as_the_final_read_shows_it() -> None:
    calls = StubCalls({"vm": booted_vm()})
    boot_reads(calls, {}, {})
    result = run(calls, instance_res())
    assert (result.status, result.deleted) == (DeleteStatus.DELETED, ("1",)) and calls.deletes == ["vm"]


def test_a_protect_label_on_the_final_reads_blast_stops_the_delete() -> None:
    calls = StubCalls({"vm": booted_vm()})
    boot_reads(calls, {}, {"orphan-cleanup-protect": ""})  # protected since the blast was judged
    result = run(calls, instance_res())
    assert calls.deletes == [], "instances.delete called though the final read shows its boot disk protected"
    assert result.status is DeleteStatus.SKIPPED and ("9", "blast_protected") in {(s.id, s.reason)
                                                                                 for s in result.skipped}
