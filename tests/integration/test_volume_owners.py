"""Volume owners (README, C1: ``provider_refs.owner_type`` ``volume``, a ``volumes`` row) on real
parts: the embedded Postgres, the moto server, the fake Compute server with the real
google-cloud-compute client. One delete cycle of a backend holding every case, on each cloud:
a leaked volume of a hard-deleted, deleted or soft-deleted owner is deleted; a live owner's
lost attempt is deleted beside its recorded volume, which stays tracked; a pending or deleting
owner's volume is skipped; a volume attached to a live instance is skipped ``in_use``, never
deleted. Then the deleter alone (SAFETY.md rule 21): a volume attached between the plan and
the delete is refused, and ``snapshot_before_delete`` keeps a volume owner's volume as a
snapshot first."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from orphan_cleanup.core.digest import digest
from orphan_cleanup.core.listing_rules import volume_groups
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.providers.aws.provider import build_aws_provider
from orphan_cleanup.providers.gcp.provider import build_gcp_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_aws_provider import EAST, create_volume, ec2, exists, make_provider, run_instance
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend, add_ref, add_volume, db_now, make_ref
from tests.support.listing import collect

TAG = "provider_ref"
ZONE, REGION = "us-central1-a", "us-central1"


def pipeline(db: Database, provider_for: Any) -> Pipeline:
    return Pipeline(settings=Settings.explicit(confirm_seconds=0, margin_seconds=0), db=db,
                    provider_for=provider_for, listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def verdicts(report: Any) -> dict[str, tuple[str, str, str]]:
    """Each group of ``run --json`` by its primary: (verdict, reason, action); every group of a
    volume owner holds its volume alone."""
    out = {}
    for g in report.c3()["groups"]:
        assert [r["id"] for r in g["resources"]] == [g["primary_id"]], g
        out[g["primary_id"]] = (g["verdict"], g["reason"], g["action"])
    return out


def ledger_cases(db: Database, backend_id: str, make: Any, region: str) -> dict[str, str]:
    """Every volume owner's case, its volume made by ``make(ref)`` (returns the volume's id)
    before its ledger row says so. Returns {case: volume id}."""
    hour_ago = db_now(db) - timedelta(hours=1)
    ids: dict[str, str] = {}
    ref = add_ref(db, owner_type="volume", issued_at=hour_ago)  # the owner row hard-deleted
    ids["hard_deleted"] = make(ref)
    ref = make_ref()
    ids["deleted"] = make(ref)
    add_volume(db, ref=ref, name="dataset-deleted", status="deleted", backend_id=backend_id,
               primary_id=ids["deleted"], region=region,
               issued_at=hour_ago, created_at=hour_ago, provisioned_at=hour_ago, deleted_at=hour_ago)
    ref = make_ref()
    ids["soft_deleted"] = make(ref)
    add_volume(db, ref=ref, status="active", backend_id=backend_id, primary_id=ids["soft_deleted"], region=region,
               issued_at=hour_ago, created_at=hour_ago, provisioned_at=hour_ago, deleted_at=hour_ago)
    ref = make_ref()  # a retry: the first attempt leaked, the second is recorded
    ids["lost_attempt"] = make(ref)
    ids["recorded"] = make(ref)
    add_volume(db, ref=ref, status="active", backend_id=backend_id, primary_id=ids["recorded"], region=region,
               issued_at=hour_ago, created_at=hour_ago)
    with db.connection() as conn:  # provisioned once the provider answered the second create
        conn.run("UPDATE volumes SET provisioned_at = clock_timestamp() WHERE provider_ref = :r", r=ref)
    ref = make_ref()
    ids["pending"] = make(ref)
    add_volume(db, ref=ref, status="pending", issued_at=hour_ago, created_at=hour_ago)
    ref = make_ref()
    ids["deleting"] = make(ref)
    add_volume(db, ref=ref, status="deleting", backend_id=backend_id, primary_id=ids["deleting"], region=region,
               issued_at=hour_ago, created_at=hour_ago, provisioned_at=hour_ago)
    return ids


EXPECTED = {
    "hard_deleted": ("orphan", "owner_deleted", "deleted"),
    "deleted": ("orphan", "owner_soft_deleted", "deleted"),
    "soft_deleted": ("orphan", "owner_soft_deleted", "deleted"),
    "lost_attempt": ("orphan", "primary_mismatch", "deleted"),
    "recorded": ("tracked", "tracked", "none"),
    "pending": ("skipped", "owner_pending", "none"),
    "deleting": ("skipped", "owner_deleting", "none"),
    "attached": ("skipped", "in_use", "none"),
}
GONE = {"hard_deleted", "deleted", "soft_deleted", "lost_attempt"}


# ---- AWS, on the moto server -------------------------------------------------------------

@pytest.mark.usefixtures("moto_reset")
def test_aws_a_delete_cycle_deletes_leaked_volumes_only(session, emptied_db: Database) -> None:
    # Given: a backend on moto's account with every volume owner's case, and a volume of a
    # hard-deleted owner attached to a live instance that is not the platform's
    db, client = emptied_db, ec2(EAST)
    add_backend(db, "aws-vol", regions=(EAST,), mode="delete")
    ids = ledger_cases(db, "aws-vol", lambda ref: create_volume(client, ref), EAST)
    stranger = run_instance(client, None)
    ref = add_ref(db, owner_type="volume", issued_at=db_now(db) - timedelta(hours=1))
    ids["attached"] = create_volume(client, ref, attach_to=stranger)
    time.sleep(1.5)  # the deleted owner ended well after its volume was made: its orphan_since is that end
    with db.connection() as conn:  # (and only the volumes row names it)
        conn.run("UPDATE volumes SET deleted_at = clock_timestamp() WHERE name = 'dataset-deleted'")
        conn.run("UPDATE provider_refs SET owner_name = NULL WHERE owner_type = 'volume'")

    # When: one delete cycle runs
    report = run_cycle(pipeline(db, lambda b: build_aws_provider(b, connect_timeout=2, read_timeout=10,
                                                                 session=session)), "aws-vol", mode="delete")

    # Then: each volume has its verdict; only the leaked ones are gone
    assert verdicts(report) == {ids[case]: want for case, want in EXPECTED.items()}
    assert {case for case, vid in ids.items() if not exists(client, "volume", vid)} == GONE
    assert report.outcome == "unsettled"  # the skipped ones keep the backend unsettled
    [attached] = [g for g in report.c3()["groups"] if g["primary_id"] == ids["attached"]]
    assert attached["detail"] == f"{ids['attached']} is attached to instance {stranger['InstanceId']}:" \
                                 " never deleted from under it"
    # and the C6 digest names each deleted volume's owner and dates it from the owner's end
    doc = digest(LedgerStore(db).digest_facts(report.cycle_id), interval_seconds=900)
    assert doc is not None
    deleted = {item["primary_id"]: item for item in doc["deleted"]}
    assert set(deleted) == {ids[case] for case in GONE}
    with db.connection() as conn:
        [[name, ended]] = conn.run("SELECT name, deleted_at FROM volumes WHERE primary_id = :p", p=ids["deleted"])
    assert deleted[ids["deleted"]]["owner_name"] == name == "dataset-deleted"
    assert abs(datetime.fromisoformat(deleted[ids["deleted"]]["orphan_since"]) - ended) < timedelta(seconds=1)


@pytest.mark.usefixtures("moto_reset")
def test_aws_the_deleter_refuses_a_volume_attached_after_the_plan(session, calls) -> None:
    # Given: a volume owner's leaked volume, listed detached (its group: the volume alone)
    client = ec2(EAST)
    ref = make_ref()
    vol = create_volume(client, ref)
    provider = make_provider(session)
    [listed] = collect(provider).groups
    [group] = volume_groups(listed)
    assert group.primary_id == vol
    # When: an instance attaches it before the deleter acts
    holder = run_instance(client, None)
    client.attach_volume(VolumeId=vol, InstanceId=holder["InstanceId"], Device="/dev/sdf")
    calls.clear()
    result = provider.delete_resource_group(group)
    # Then: nothing is deleted or detached; the volume is named in use, the group not done
    assert exists(client, "volume", vol)
    assert not [op for op in calls.ops() if op.startswith(("Delete", "Detach", "Terminate"))]
    assert [(s.id, s.reason) for s in result.skipped] == [(vol, "in_use")]
    assert result.status is not DeleteStatus.DELETED and vol in result.pending


@pytest.mark.usefixtures("moto_reset")
def test_aws_a_volume_owners_volume_is_snapshotted_before_its_delete(session, calls) -> None:
    client = ec2(EAST)
    ref = make_ref()
    vol = create_volume(client, ref)
    provider = make_provider(session, snapshot_before_delete=True)
    [group] = volume_groups(collect(provider).groups[0])
    calls.clear()

    result = provider.delete_resource_group(group)

    [snap] = client.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "volume-id", "Values": [vol]}])[
        "Snapshots"]
    assert {t["Key"]: t["Value"] for t in snap["Tags"]} == {TAG: ref, "orphan-cleanup-source": vol}
    assert calls.ops().index("CreateSnapshot") < calls.ops().index("DeleteVolume")
    assert result.status is DeleteStatus.DELETED and result.snapshots == ((vol, snap["SnapshotId"]),)
    assert not exists(client, "volume", vol)


@pytest.mark.usefixtures("moto_reset")
def test_aws_holds_volume_confirms_only_a_live_volume_of_the_ref(session) -> None:
    client = ec2(EAST)
    ref, other = make_ref(), make_ref()
    vol = create_volume(client, ref)
    provider = make_provider(session)
    assert provider.holds_volume(EAST, vol, ref)
    assert not provider.holds_volume(EAST, vol, other)  # another ref's
    assert not provider.holds_volume("eu-west-1", vol, ref)  # not a region of the backend
    assert not provider.holds_volume(EAST, "vol-0123456789abcdef0", ref)  # no such volume
    assert not provider.holds_volume(EAST, "i-0123456789abcdef0", ref)  # not a volume id
    client.delete_volume(VolumeId=vol)
    assert not provider.holds_volume(EAST, vol, ref)


# ---- GCP, on the fake Compute server ----------------------------------------------------

def test_gcp_a_delete_cycle_deletes_leaked_disks_only(gcp: FakeCompute, emptied_db: Database) -> None:
    # Given: the same cases with disks, and a hard-deleted owner's disk a foreign VM uses
    db = emptied_db
    add_backend(db, "gcp-vol", provider="gcp", account=gcp.project, regions=(REGION,), mode="delete")
    names: dict[str, str] = {}

    def make(ref: str) -> str:
        disk = gcp.add_disk(f"d-{len(names)}-{ref}", zone=ZONE, labels={TAG: ref})
        names[disk["id"]] = disk["name"]
        return str(disk["id"])

    ids = ledger_cases(db, "gcp-vol", make, ZONE)
    gcp.add_instance("stranger", zone=ZONE)
    ref = add_ref(db, owner_type="volume", issued_at=db_now(db) - timedelta(hours=1))
    held = gcp.add_disk("held", zone=ZONE, labels={TAG: ref}, attached_to="stranger")
    ids["attached"] = str(held["id"])
    names[ids["attached"]] = "held"

    # When: one delete cycle runs
    report = run_cycle(pipeline(db, lambda b: build_gcp_provider(b, endpoint=gcp.url, timeout=5)), "gcp-vol", mode="delete")

    # Then: the same verdicts as on AWS, and only the leaked disks are gone
    assert verdicts(report) == {ids[case]: want for case, want in EXPECTED.items()}
    assert {case for case, did in ids.items() if names[did] not in gcp.names("disks")} == GONE
    assert gcp.names("instances") == {"stranger"}
    [attached] = [g for g in report.c3()["groups"] if g["primary_id"] == ids["attached"]]
    assert attached["detail"] == f"{ids['attached']} is attached to instance stranger: never deleted from under it"


def test_gcp_the_deleter_refuses_a_disk_attached_after_the_plan(gcp: FakeCompute) -> None:
    from orphan_cleanup.core.backends import Backend
    from orphan_cleanup.providers.gcp.clients import build_gcp_clients
    from orphan_cleanup.providers.gcp.provider import GcpProvider

    backend = Backend(id="gcp-vol", provider="gcp", account=gcp.project, regions=(REGION,),
                      settings={"snapshot_before_delete": False})
    provider = GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url), timeout=5.0,
                           poll_interval=0.01)
    ref = make_ref()
    disk = gcp.add_disk("leaked", zone=ZONE, labels={TAG: ref})
    [listed] = collect(provider).groups
    [group] = volume_groups(listed)
    assert group.primary_id == str(disk["id"]) and group.region == ZONE
    assert provider.holds_volume(ZONE, str(disk["id"]), ref) and not provider.holds_volume(ZONE, str(disk["id"]),
                                                                                           make_ref())
    # an instance attaches it before the deleter acts
    gcp.add_instance("late", zone=ZONE)
    gcp.attach_disk("late", "leaked", zone=ZONE)

    result = provider.delete_resource_group(group)

    assert "leaked" in gcp.names("disks") and gcp.count("DELETE") == 0
    assert [(s.id, s.reason) for s in result.skipped] == [(str(disk["id"]), "in_use")]
    assert result.status is not DeleteStatus.DELETED
