"""Disks kept as snapshots on Compute Engine (issue #15 item 4): the real google-cloud-compute
client against the fake Compute server. With ``snapshot_before_delete`` an orphan disk that
would not go with its instance is snapshotted (``disks.createSnapshot``, labelled with the
ref and the disk id) and deleted once the snapshot is ``READY``; with ``retain_snapshots_days``
our snapshots are listed once that old and deleted as leftovers of their ref."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.provider import GcpProvider
from tests.support.gcp_fake import FakeCompute
from tests.support.listing import collect

REF = "aaaaaaaaaaa1"
ZONE, REGION = "us-central1-a", "us-central1"
SOURCE = "orphan-cleanup-source"


def provider(gcp: FakeCompute, regions: tuple[str, ...] = (REGION,), **settings: object) -> GcpProvider:
    backend = Backend(id="gcp-snap", provider="gcp", account=gcp.project, regions=regions, settings=settings)
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url),
                       timeout=5.0, poll_interval=0.01)


def ours(gcp: FakeCompute, disk_id: str, *, zone: str = ZONE, **kw: object) -> dict:
    """A snapshot as the deleter takes one (``gcp_snapshot``): named ``oc-<ref>-<disk id>``,
    labelled with the ref and, as its source, the id of the disk it was taken of."""
    disk = {"selfLink": f"https://compute.googleapis.com/compute/v1/projects/{gcp.project}/zones/{zone}/disks/d{disk_id}",
            "id": disk_id, "sizeGb": "10"}
    return gcp.add_snapshot(f"oc-{REF}-{disk_id}", disk=disk, zone=zone,
                            labels={"provider_ref": REF, SOURCE: disk_id}, **kw)  # type: ignore[arg-type]


def only_group(p: GcpProvider):
    [group] = collect(p).groups
    return group


def test_an_orphan_disk_is_snapshotted_with_its_ref_then_deleted(gcp: FakeCompute) -> None:
    # Given: an orphan instance with a boot disk that goes with it and a data disk that does not
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    boot = gcp.add_disk("vm-boot", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", auto_delete=True)
    data = gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", auto_delete=False)
    p = provider(gcp, snapshot_before_delete=True)
    group = only_group(p)

    # When
    result = p.delete_resource_group(group)

    # Then: one snapshot, of the data disk only, labelled, READY, and the disk is gone
    name = f"oc-{REF}-{data['id']}"
    assert gcp.snapshot_names() == {name}
    snap = gcp.snapshot(name)
    assert snap is not None and snap["status"] == "READY"
    assert snap["labels"] == {"provider_ref": REF, SOURCE: data["id"]} and snap["sourceDiskId"] == data["id"]
    assert result.status is DeleteStatus.DELETED and result.snapshots == ((data["id"], name),)
    assert gcp.names("disks") == gcp.names("instances") == set()
    assert boot["id"] in result.deleted and data["id"] in result.deleted
    # the snapshot was taken before the disk's delete (the only DELETE of a disk)
    paths = [(c.method, c.path) for c in gcp.calls]
    create = paths.index(("POST", f"/compute/v1/projects/{gcp.project}/zones/{ZONE}/disks/vm-data/createSnapshot"))
    delete = paths.index(("DELETE", f"/compute/v1/projects/{gcp.project}/zones/{ZONE}/disks/vm-data"))
    assert create < delete and gcp.count("POST", "/createSnapshot") == 1


def test_a_snapshot_still_being_taken_keeps_the_disk_until_a_later_call(gcp: FakeCompute) -> None:
    data = gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF})
    gcp.snapshot_status = "CREATING"
    p = provider(gcp, snapshot_before_delete=True)
    group = only_group(p)
    name = f"oc-{REF}-{data['id']}"

    first = p.delete_resource_group(group)

    assert first.status is DeleteStatus.DELETING and first.pending == (data["id"],)
    assert first.snapshots == () and first.snapshots_pending == ((data["id"], name),)
    assert gcp.get("disks", ZONE, "lost") is not None

    # the next call reads the same snapshot (no second one) and deletes once it is READY
    gcp.set_snapshot_field(name, "status", "READY")
    second = p.delete_resource_group(group)
    assert second.status is DeleteStatus.DELETED and second.snapshots == ((data["id"], name),)
    assert gcp.count("POST", "/createSnapshot") == 1 and gcp.get("disks", ZONE, "lost") is None


@pytest.mark.parametrize("disk_status", ["CREATING", "RESTORING", "DELETING", "SOMETHING_NEW"])
def test_a_disk_that_is_not_ready_is_not_snapshotted_and_waits(gcp: FakeCompute, disk_status: str) -> None:
    gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF})
    p = provider(gcp, snapshot_before_delete=True)
    group = only_group(p)
    gcp.set_status("disks", ZONE, "lost", disk_status)

    result = p.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETING and result.snapshots_pending == ()
    assert gcp.count("POST", "/createSnapshot") == 0 and gcp.get("disks", ZONE, "lost") is not None


@pytest.mark.parametrize("status", ["FAILED", "DELETING", "SOMETHING_NEW", None, ...],
                         ids=["failed", "deleting", "unknown", "null", "missing"])
def test_a_snapshot_that_is_not_ready_nor_being_taken_keeps_the_disk_and_fails(gcp: FakeCompute,
                                                                                status: object) -> None:
    data = gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF})
    p = provider(gcp, snapshot_before_delete=True)
    group = only_group(p)
    gcp.add_snapshot(f"oc-{REF}-{data['id']}", disk=data, labels={"provider_ref": REF, SOURCE: data["id"]})
    gcp.set_snapshot_field(f"oc-{REF}-{data['id']}", "status", status)

    with pytest.raises(ProviderError):
        p.delete_resource_group(group)

    assert gcp.get("disks", ZONE, "lost") is not None and gcp.count("DELETE", "/disks/") == 0


@pytest.mark.parametrize("shape", [{"labels": ...}, {"labels": {"provider_ref": REF}}, {"status": 7},
                                   {"sourceDiskId": "1"}, {"labels": {"provider_ref": "bbbbbbbbbbb2"}}],
                         ids=["no-labels", "no-source-label", "odd-status", "other-disk", "other-ref"])
def test_a_snapshot_of_that_name_that_is_not_ours_keeps_the_disk(gcp: FakeCompute, shape: dict) -> None:
    data = gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF})
    p = provider(gcp, snapshot_before_delete=True)
    group = only_group(p)
    name = f"oc-{REF}-{data['id']}"
    gcp.add_snapshot(name, disk=data, labels={"provider_ref": REF, SOURCE: data["id"]})
    for field, value in shape.items():
        gcp.set_snapshot_field(name, field, value)

    with pytest.raises(ProviderError):
        p.delete_resource_group(group)

    assert gcp.get("disks", ZONE, "lost") is not None and gcp.count("DELETE", "/disks/") == 0


def test_without_the_setting_no_snapshot_is_taken_nor_listed(gcp: FakeCompute) -> None:
    gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_snapshot("old", labels={"provider_ref": REF}, created=datetime.now(UTC) - timedelta(days=400))
    p = provider(gcp)
    group = only_group(p)  # the old snapshot is not listed: retention unset keeps it forever

    result = p.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETED and result.snapshots == ()
    assert gcp.count(None, "snapshot") == 0 and gcp.count(None, "Snapshot") == 0
    assert gcp.snapshot_names() == {"old"}


def test_expired_snapshots_are_listed_and_deleted_young_ones_are_not(gcp: FakeCompute) -> None:
    old = datetime.now(UTC) - timedelta(days=8)
    expired = ours(gcp, "101", created=old)
    young = ours(gcp, "102", created=datetime.now(UTC) - timedelta(days=6))
    gcp.add_snapshot("not-ours", zone=ZONE, created=old)
    # a backup that copied the disk's ref label (a snapshot schedule): not the deleter's (SAFETY.md rule 15)
    gcp.add_snapshot("a-backup", zone=ZONE, labels={"provider_ref": REF}, created=old)
    elsewhere = ours(gcp, "103", zone="europe-west1-b", created=old)
    no_source = ours(gcp, "104", created=old)
    gcp.set_snapshot_field(no_source["name"], "sourceDisk", ...)
    no_time = ours(gcp, "105")
    gcp.set_snapshot_field(no_time["name"], "creationTimestamp", ...)
    p = provider(gcp, retain_snapshots_days=7)

    listing = collect(p)
    [group] = listing.groups
    assert listing.failures == ()
    assert [(r.kind, r.id) for r in group.resources] == [(ResourceKind.SNAPSHOT, expired["id"])]
    assert group.provider_ref == REF and group.region == ZONE and group.primary_id is None
    [list_call] = [c for c in gcp.calls if c.path.endswith("/global/snapshots")]
    assert list_call.query["filter"] == "labels.provider_ref:*"

    result = p.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETED and result.deleted == (expired["id"],)
    assert gcp.snapshot_names() == {young["name"], "not-ours", "a-backup", elsewhere["name"], no_source["name"],
                                    no_time["name"]}
    assert gcp.count("POST", "/global/operations/") >= 1  # waited at the fake's global operations
    # the young one is never listed: the next listing is empty, nothing to hold a cycle
    assert collect(p).groups == ()


def test_the_snapshot_listing_pages_and_a_failed_page_fails_every_region(gcp: FakeCompute) -> None:
    old = datetime.now(UTC) - timedelta(days=30)
    ids = {ours(gcp, f"20{n}", created=old)["id"] for n in range(5)}
    backend = Backend(id="gcp-snap", provider="gcp", account=gcp.project, regions=(REGION, "us-east1"),
                      settings={"retain_snapshots_days": 7})
    p = GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url), timeout=5.0, page_size=2)

    [group] = collect(p).groups
    assert {r.id for r in group.resources} == ids
    assert sum(1 for c in gcp.calls if c.path.endswith("/global/snapshots")) == 3

    gcp.add_fault("GET", "/global/snapshots", status=503, times=1)
    listing = collect(p)
    assert listing.groups == () and {f.region for f in listing.failures} == {REGION, "us-east1"}


def test_a_snapshot_is_not_deleted_while_a_disk_of_its_group_is_kept(gcp: FakeCompute) -> None:
    gcp.add_instance("other", zone=ZONE)  # not ours: it keeps the disk in use
    gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF}, attached_to="other")
    kept = ours(gcp, "301", created=datetime.now(UTC) - timedelta(days=8))
    p = provider(gcp, retain_snapshots_days=7, snapshot_before_delete=True)
    group = only_group(p)
    assert {r.kind for r in group.resources} == {ResourceKind.DISK, ResourceKind.SNAPSHOT}

    result = p.delete_resource_group(group)

    assert result.status is DeleteStatus.DELETING and len(result.pending) == 2
    assert gcp.snapshot_names() == {kept["name"]} and gcp.count("DELETE", "/global/snapshots/") == 0


@pytest.mark.parametrize(("settings", "age_days", "kept"), [
    ({}, 400, True),  # retention unset: our snapshots are kept forever
    ({"retain_snapshots_days": 7}, 6, True),  # younger than the retention
    ({"retain_snapshots_days": 7}, 8, False),  # control: past it, it goes
])
def test_the_deleter_rechecks_a_snapshots_age_against_the_retention(gcp: FakeCompute, settings: dict,
                                                                   age_days: int, kept: bool) -> None:
    # Given: a leftover disk of the ref and one of our snapshots, in one group as a listing with a
    # one-day retention builds it: what a forged listing batch can hand any backend (SAFETY.md rule 12)
    disk = gcp.add_disk("lost", zone=ZONE, labels={"provider_ref": REF})
    snap = ours(gcp, "401", created=datetime.now(UTC) - timedelta(days=age_days))
    group = only_group(provider(gcp, retain_snapshots_days=1))
    assert {r.id for r in group.resources} == {disk["id"], snap["id"]}

    # When: the backend's own retention deletes
    result = provider(gcp, **settings).delete_resource_group(group)

    # Then: the snapshot's age as re-read decides, never the listing
    if kept:
        assert (snap["id"], "snapshot_retained") in {(s.id, s.reason) for s in result.skipped}
        assert gcp.snapshot_names() == {snap["name"]} and gcp.count("DELETE", "/global/snapshots/") == 0
    else:
        assert snap["id"] in result.deleted and gcp.snapshot_names() == set()
    assert result.status is DeleteStatus.DELETED and disk["id"] in result.deleted
