"""Safety seams of the GCP path, on real parts: `orphan-cleanup run` as a subprocess and the real
Cloud Functions entry points (functions-framework's test client, Pub/Sub pushes as the
subscriptions post them, publishing through the real client to the fake Publisher), the real
google-cloud-compute client against the fake Compute REST server (which deletes ``autoDelete``
disks with their instance, as Compute Engine does) and a real Postgres ledger. Each test
reproduced a defect of the code before docs/SAFETY.md rules 15-20 (committed as a strict xfail
naming the failure it gave), and asserts the behaviour now."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from functions_framework import create_app

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, gcp_labels
from orphan_cleanup.ledger.db import Database
from tests.support.gcp_fake import FakeCompute
from tests.support.pubsub_harness import FakePubSub, pubsub, pubsub_cloudevent, pubsub_server  # noqa: F401
from tests.support.seams import delete_results, query, run_json, skip_reasons, verdicts

PROJECT = "test-project"
ZONE, REGION = "us-central1-a", "us-central1"
BACKEND = "gcp-main"
PROTECT = "orphan-cleanup-protect"
TOPICS = {name: f"projects/{PROJECT}/topics/orphan-cleanup-{name}" for name in ("listing", "delete", "jobs")}
SOURCE = "functions/gcp/main.py"


def add_backend(db: Database, backend: str = BACKEND, *, mode: str | None = None,
                settings: dict[str, Any] | None = None) -> None:
    query(db, "INSERT INTO backends (id, provider, account, regions, settings, mode)"
              " VALUES (:i, 'gcp', :a, CAST(:r AS text[]), CAST(:s AS jsonb), :m)",
          i=backend, a=PROJECT, r=[REGION], s=json.dumps(settings or {}), m=mode)


def age_ledger(db: Database) -> None:
    """Every owner and ref an hour old (outside the margin), with plain SQL."""
    with db.transaction() as conn:
        conn.run("UPDATE instances SET created_at = created_at - interval '1 hour',"
                 " provisioned_at = provisioned_at - interval '1 hour',"
                 " terminated_at = terminated_at - interval '1 hour'")
        conn.run("UPDATE provider_refs SET issued_at = issued_at - interval '1 hour'")


def gone_ref(ledger: LedgerClient) -> str:
    """A ref whose owner row was hard-deleted (a failed placeholder)."""
    issued = ledger.issue_ref(owner_name="placeholder")
    ledger.hard_delete(issued.owner_id)
    return issued.provider_ref


def run(db: Database, gcp: FakeCompute, *args: str) -> tuple[int, dict[str, Any], str]:
    return run_json(db, BACKEND, *args, ORPHAN_CLEANUP_GCP_ENDPOINT=gcp.url)


# ---- 1. an autoDelete disk outside the group ---------------------------------------------------------

def test_an_auto_delete_disk_outside_the_group_keeps_the_instance(db, gcp):
    """Setup: an orphan instance I (owner hard-deleted long ago) with two disks attached with
    autoDelete: D1 labelled only orphan-cleanup-protect (no ref), D2 labelled with the ref of a
    live, tracked owner whose own VM is listed and tracked. Shows: a delete run leaves I, D1 and
    D2 in place; I's group is reported, not deleted; the cycle is unsettled; the delete's
    recorded result names D1 (blast_protected) and/or D2 (blast_foreign)."""
    add_backend(db)
    ledger = LedgerClient(db)
    vm = gcp.add_instance("orphan-vm", zone=ZONE, labels=gcp_labels(gone_ref(ledger)))
    d1 = gcp.add_disk("kept-disk", zone=ZONE, labels={PROTECT: "yes"}, attached_to="orphan-vm", auto_delete=True)
    owner = ledger.issue_ref(owner_name="live")
    live = gcp.add_instance("live-vm", zone=ZONE, labels=gcp_labels(owner.provider_ref))
    ledger.mark_provisioning(owner.owner_id, backend_id=BACKEND, primary_id=live["id"], region=REGION,
                             status=OwnerStatus.BUSY)
    d2 = gcp.add_disk("live-data", zone=ZONE, labels=gcp_labels(owner.provider_ref), attached_to="orphan-vm",
                      auto_delete=True)
    age_ledger(db)

    code, doc, _ = run(db, gcp, "--mode", "delete", "--yes")

    assert gcp.names("instances") == {"orphan-vm", "live-vm"}
    assert gcp.names("disks") == {"kept-disk", "live-data"}
    assert code == 0 and doc["outcome"] == "unsettled", doc
    groups = verdicts(doc)
    assert groups[vm["id"]][2] == "reported" and groups[live["id"]] == ("tracked", "tracked", "none")
    [recorded] = delete_results(db, doc["cycle_id"])
    reasons = skip_reasons(recorded)
    assert reasons.get(d1["id"]) == "blast_protected" or reasons.get(d2["id"]) == "blast_foreign", recorded


# ---- 2b. snapshot retention deletes only the snapshots the deleter took ----------------------------------

def test_retention_leaves_a_ref_labelled_snapshot_the_deleter_never_took(db, gcp):
    """Setup: retain_snapshots_days 7; a 10-day-old snapshot (of a disk of the backend's zone)
    labelled with the ref of an owner hard-deleted long ago, without orphan-cleanup-source.
    Shows: a delete run neither lists it nor deletes it."""
    add_backend(db, settings={"retain_snapshots_days": 7})
    ref = gone_ref(LedgerClient(db))
    snap = gcp.add_snapshot("someones-backup", zone=ZONE, labels=gcp_labels(ref),
                            created=datetime.now(UTC) - timedelta(days=10))
    age_ledger(db)

    code, doc, _ = run(db, gcp, "--mode", "delete", "--yes")

    assert code == 0, doc
    assert [(g["verdict"], g["reason"], g["action"]) for g in doc["groups"]
            if snap["id"] in {r["id"] for r in g["resources"]}] == []
    assert gcp.snapshot_names() == {"someones-backup"}


# ---- 4. a push to the jobs subscription names backends, never a mode --------------------------------------

def push_envelope(document: dict[str, Any], subscription: str = "jobs") -> dict[str, Any]:
    """A Pub/Sub push request body, as a push subscription posts it to the lister."""
    return {"message": {"data": base64.b64encode(json.dumps(document).encode()).decode(), "messageId": "1"},
            "subscription": f"projects/{PROJECT}/subscriptions/{subscription}"}


class Functions:
    """The three Cloud Functions of one test; the test plays the subscriptions."""

    def __init__(self, db: Database, gcp: FakeCompute, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
        self.pubsub = pubsub
        for key, value in {"DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_GCP_ENDPOINT": gcp.url,
                           "LISTING_TOPIC": TOPICS["listing"], "DELETE_TOPIC": TOPICS["delete"],
                           "JOBS_TOPIC": TOPICS["jobs"], "ORPHAN_CLEANUP_MARGIN_SECONDS": "0"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("ORPHAN_CLEANUP_MODE", raising=False)
        self.lister = create_app(target="lister", source=SOURCE, signature_type="http").test_client()
        self.subscribers = {topic: create_app(target=target, source=SOURCE, signature_type="cloudevent").test_client()
                            for topic, target in ((TOPICS["listing"], "classifier"), (TOPICS["delete"], "deleter"))}

    def drain(self) -> None:
        """Push every published listing batch and delete request to its function, until none is left."""
        for _ in range(20):
            pushed = 0
            for topic, client in self.subscribers.items():
                for msg in self.pubsub.take(topic):
                    resp = client.post("/", **pubsub_cloudevent(msg, subscription=f"{topic}-sub"))
                    assert resp.status_code == 200, resp.get_data(as_text=True)
                    pushed += 1
            if not pushed:
                return
        raise AssertionError("topics not drained")


def test_a_pushed_message_cannot_choose_the_mode_of_a_report_backend(db, gcp, pubsub, monkeypatch):  # noqa: F811
    """Setup: the deployed lister with JOBS_TOPIC; a report-mode backend X with an orphan; a Pub/Sub
    push envelope whose data is {"backend": "X", "mode": "delete"}. Shows: the lister answers 4xx,
    no cycle of X starts and nothing is deleted (the subscriptions drained); a well-formed
    {"backends": ["X"]} push still starts X's cycle, in report mode."""
    functions = Functions(db, gcp, pubsub, monkeypatch)
    add_backend(db, "X", mode="report")
    gcp.add_instance("orphan-vm", zone=ZONE, labels=gcp_labels(gone_ref(LedgerClient(db))))
    age_ledger(db)

    forged = functions.lister.post("/", json=push_envelope({"backend": "X", "mode": "delete"}))
    functions.drain()

    assert 400 <= forged.status_code < 500, forged.get_data(as_text=True)
    assert query(db, "SELECT count(*) FROM cycles WHERE backend_id = 'X'") == [[0]]
    assert gcp.count("DELETE") == 0 and gcp.names("instances") == {"orphan-vm"}
    job = functions.lister.post("/", json=push_envelope({"backends": ["X"]}))
    assert job.status_code == 200, job.get_data(as_text=True)
    functions.drain()
    assert query(db, "SELECT mode FROM cycles WHERE backend_id = 'X'") == [["report"]]
    assert gcp.count("DELETE") == 0


# ---- 5. a mangled primary_id --------------------------------------------------------------------------------

def test_live_owners_whose_primary_id_names_no_listed_vm_keep_their_vms(db, gcp):
    """Setup: two busy owners on GCP: O1's primary_id is 4100000007919000064 while its VM's id is
    4100000007919000013 (the id as a float64 would round it), O2's primary_id is its VM's name;
    both VMs carry their owner's ref and run. Shows: a delete run keeps both, skipped /
    primary_not_listed."""
    add_backend(db)
    ledger = LedgerClient(db)
    made = {}
    for name, primary in (("vm-rounded", "4100000007919000064"), ("vm-by-name", "vm-by-name")):
        issued = ledger.issue_ref(owner_name=name)
        made[name] = gcp.add_instance(name, zone=ZONE, labels=gcp_labels(issued.provider_ref))["id"]
        if name == "vm-rounded":
            gcp.set_field("instances", ZONE, name, "id", "4100000007919000013")
            made[name] = "4100000007919000013"
        ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=primary, region=REGION,
                                 status=OwnerStatus.BUSY)

    code, doc, _ = run(db, gcp, "--mode", "delete", "--yes")

    assert code == 0, doc
    groups = verdicts(doc)
    assert {name: groups[vm] for name, vm in made.items()} == {
        name: ("skipped", "primary_not_listed", "none") for name in made}
    assert gcp.names("instances") == set(made)


