"""The provisioner-side LedgerClient against a real ledger."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, aws_tag_specifications, gcp_labels, new_ref
from tests.support.ledger_helpers import db_now

REF_RE = re.compile(r"^[a-z0-9]{12}$")


# One migrated database for the module, emptied before each test.
@pytest.fixture
def db(emptied_db):
    return emptied_db


@pytest.fixture
def client(db):
    return LedgerClient(db)


def instance(db, instance_id):
    with db.connection() as conn:
        rows = conn.run("SELECT * FROM instances WHERE id = :i", i=instance_id)
        cols = [c["name"] for c in conn.columns]
    return dict(zip(cols, rows[0])) if rows else None


def test_issue_ref_is_committed_before_it_returns(db, client):
    # given another connection, open before the ref is issued
    with db.connection() as other:
        # when a ref is issued
        issued = client.issue_ref(owner_id="inst-42", owner_name="train-7")
        # then the other connection sees the ref and its pending owner at once
        assert other.run("SELECT owner_type, owner_id, owner_name, issued_at FROM provider_refs"
                         " WHERE provider_ref = :r", r=issued.provider_ref) == [
            ["instance", "inst-42", "train-7", issued.issued_at]]
        assert other.run("SELECT id, name, status, backend_id, primary_id FROM instances WHERE provider_ref = :r",
                         r=issued.provider_ref) == [["inst-42", "train-7", "pending", None, None]]
    assert issued.owner_id == "inst-42"


def test_refs_are_unique_and_well_formed(db, client):
    # when many refs are issued, from several threads at once (one client, as in a server)
    with ThreadPoolExecutor(max_workers=4) as pool:
        issued = list(pool.map(lambda _: client.issue_ref(), range(1000)))
    refs = [i.provider_ref for i in issued]
    # then all are distinct, match the contract pattern, and are all in the ledger with their owner
    assert len(set(refs)) == len(refs)
    assert all(REF_RE.fullmatch(r) for r in refs)
    assert all(i.owner_id == f"inst-{i.provider_ref}" for i in issued)
    with db.connection() as conn:
        assert conn.run("SELECT count(*) FROM provider_refs r JOIN instances i USING (provider_ref)"
                        " WHERE provider_ref = ANY(CAST(:r AS text[])) AND i.id = r.owner_id", r=refs) == [[1000]]


def test_the_ref_generator_alone():
    refs = [new_ref() for _ in range(5000)]
    assert len(set(refs)) == len(refs)
    assert all(REF_RE.fullmatch(r) for r in refs)
    # every character of the alphabet shows up: no accidental narrowing
    assert set("".join(refs)) == set("abcdefghijklmnopqrstuvwxyz0123456789")


def test_issue_ref_for_another_owner_type_creates_no_instance(db, client):
    issued = client.issue_ref(owner_id="bucket-owner-1", owner_type="bucket")
    with db.connection() as conn:
        assert conn.run("SELECT owner_type FROM provider_refs WHERE provider_ref = :r",
                        r=issued.provider_ref) == [["bucket"]]
        assert conn.run("SELECT count(*) FROM instances") == [[0]]
        assert conn.run("SELECT count(*) FROM volumes") == [[0]]


def test_issue_ref_for_a_gateway_creates_its_pending_instances_row(db, client):
    issued = client.issue_ref(owner_id="gw-owner-1", owner_type="gateway")
    with db.connection() as conn:
        assert conn.run("SELECT owner_type FROM provider_refs WHERE provider_ref = :r",
                        r=issued.provider_ref) == [["gateway"]]
        assert conn.run("SELECT id, status FROM instances") == [["gw-owner-1", "pending"]]
        assert conn.run("SELECT count(*) FROM volumes") == [[0]]


def volume(db, volume_id):
    with db.connection() as conn:
        rows = conn.run("SELECT status, backend_id, primary_id, region, provisioned_at IS NOT NULL,"
                        " deleted_at IS NOT NULL FROM volumes WHERE id = :i", i=volume_id)
    return rows[0] if rows else None


def test_a_volume_owner_goes_through_the_protocol_with_the_volume_calls(db, client):
    # given a volume owner's ref, committed with its pending volumes row before any provider call
    issued = client.issue_volume_ref(owner_id="data-1", owner_name="dataset-1")
    with db.connection() as conn:
        assert conn.run("SELECT owner_type, owner_id, owner_name FROM provider_refs WHERE provider_ref = :r",
                        r=issued.provider_ref) == [["volume", "data-1", "dataset-1"]]
        assert conn.run("SELECT id, name, provider_ref FROM volumes") == [["data-1", "dataset-1", issued.provider_ref]]
        assert conn.run("SELECT count(*) FROM instances") == [[0]]
    assert volume(db, "data-1") == ["pending", None, None, None, False, False]
    # when the platform records the volume and follows its life
    client.mark_volume_provisioning("data-1", backend_id="aws-prod", primary_id="vol-0abc", region="us-east-1")
    assert volume(db, "data-1") == ["provisioning", "aws-prod", "vol-0abc", "us-east-1", True, False]
    client.mark_volume_active("data-1")
    assert volume(db, "data-1")[0] == "active"
    client.mark_volume_deleting("data-1")
    assert volume(db, "data-1")[0] == "deleting"
    client.mark_volume_deleted("data-1")
    # then every transition is on the row, the deletion with its time
    assert volume(db, "data-1") == ["deleted", "aws-prod", "vol-0abc", "us-east-1", True, True]
    # and issue_ref with owner_type volume is the same call
    other = client.issue_ref(owner_type="volume")
    assert volume(db, f"volume-{other.provider_ref}")[0] == "pending"


def test_volume_calls_name_a_missing_volume_and_a_hard_delete_leaves_the_ref(db, client):
    with pytest.raises(ConfigError, match="no volume 'nope' in the ledger"):
        client.mark_volume_active("nope")
    issued = client.issue_volume_ref(owner_id="data-2")
    client.hard_delete_volume("data-2")
    assert volume(db, "data-2") is None
    with db.connection() as conn:
        assert conn.run("SELECT owner_type FROM provider_refs WHERE provider_ref = :r",
                        r=issued.provider_ref) == [["volume"]]


def test_hard_delete_leaves_the_ref(db, client):
    issued = client.issue_ref(owner_id="inst-1", owner_name="placeholder")
    client.hard_delete("inst-1")
    assert instance(db, "inst-1") is None
    with db.connection() as conn:
        assert conn.run("SELECT owner_id, owner_name FROM provider_refs WHERE provider_ref = :r",
                        r=issued.provider_ref) == [["inst-1", "placeholder"]]


def test_mark_provisioning_sets_provisioning_data_and_time(db, client):
    client.issue_ref(owner_id="inst-1")
    before = db_now(db)
    client.mark_provisioning("inst-1", backend_id="aws-prod", primary_id="i-0abc", region="us-east-1")
    after = db_now(db)
    row = instance(db, "inst-1")
    assert (row["status"], row["backend_id"], row["primary_id"], row["region"]) == (
        "provisioning", "aws-prod", "i-0abc", "us-east-1")
    assert before <= row["provisioned_at"] <= after
    assert row["terminated_at"] is None and row["deleted_at"] is None
    # a second call (e.g. a retry that reached idle) keeps the first provisioning time
    client.mark_provisioning("inst-1", backend_id="aws-prod", primary_id="i-0abc", region="us-east-1",
                             status=OwnerStatus.IDLE)
    again = instance(db, "inst-1")
    assert again["status"] == "idle"
    assert again["provisioned_at"] == row["provisioned_at"]


def test_set_status(db, client):
    client.issue_ref(owner_id="inst-1")
    client.set_status("inst-1", OwnerStatus.BUSY)
    assert instance(db, "inst-1")["status"] == "busy"
    client.set_status("inst-1", OwnerStatus.TERMINATING)
    assert instance(db, "inst-1")["status"] == "terminating"
    assert instance(db, "inst-1")["terminated_at"] is None


@pytest.mark.parametrize("terminate", [
    lambda c: c.mark_terminated("inst-1"),
    lambda c: c.set_status("inst-1", OwnerStatus.TERMINATED),
], ids=["mark_terminated", "set_status(TERMINATED)"])
def test_termination_sets_terminated_at(db, client, terminate):
    client.issue_ref(owner_id="inst-1")
    before = db_now(db)
    terminate(client)
    after = db_now(db)
    row = instance(db, "inst-1")
    assert row["status"] == "terminated"
    assert before <= row["terminated_at"] <= after
    # terminating again keeps the first time
    client.mark_terminated("inst-1")
    assert instance(db, "inst-1")["terminated_at"] == row["terminated_at"]


def test_soft_delete_sets_deleted_at_and_keeps_the_row(db, client):
    client.issue_ref(owner_id="inst-1")
    before = db_now(db)
    client.soft_delete("inst-1")
    after = db_now(db)
    row = instance(db, "inst-1")
    assert before <= row["deleted_at"] <= after
    assert row["status"] == "pending"
    client.soft_delete("inst-1")
    assert instance(db, "inst-1")["deleted_at"] == row["deleted_at"]


@pytest.mark.parametrize("call", [
    lambda c: c.mark_provisioning("nope", backend_id="b", primary_id="i-1", region="r"),
    lambda c: c.set_status("nope", OwnerStatus.IDLE),
    lambda c: c.mark_terminated("nope"),
    lambda c: c.soft_delete("nope"),
], ids=["mark_provisioning", "set_status", "mark_terminated", "soft_delete"])
def test_transitions_of_an_unknown_instance_raise(client, call):
    with pytest.raises(ConfigError, match="nope"):
        call(client)


def test_aws_tag_specifications_shape():
    assert aws_tag_specifications("abcdef123456") == [
        {"ResourceType": "instance", "Tags": [{"Key": "provider_ref", "Value": "abcdef123456"}]},
        {"ResourceType": "volume", "Tags": [{"Key": "provider_ref", "Value": "abcdef123456"}]},
        {"ResourceType": "network-interface", "Tags": [{"Key": "provider_ref", "Value": "abcdef123456"}]},
    ]
    custom = aws_tag_specifications("abcdef123456", tag_key="my_ref", resource_types=("instance",))
    assert custom == [{"ResourceType": "instance", "Tags": [{"Key": "my_ref", "Value": "abcdef123456"}]}]
    # each spec owns its tag list (boto3 callers may append to one)
    specs = aws_tag_specifications("abcdef123456")
    specs[0]["Tags"].append({"Key": "Name", "Value": "x"})
    assert len(specs[1]["Tags"]) == 1


def test_gcp_labels_shape():
    assert gcp_labels("abcdef123456") == {"provider_ref": "abcdef123456"}
    assert gcp_labels("abcdef123456", label_key="ref") == {"ref": "abcdef123456"}
