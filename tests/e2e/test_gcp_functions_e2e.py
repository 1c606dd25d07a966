"""The deployed GCP shape end to end: the real Cloud Functions entry points
(``functions/gcp/main.py``) served by the functions-framework test client,
Pub/Sub CloudEvents as Eventarc delivers them, the real ``google-cloud-compute``
client against the fake Compute REST server, a real Postgres ledger.

Publishing is real too: the entry points' ``PublisherClient`` talks gRPC to
a fake Publisher service (``tests/support/pubsub_harness.py``) through
``PUBSUB_EMULATOR_HOST``, as it would to the Pub/Sub emulator. The test plays
the push subscription: it takes what was published and posts it as a
CloudEvent to the subscribed function.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from functions_framework import create_app

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, gcp_labels
from orphan_cleanup.ledger.db import Database
from tests.support.gcp_fake import FakeCompute
from tests.support.pubsub_harness import FakePubSub, pubsub, pubsub_cloudevent, pubsub_server  # noqa: F401

BACKEND = "gcp-main"
PROJECT = "test-project"
ZONE, REGION = "us-central1-a", "us-central1"
LISTING_TOPIC = f"projects/{PROJECT}/topics/orphan-cleanup-listing"
DELETE_TOPIC = f"projects/{PROJECT}/topics/orphan-cleanup-delete"
SOURCE = "functions/gcp/main.py"
MARGIN = 1


class Deployment:
    """The three Cloud Functions, their topics and the database of one test."""

    def __init__(self, db: Database, gcp: FakeCompute, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db, self.gcp, self.pubsub = db, gcp, pubsub
        for key, value in {
            "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_GCP_ENDPOINT": gcp.url,
            "LISTING_TOPIC": LISTING_TOPIC, "DELETE_TOPIC": DELETE_TOPIC,
            "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
            "ORPHAN_CLEANUP_MAX_MODE": "delete",  # the stack lets a backend row say delete (SAFETY.md rule 8)
        }.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("ORPHAN_CLEANUP_MODE", raising=False)
        self.lister = create_app(target="lister", source=SOURCE, signature_type="http").test_client()
        self.classifier = create_app(target="classifier", source=SOURCE, signature_type="cloudevent").test_client()
        self.deleter = create_app(target="deleter", source=SOURCE, signature_type="cloudevent").test_client()
        self.responses: list[tuple[str, int]] = []

    def add_backend(self, mode: str) -> None:
        with self.db.connection() as conn:
            conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                     " VALUES (:i, 'gcp', :a, CAST(:r AS text[]), '{}', :m)",
                     i=BACKEND, a=PROJECT, r=[REGION], m=mode)

    def list(self, **body: Any) -> dict[str, Any]:
        """Cloud Scheduler's HTTP call to the lister."""
        resp = self.lister.post("/", json={"backend": BACKEND, **body})
        assert resp.status_code == 200, resp.get_data(as_text=True)
        return resp.get_json()

    def push(self, topic: str, client: Any, subscription: str, *, binary: bool) -> int:
        """Deliver every message of ``topic`` to the function; returns how many."""
        messages = self.pubsub.take(topic)
        for msg in messages:
            resp = client.post("/", **pubsub_cloudevent(msg, subscription=subscription, binary=binary))
            self.responses.append((topic, resp.status_code))
            assert resp.status_code == 200, resp.get_data(as_text=True)
        return len(messages)

    def drain(self, binary: bool = True) -> None:
        for _ in range(50):
            n = self.push(LISTING_TOPIC, self.classifier, f"projects/{PROJECT}/subscriptions/classifier", binary=binary)
            n += self.push(DELETE_TOPIC, self.deleter, f"projects/{PROJECT}/subscriptions/deleter", binary=binary)
            if n == 0:
                return
        raise AssertionError("topics not drained")

    def query(self, sql: str, **params: Any) -> list[list[Any]]:
        with self.db.connection() as conn:
            return conn.run(sql, **params)

    def outcome(self, cycle_id: str) -> str | None:
        return self.query("SELECT outcome FROM cycles WHERE id = :c", c=cycle_id)[0][0]

    def groups(self, cycle_id: str) -> dict[str, tuple[str, str, str]]:
        rows = self.query("SELECT provider_ref, primary_id, verdict, reason, action FROM cycle_groups"
                          " WHERE cycle_id = :c", c=cycle_id)
        return {r[1] or r[0]: (r[2], r[3], r[4]) for r in rows}


