"""The digest from the deployed Cloud Functions: with NOTIFY_TOPIC set, the function that
finishes a cycle publishes its C6 digest to that Pub/Sub topic (the fake Publisher, through
the real client), once per eventful cycle; an unchanged cycle publishes none. The real
google-cloud-compute client lists the fake Compute server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.e2e.test_gcp_functions_e2e import PROJECT, Deployment, Fleet
from tests.support.pubsub_harness import FakePubSub, pubsub, pubsub_server  # noqa: F401

DIGESTS = f"projects/{PROJECT}/topics/orphan-cleanup-digests"


@pytest.fixture
def deployment(db, gcp, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch) -> Deployment:  # noqa: F811
    monkeypatch.setenv("NOTIFY_TOPIC", DIGESTS)
    return Deployment(db, gcp, pubsub, monkeypatch)


def test_a_report_cycle_publishes_one_digest_and_an_unchanged_one_none(deployment, db, gcp):
    deployment.add_backend(mode="report")
    fleet = Fleet(db, gcp)

    summary = deployment.list()
    deployment.drain()

    [message] = deployment.pubsub.take(DIGESTS)
    digest = message.json()
    assert message.attributes == {"type": "orphan-cleanup.cycle", "backend": digest["backend"], "outcome": "clean"}
    assert (digest["provider"], digest["account"], digest["cycle_id"], digest["mode"]) == (
        "gcp", PROJECT, summary["cycle_id"], "report")
    new = {g["provider_ref"]: g for g in digest["new_orphans"]}
    assert set(new) == {fleet.leaked["ref"], fleet.placeholder["ref"], fleet.leftover_ref}
    assert new[fleet.leaked["ref"]]["primary_id"] == fleet.leaked["id"]
    assert new[fleet.leaked["ref"]]["size"]["instance_type"] == "e2-small"  # the machine type the listing read
    assert digest["open_orphans"] == 3 and digest["deleted"] == []

    # the same listing again: nothing new, nothing deleted, not failed: no digest
    deployment.list(mode="report")
    deployment.drain()
    assert deployment.pubsub.take(DIGESTS) == []


def test_the_slack_text_escapes_a_forged_machine_type(deployment, db, gcp, monkeypatch):
    """docs/SAFETY.md rule 22: a listing's text never becomes a Slack mention or link."""
    from tests.e2e.test_digests import Sink
    from tests.e2e.test_gcp_functions_e2e import ZONE

    Sink.bodies = []
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SLACK_WEBHOOK_URL", f"http://127.0.0.1:{server.server_address[1]}/services/T/B/X")
    deployment.add_backend(mode="report")
    fleet = Fleet(db, gcp)
    forged = "<!channel> <https:evil.example|Approve deletion>"  # the last path segment is the type
    gcp.set_field("instances", ZONE, fleet.leaked["name"], "machineType",
                  f"https://compute.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/{forged}")
    try:
        deployment.list()
        deployment.drain()
    finally:
        server.shutdown()

    [body] = Sink.bodies
    assert "<" not in body["text"] and ">" not in body["text"]
    assert "&lt;!channel&gt; &lt;https:evil.example|Approve deletion&gt;" in body["text"]


def test_a_vm_leaked_for_months_is_told_by_its_age_its_owner_its_orphan_time_and_cost(deployment, db, gcp):
    """DESIGN C6: first seen today, a VM created 120 days ago whose owner ended 90 days ago
    is 120 days old and an orphan for 90, with its owner's name and, from the backend's
    ``prices``, its cost per hour; the placeholder, whose owner row is gone, is an orphan
    since its creation."""
    from tests.e2e.test_gcp_functions_e2e import BACKEND, ZONE

    deployment.add_backend(mode="report")
    with db.connection() as conn:
        conn.run("UPDATE backends SET settings = CAST(:s AS jsonb) WHERE id = :b", b=BACKEND,
                 s=json.dumps({"prices": {"instance_hour": {"e2-small": 0.0168}, "disk_gb_month": 0.04}}))
    fleet = Fleet(db, gcp)
    created = (datetime.now(UTC) - timedelta(days=120)).replace(microsecond=0)
    gcp.set_field("instances", ZONE, fleet.leaked["name"], "creationTimestamp", created.isoformat())
    with db.connection() as conn:
        [[ended]] = conn.run("UPDATE instances SET terminated_at = oc_clock() - interval '90 days'"
                             " WHERE provider_ref = :r RETURNING terminated_at", r=fleet.leaked["ref"])

    deployment.list()
    deployment.drain()

    [message] = deployment.pubsub.take(DIGESTS)
    new = {g["provider_ref"]: g for g in message.json()["new_orphans"]}
    leaked = new[fleet.leaked["ref"]]
    assert leaked["owner_name"] == "leaked"
    assert datetime.fromisoformat(leaked["created_at"]) == created
    assert datetime.fromisoformat(leaked["orphan_since"]) == ended
    assert 120 * 86400 <= leaked["age_seconds"] < 120 * 86400 + 600
    assert 90 * 86400 <= leaked["orphan_seconds"] < 90 * 86400 + 600
    assert leaked["cost_per_hour"] == pytest.approx(0.0168 + leaked["size"]["disk_gb"] * 0.04 / 730, abs=1e-6)
    placeholder = new[fleet.placeholder["ref"]]  # its owner row is hard-deleted: no end recorded
    assert placeholder["owner_name"] == "placeholder" and placeholder["created_at"] is not None
    assert placeholder["orphan_since"] == placeholder["created_at"]
