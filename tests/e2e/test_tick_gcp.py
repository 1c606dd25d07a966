"""One Cloud Scheduler job per stack: the real lister entry point (functions-framework
test client) takes the tick ``{}``, publishes listing jobs to the jobs topic (real
gRPC to the fake Publisher), and the test plays the jobs topic's push subscription,
posting each job to the lister as Pub/Sub push delivers it. Two backends of one
project are listed once by the real google-cloud-compute client against the fake
Compute server."""

from __future__ import annotations

import base64
import json

import pytest
from functions_framework import create_app

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, gcp_labels
from orphan_cleanup.ledger.db import Database
from tests.support.gcp_fake import FakeCompute
from tests.support.pubsub_harness import FakePubSub, pubsub, pubsub_server  # noqa: F401

PROJECT = "test-project"
ZONE, REGION = "us-central1-a", "us-central1"
TOPICS = {name: f"projects/{PROJECT}/topics/orphan-cleanup-{name}" for name in ("listing", "delete", "jobs")}
SOURCE = "functions/gcp/main.py"


@pytest.fixture
def lister(db: Database, gcp: FakeCompute, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    for key, value in {"DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_GCP_ENDPOINT": gcp.url,
                       "LISTING_TOPIC": TOPICS["listing"], "DELETE_TOPIC": TOPICS["delete"],
                       "JOBS_TOPIC": TOPICS["jobs"], "ORPHAN_CLEANUP_MARGIN_SECONDS": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ORPHAN_CLEANUP_MODE", raising=False)
    return create_app(target="lister", source=SOURCE, signature_type="http").test_client()


def push_envelope(data: bytes) -> dict:
    """A Pub/Sub push request body, as the push subscription posts it."""
    return {"message": {"data": base64.b64encode(data).decode(), "messageId": "1", "attributes": {}},
            "subscription": f"projects/{PROJECT}/subscriptions/orphan-cleanup-jobs"}


def test_the_tick_queues_one_job_and_the_pushed_job_lists_the_project_once(lister, db, gcp, pubsub):  # noqa: F811
    with db.connection() as conn:
        for b in ("gcp-team-a", "gcp-team-b"):
            conn.run("INSERT INTO backends (id, provider, account, regions) VALUES (:i, 'gcp', :a, :r)",
                     i=b, a=PROJECT, r=[REGION])
    ledger = LedgerClient(db)
    issued = ledger.issue_ref(owner_name="vm")
    vm = gcp.add_instance("vm", zone=ZONE, labels=gcp_labels(issued.provider_ref))
    ledger.mark_provisioning(issued.owner_id, backend_id="gcp-team-a", primary_id=vm["id"], region=REGION,
                             status=OwnerStatus.BUSY)

    tick = lister.post("/", json={})
    assert tick.status_code == 200, tick.get_data(as_text=True)
    assert tick.get_json()["jobs"] == [["gcp-team-a", "gcp-team-b"]]
    [job] = pubsub.take(TOPICS["jobs"])
    assert job.json() == {"v": 1, "backends": ["gcp-team-a", "gcp-team-b"]}
    assert gcp.count("GET", "/aggregated/instances") == 0

    resp = lister.post("/", json=push_envelope(job.data))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body["listings"] == 1
    assert [(r["backend"], r["started"]) for r in body["results"]] == [("gcp-team-a", True), ("gcp-team-b", True)]
    assert gcp.count("GET", "/aggregated/instances") == 1  # one listing for both backends
    batches = [json.loads(m.data) for m in pubsub.take(TOPICS["listing"])]
    assert sorted(b["backend"] for b in batches) == ["gcp-team-a", "gcp-team-b"]


def test_a_malformed_pushed_job_is_refused_and_lists_nothing(lister, db, gcp, pubsub):  # noqa: F811
    resp = lister.post("/", json=push_envelope(b'{"v": 1, "backends": []}'))
    assert resp.status_code == 400
    assert "malformed ListingJob" in resp.get_json()["error"]
    assert gcp.count("GET") == 0 and pubsub.messages() == []


def test_the_tick_logs_the_stalest_backend_for_the_log_based_metric(lister, db, gcp, pubsub, capfd):  # noqa: F811
    # given an enrolled backend whose last clean cycle was two hours ago (infra/gcp/monitoring.tf reads the line)
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions) VALUES ('gcp-team-a', 'gcp', :a, :r)",
                 a=PROJECT, r=[REGION])
    LedgerClient(db).issue_ref(owner_name="vm")  # the ledger has issued refs: the tick enrolls the backend
    assert lister.post("/", json={}).status_code == 200
    with db.connection() as conn:
        conn.run("UPDATE cleanup SET clean_at = oc_clock() - interval '2 hours' WHERE backend_id = 'gcp-team-a'")
    capfd.readouterr()

    # when the tick runs
    assert lister.post("/", json={}).status_code == 200

    # then one structured line says how stale the stalest backend is
    [line] = [json.loads(x) for x in capfd.readouterr().out.splitlines() if '"tick done"' in x]
    assert line["severity"] == "INFO" and line["stalest_backend"] == "gcp-team-a"
    assert 7200 <= line["stalest_backend_seconds"] < 7200 + 600