@pytest.fixture
def deployment(db: Database, gcp: FakeCompute, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    return Deployment(db, gcp, pubsub, monkeypatch)


class Fleet:
    """Resources created with the ledger protocol: ref first, labels, provisioning data."""

    def __init__(self, db: Database, gcp: FakeCompute) -> None:
        self.db, self.gcp = db, gcp
        self.ledger = LedgerClient(db)
        self.tracked = self._vm("tracked")
        self.leaked = self._vm("leaked", terminate=True)
        self.placeholder = self._vm("placeholder", hard_delete=True)
        issued = self.ledger.issue_ref(owner_name="leftover")
        gcp.add_disk("leftover-disk", zone=ZONE, labels=gcp_labels(issued.provider_ref))
        self.ledger.hard_delete(issued.owner_id)
        self.leftover_ref = issued.provider_ref
        gcp.add_instance("foreign", zone=ZONE, labels=gcp_labels("zzzzforeign1"))
        self.foreign = "foreign"
        self._age()
        time.sleep(MARGIN + 0.2)  # the fake stamps creation times now

    def _vm(self, name: str, *, terminate: bool = False, hard_delete: bool = False) -> dict[str, str]:
        issued = self.ledger.issue_ref(owner_name=name)
        inst = self.gcp.add_instance(name, zone=ZONE, labels=gcp_labels(issued.provider_ref))
        self.gcp.add_disk(f"{name}-data", zone=ZONE, labels=gcp_labels(issued.provider_ref), attached_to=name)
        if hard_delete:
            self.ledger.hard_delete(issued.owner_id)
        else:
            self.ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=inst["id"], region=REGION,
                                          status=OwnerStatus.BUSY)
            if terminate:
                self.ledger.mark_terminated(issued.owner_id)
        return {"name": name, "id": inst["id"], "ref": issued.provider_ref}

    def _age(self) -> None:
        with self.db.transaction() as conn:
            conn.run("UPDATE instances SET created_at = created_at - interval '1 hour',"
                     " provisioned_at = provisioned_at - interval '1 hour',"
                     " terminated_at = terminated_at - interval '1 hour'")
            conn.run("UPDATE provider_refs SET issued_at = issued_at - interval '1 hour'")

    def exists(self, collection: str, name: str) -> bool:
        return self.gcp.get(collection, ZONE, name) is not None


def test_delete_mode_lister_classifier_deleter_remove_exactly_the_orphans(deployment, db, gcp):
    deployment.add_backend(mode="delete")
    fleet = Fleet(db, gcp)

    summary = deployment.list()
    assert summary["ok"] and summary["started"] and summary["batches"] >= 1
    assert len(deployment.pubsub.messages(LISTING_TOPIC)) == summary["batches"]
    deployment.drain(binary=True)

    cycle_id = summary["cycle_id"]
    groups = deployment.groups(cycle_id)
    assert groups[fleet.leaked["id"]] == ("orphan", "owner_terminated", "deleted")
    assert groups[fleet.placeholder["id"]] == ("orphan", "owner_deleted", "deleted")
    assert groups[fleet.leftover_ref] == ("orphan", "owner_deleted", "deleted")
    for vm in (fleet.leaked, fleet.placeholder):
        assert not fleet.exists("instances", vm["name"])
    assert fleet.exists("instances", "tracked") and fleet.exists("disks", "tracked-data")
    assert fleet.exists("instances", "foreign")
    assert not fleet.exists("disks", "leftover-disk")
    assert deployment.outcome(cycle_id) == "clean"
    assert not fleet.exists("disks", "leaked-data") and not fleet.exists("disks", "placeholder-data")
    assert gcp.count("DELETE") == 5  # 2 instances, 3 disks: nothing else was touched
    assert all(code == 200 for _, code in deployment.responses)


