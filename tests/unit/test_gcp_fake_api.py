"""The fake Compute server's routes for reads by id, attached disks, creation times, the
"in use" refusal and the operation hook (routing and wire format through ``handle``, no
sockets; each body is parsed by the real ``compute_v1`` types, which refuse unknown fields)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.cloud import compute_v1

from tests.support.gcp_fake import FakeCompute
from tests.support.gcp_fake_wire import WireError

P = "/compute/v1/projects/p-one"
ZONE = "us-central1-a"
REF = {"provider_ref": "aaaaaaaaaaa1"}


@pytest.fixture
def fake() -> FakeCompute:
    return FakeCompute("p-one")


def ok(fake: FakeCompute, method: str, path: str, query: dict[str, str] | None = None,
       body: dict[str, Any] | None = None) -> dict[str, Any]:
    status, answer = fake.handle(method, P + path, query or {}, json.dumps(body).encode() if body else b"")
    assert status == 200, answer
    return answer


def refused(fake: FakeCompute, method: str, path: str, query: dict[str, str] | None = None,
            body: dict[str, Any] | None = None) -> tuple[int, str]:
    status, answer = fake.handle(method, P + path, query or {}, json.dumps(body).encode() if body else b"")
    assert status != 200, answer
    return status, answer["error"]["errors"][0]["reason"]


def listed_names(answer: dict[str, Any], coll: str = "instances") -> list[str]:
    if "items" in answer and isinstance(answer["items"], list):
        return [i["name"] for i in answer["items"]]
    return [i["name"] for scoped in answer["items"].values() for i in scoped.get(coll, [])]


# --- reads by id ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [f"/zones/{ZONE}/instances", "/aggregated/instances"])
def test_a_list_pinned_to_an_id_needs_no_label_term_and_finds_it_whatever_its_labels(fake: FakeCompute,
                                                                                 path: str) -> None:
    vm = fake.add_instance("vm", labels=REF)
    fake.add_instance("other", labels=REF)
    fake.set_labels("instances", ZONE, "vm", {})  # it lost its label: still found by id

    for text in (f"id = {vm['id']}", f"id={vm['id']}", f"(id = {vm['id']}) AND (status = RUNNING)"):
        answer = ok(fake, "GET", path, {"filter": text})
        assert listed_names(answer) == ["vm"], text
    compute_v1.InstanceList.from_json(json.dumps(ok(fake, "GET", f"/zones/{ZONE}/instances",
                                                    {"filter": f"id = {vm['id']}"})))
    assert listed_names(ok(fake, "GET", path, {"filter": "id = 4100000000000000001"})) == []


@pytest.mark.parametrize("kind", ["disk", "address", "snapshot"])
def test_zonal_regional_and_global_lists_read_by_id_too(fake: FakeCompute, kind: str) -> None:
    made = {"disk": lambda n: fake.add_disk(n), "address": lambda n: fake.add_address(n),
            "snapshot": lambda n: fake.add_snapshot(n)}[kind]
    wanted, _ = made("one"), made("two")
    path = {"disk": f"/zones/{ZONE}/disks", "address": "/regions/us-central1/addresses",
            "snapshot": "/global/snapshots"}[kind]

    answer = ok(fake, "GET", path, {"filter": f"id = {wanted['id']}"})

    assert [i["id"] for i in answer["items"]] == [wanted["id"]]
    parsed = {"disk": compute_v1.DiskList, "address": compute_v1.AddressList,
              "snapshot": compute_v1.SnapshotList}[kind].from_json(json.dumps(answer))
    assert [str(i.id) for i in parsed.items] == [wanted["id"]]


@pytest.mark.parametrize("text", ["", "name = vm", "status = RUNNING", "id != 4100000007919000013"])
def test_a_list_with_neither_label_term_nor_pinned_id_is_still_refused(fake: FakeCompute, text: str) -> None:
    fake.add_instance("vm", labels=REF)
    assert refused(fake, "GET", f"/zones/{ZONE}/instances", {"filter": text} if text else {}) == (400, "invalid")


@pytest.mark.parametrize("read", ["get", "list", "aggregated"])
def test_a_read_by_id_counts_against_a_stopping_instances_reads_exactly_as_a_get(fake: FakeCompute,
                                                                               read: str) -> None:
    # Given: an instance that stays STOPPING for two reads after its delete
    vm = fake.add_instance("vm", labels=REF, stopping_gets=2)
    fake.add_disk("vm-boot", labels=REF, attached_to="vm", auto_delete=True, boot=True)
    ok(fake, "DELETE", f"/zones/{ZONE}/instances/vm")
    by_id = {"filter": f"id = {vm['id']}"}

    def seen() -> list[str]:
        if read == "get":
            status, body = fake.handle("GET", f"{P}/zones/{ZONE}/instances/vm", {})
            return [body["status"]] if status == 200 else []
        path = f"/zones/{ZONE}/instances" if read == "list" else "/aggregated/instances"
        answer = ok(fake, "GET", path, by_id)
        items = answer["items"] if read == "list" else [
            i for scoped in answer["items"].values() for i in scoped.get("instances", [])]
        return [i["status"] for i in items]

    # a listing by label reads nothing of it
    assert listed_names(ok(fake, "GET", "/aggregated/instances", {"filter": "labels.provider_ref:*"})) == ["vm"]
    # When / Then: two reads see it STOPPING, the third finds it gone, with its autoDelete disk
    assert [seen(), seen(), seen()] == [["STOPPING"], ["STOPPING"], []]
    assert fake.names("instances") == fake.names("disks") == set()


# --- creation times ------------------------------------------------------------------------


def test_explicit_creation_times_are_written_as_the_api_writes_them(fake: FakeCompute) -> None:
    day_ago = datetime.now(UTC) - timedelta(days=1)
    disk = fake.add_disk("old", created=day_ago)
    vm = fake.add_instance("vm", created="2024-05-01T09:30:00.123-07:00")
    address = fake.add_address("ip", created=day_ago)
    assert datetime.fromisoformat(disk["creationTimestamp"]) == day_ago.replace(
        microsecond=day_ago.microsecond // 1000 * 1000)
    assert vm["creationTimestamp"] == "2024-05-01T09:30:00.123-07:00"
    assert address["creationTimestamp"] == disk["creationTimestamp"]
    with pytest.raises(ValueError, match="timezone"):
        fake.add_disk("naive", created=datetime(2024, 1, 1))  # noqa: DTZ001 - the point of the test


# --- attached disks ------------------------------------------------------------------------


def test_attach_and_detach_disk_keep_both_sides_and_answer_operations(fake: FakeCompute) -> None:
    fake.add_instance("vm", labels=REF)
    data = fake.add_disk("data")

    op = ok(fake, "POST", f"/zones/{ZONE}/instances/vm/attachDisk",
            body={"source": f"projects/p-one/zones/{ZONE}/disks/data", "autoDelete": True})

    assert (op["operationType"], op["status"], op["targetLink"]) == (
        "attachDisk", "RUNNING", fake.get("instances", ZONE, "vm")["selfLink"])  # type: ignore[index]
    vm = compute_v1.Instance.from_json(json.dumps(ok(fake, "GET", f"/zones/{ZONE}/instances/vm")))
    [attached] = vm.disks
    assert (attached.source, attached.device_name, attached.index, attached.boot, attached.auto_delete) == (
        data["selfLink"], "persistent-disk-1", 1, False, True)
    disk = compute_v1.Disk.from_json(json.dumps(ok(fake, "GET", f"/zones/{ZONE}/disks/data")))
    assert list(disk.users) == [vm.self_link] and disk.last_attach_timestamp

    op = ok(fake, "POST", f"/zones/{ZONE}/instances/vm/detachDisk", {"deviceName": "persistent-disk-1"})

    assert op["operationType"] == "detachDisk"
    assert fake.get("instances", ZONE, "vm")["disks"] == []  # type: ignore[index]
    after = fake.get("disks", ZONE, "data")
    assert after is not None and after["users"] == [] and after["lastDetachTimestamp"]
    zone_op = ok(fake, "POST", f"/zones/{ZONE}/operations/{op['name']}/wait")
    assert zone_op["status"] == "DONE"


def test_a_boot_disk_is_swapped_only_while_the_instance_is_stopped(fake: FakeCompute) -> None:
    # Given: a running instance with its boot disk, and someone's disk created a day earlier
    fake.add_instance("vm", labels=REF)
    fake.add_disk("vm-boot", attached_to="vm", boot=True, auto_delete=True)
    foreign = fake.add_disk("foreign", created=datetime.now(UTC) - timedelta(days=1))

    # When / Then: refused while it runs, over the wire and by the helper, and nothing changed
    assert refused(fake, "POST", f"/zones/{ZONE}/instances/vm/detachDisk", {"deviceName": "vm-boot"}) == (
        400, "invalid")
    with pytest.raises(WireError, match="RUNNING"):
        fake.swap_boot_disk("vm", "foreign")
    assert [d["deviceName"] for d in fake.get("instances", ZONE, "vm")["disks"]] == ["vm-boot"]  # type: ignore[index]

    # once stopped: the old boot disk is detached, the foreign one attached as boot, autoDelete
    fake.set_status("instances", ZONE, "vm", "TERMINATED")
    vm = fake.swap_boot_disk("vm", "foreign")
    assert [(d["source"], d["boot"], d["autoDelete"], d["index"], d["deviceName"]) for d in vm["disks"]] == [
        (foreign["selfLink"], True, True, 0, "foreign")]
    assert fake.get("disks", ZONE, "vm-boot")["users"] == []  # type: ignore[index]
    assert fake.get("disks", ZONE, "foreign")["users"] == [vm["selfLink"]]  # type: ignore[index]


def test_the_boot_swap_over_the_wire_needs_a_stopped_instance_without_boot_disk(fake: FakeCompute) -> None:
    fake.add_instance("vm", status="TERMINATED")
    fake.add_disk("vm-boot", attached_to="vm", boot=True, auto_delete=True)
    fake.add_disk("foreign")
    boot = {"source": f"projects/p-one/zones/{ZONE}/disks/foreign", "boot": True, "autoDelete": True}

    assert refused(fake, "POST", f"/zones/{ZONE}/instances/vm/attachDisk", body=boot) == (400, "invalid")
    ok(fake, "POST", f"/zones/{ZONE}/instances/vm/detachDisk", {"deviceName": "vm-boot"})
    ok(fake, "POST", f"/zones/{ZONE}/instances/vm/attachDisk", body=boot)

    assert [(d["deviceName"], d["boot"]) for d in fake.get("instances", ZONE, "vm")["disks"]] == [  # type: ignore[index]
        ("persistent-disk-0", True)]


def test_a_disk_used_by_one_instance_is_neither_attached_to_another_nor_deleted(fake: FakeCompute) -> None:
    fake.add_instance("a")
    fake.add_instance("b")
    fake.add_disk("shared", attached_to="a")

    assert refused(fake, "POST", f"/zones/{ZONE}/instances/b/attachDisk",
                   body={"source": f"projects/p-one/zones/{ZONE}/disks/shared"}) == (
        400, "resourceInUseByAnotherResource")
    assert refused(fake, "DELETE", f"/zones/{ZONE}/disks/shared") == (400, "resourceInUseByAnotherResource")
    assert fake.names("disks") == {"shared"}


# --- the operation hook ------------------------------------------------------------------


def test_an_operation_hook_runs_once_when_the_mutation_is_accepted_before_its_operation_is_done(
        fake: FakeCompute) -> None:
    fake.add_disk("disk-a", labels=REF)
    fake.add_disk("disk-b", labels=REF)
    seen: list[bool] = []

    def reuse_b() -> None:
        seen.append(fake.get("disks", ZONE, "disk-a") is None)  # the delete of A was applied
        fake.remove("disks", ZONE, "disk-b")
        fake.add_disk("disk-b", labels={"orphan-cleanup-protect": "yes"})

    old_b = fake.get("disks", ZONE, "disk-b")
    fake.on_operation("/disks/disk-a", reuse_b, method="DELETE")
    ok(fake, "GET", f"/zones/{ZONE}/disks/disk-a")  # a read fires nothing
    op = ok(fake, "DELETE", f"/zones/{ZONE}/disks/disk-a")

    assert seen == [True] and op["status"] == "RUNNING"  # the client has not waited on it yet
    new_b = fake.get("disks", ZONE, "disk-b")
    assert new_b is not None and old_b is not None and new_b["id"] != old_b["id"]
    fake.add_disk("disk-a")
    ok(fake, "DELETE", f"/zones/{ZONE}/disks/disk-a")  # fired once only
    assert fake.get("disks", ZONE, "disk-b")["id"] == new_b["id"]  # type: ignore[index]