# ---- the stack's protect key always protects (SAFETY.md rule 16) -------------------------------------

def test_the_stacks_protect_key_protects_when_the_row_renames_its_own(db, gcp):
    """Setup: the only GCP backend of the project renames its protect label key to platform-keep;
    two leaked VMs, one labelled with the stack's own key (stack-keep, ORPHAN_CLEANUP_PROTECT_TAG_KEY),
    one not. Shows: a delete run keeps the first, protected / protect_tag, and deletes the other."""
    add_backend(db, settings={"protect_tag_key": "platform-keep"})
    ledger = LedgerClient(db)
    made = {}
    for name, extra in (("vm-stack", {"stack-keep": "yes"}), ("vm-free", {})):
        made[name] = gcp.add_instance(name, zone=ZONE, labels=gcp_labels(gone_ref(ledger)) | extra)["id"]
    age_ledger(db)

    code, doc, _ = run_json(db, BACKEND, "--mode", "delete", "--yes", ORPHAN_CLEANUP_GCP_ENDPOINT=gcp.url,
                            ORPHAN_CLEANUP_PROTECT_TAG_KEY="stack-keep")

    assert code == 0, doc
    groups = verdicts(doc)
    assert groups[made["vm-stack"]][:2] == ("protected", "protect_tag")
    assert groups[made["vm-free"]][0] == "orphan"
    assert gcp.names("instances") == {"vm-stack"}