def test_report_mode_deletes_nothing(deployment, db, gcp):
    deployment.add_backend(mode="report")
    fleet = Fleet(db, gcp)

    summary = deployment.list()
    deployment.drain(binary=False)  # structured content mode this time

    assert deployment.outcome(summary["cycle_id"]) == "clean"
    groups = deployment.groups(summary["cycle_id"])
    assert groups[fleet.leaked["id"]] == ("orphan", "owner_terminated", "reported")
    assert groups[fleet.placeholder["id"]] == ("orphan", "owner_deleted", "reported")
    assert groups[fleet.leftover_ref] == ("orphan", "owner_deleted", "reported")
    assert gcp.count("DELETE") == 0 and deployment.pubsub.messages(DELETE_TOPIC) == []
    reported = deployment.query("SELECT provider_ref FROM events WHERE kind = 'orphan_reported'")
    assert sorted(r for (r,) in reported) == sorted([fleet.leaked["ref"], fleet.placeholder["ref"], fleet.leftover_ref])


@pytest.mark.parametrize("case", ["data_not_base64_json", "wrong_shape", "not_a_cloudevent"])
def test_a_malformed_cloudevent_is_an_error_and_deletes_nothing(deployment, db, gcp, case):
    deployment.add_backend(mode="delete")
    Fleet(db, gcp)
    summary = deployment.list()
    [batch] = deployment.pubsub.take(LISTING_TOPIC)
    sub = f"projects/{PROJECT}/subscriptions/classifier"

    if case == "not_a_cloudevent":
        request = {"data": batch.data[:40], "content_type": "text/plain"}
    else:
        bad = b"\x00not json" if case == "data_not_base64_json" else json.dumps({"v": 1, "groups": 7}).encode()
        request = pubsub_cloudevent(bad, subscription=sub)
        if case == "data_not_base64_json":
            body = json.loads(request["data"])
            body["message"]["data"] = "%%%" + base64.b64encode(bad).decode()
            request["data"] = json.dumps(body)
    resp = deployment.classifier.post("/", **request)

    # An exception is a 500 (Pub/Sub retries, then dead-letters); a request that
    # is no CloudEvent at all is refused by the framework.
    assert resp.status_code == (415 if case == "not_a_cloudevent" else 500)
    assert deployment.pubsub.messages(DELETE_TOPIC) == [] and gcp.count("DELETE") == 0
    assert deployment.query("SELECT applied_batches FROM cycles WHERE id = :c", c=summary["cycle_id"])[0][0] == 0
    assert deployment.outcome(summary["cycle_id"]) is None


def test_a_mig_member_and_a_deletion_protected_orphan_survive_a_delete_cycle(deployment, db, gcp):
    # Given: two orphans (terminated owners): one a managed instance group's member, one deletion-protected
    deployment.add_backend(mode="delete")
    ledger = LedgerClient(db)
    made = {}
    for name, kw in (("mig-vm", {"created_by": "web"}), ("guarded", {"deletion_protection": True}),
                     ("plain", {})):
        issued = ledger.issue_ref(owner_name=name)
        made[name] = gcp.add_instance(name, zone=ZONE, labels=gcp_labels(issued.provider_ref), **kw)
        ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=made[name]["id"], region=REGION,
                                 status=OwnerStatus.BUSY)
        ledger.mark_terminated(issued.owner_id)
    with db.transaction() as conn:
        conn.run("UPDATE instances SET created_at = created_at - interval '1 hour',"
                 " provisioned_at = provisioned_at - interval '1 hour',"
                 " terminated_at = terminated_at - interval '1 hour'")
        conn.run("UPDATE provider_refs SET issued_at = issued_at - interval '1 hour'")
    time.sleep(MARGIN + 0.2)

    # When: a delete-mode cycle runs through the functions
    summary = deployment.list()
    deployment.drain()

    # Then: both are protected with their reasons (the MIG in detail), only the plain orphan is deleted
    groups = deployment.groups(summary["cycle_id"])
    assert groups[made["mig-vm"]["id"]] == ("protected", "managed_by_controller", "reported")
    assert groups[made["guarded"]["id"]] == ("protected", "deletion_protection", "reported")
    assert groups[made["plain"]["id"]] == ("orphan", "owner_terminated", "deleted")
    [(detail,)] = deployment.query("SELECT evidence->>'d' FROM cycle_groups WHERE primary_id = :p",
                                   p=made["mig-vm"]["id"])
    assert detail.endswith(f"/zones/{ZONE}/instanceGroupManagers/web")
    assert gcp.names("instances") == {"mig-vm", "guarded"}
    assert gcp.count("DELETE") == 1 and gcp.count("DELETE", "/instances/plain") == 1
    assert deployment.query("SELECT count(*) FROM delete_requests")[0][0] == 1  # protected up front, never sent
    assert deployment.outcome(summary["cycle_id"]) == "clean"


@pytest.mark.parametrize("setting", ["credentials_json", "credentials_file"])
def test_the_deployed_lister_refuses_a_backend_whose_row_holds_a_key(deployment, db, gcp, setting, tmp_path):
    from tests.integration.test_cli_lifecycle import service_account_key

    # given a backend whose row holds a delete-capable key (or names a key file), and a live orphan
    key = service_account_key()
    (tmp_path / "k.json").write_text(key)
    value = key if setting == "credentials_json" else str(tmp_path / "k.json")
    deployment.add_backend(mode="delete")
    with db.connection() as conn:
        conn.run("UPDATE backends SET settings = CAST(:s AS jsonb) WHERE id = :i", s=json.dumps({setting: value}),
                 i=BACKEND)
    fleet = Fleet(db, gcp)

    # when the scheduler calls the lister, then no cycle runs for it, and one line says why
    summary = deployment.list()
    assert (summary["started"], summary["reason"]) == (False, "ledger_key")
    assert f"settings.{setting}" in summary["error"] and "\n" not in summary["error"]
    assert "PRIVATE KEY" not in summary["error"]
    assert deployment.query("SELECT count(*) FROM cycles WHERE backend_id = :b", b=BACKEND) == [[0]]
    assert deployment.pubsub.messages(LISTING_TOPIC) == []
    assert fleet.exists("instances", "leaked") and gcp.count("DELETE") == 0


def test_a_held_delete_gate_is_a_429_to_retry_not_a_500_with_a_traceback(deployment, db, gcp, caplog):
    """A held gate is normal operation (docs/SAFETY.md rule 22: a 500's traceback is logged,
    and Sentry's logging integration would send it): the deleter answers 429, Pub/Sub
    redelivers, and the redelivery deletes once the gate is free."""
    from orphan_cleanup.ledger.store import LedgerStore

    deployment.add_backend(mode="delete")
    fleet = Fleet(db, gcp)
    deployment.list()
    deployment.push(LISTING_TOPIC, deployment.classifier, f"projects/{PROJECT}/subscriptions/classifier", binary=True)
    requests = deployment.pubsub.take(DELETE_TOPIC)
    [held] = [m for m in requests if m.json()["group"]["provider_ref"] == fleet.leaked["ref"]]
    assert LedgerStore(db).acquire_gate(f"gcp:{PROJECT}", fleet.leaked["ref"], "another-delivery", 60)

    caplog.clear()
    resp = deployment.deleter.post("/", **pubsub_cloudevent(held, subscription="s", binary=True))

    assert resp.status_code == 429, resp.get_data(as_text=True)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert fleet.exists("instances", "leaked")

    LedgerStore(db).release_gate(f"gcp:{PROJECT}", fleet.leaked["ref"], "another-delivery")
    resp = deployment.deleter.post("/", **pubsub_cloudevent(held, subscription="s", binary=True))
    assert resp.status_code == 200 and not fleet.exists("instances", "leaked")
