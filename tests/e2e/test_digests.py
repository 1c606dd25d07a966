"""The C6 digest as operators receive it: `orphan-cleanup run` (a subprocess) against a real
Postgres and the moto server, with NOTIFY_TOPIC_ARN naming an SNS topic on moto whose SQS
subscription collects what was sent, and SLACK_WEBHOOK_URL a local HTTP sink. One digest
per cycle that found new orphans or deleted something, none for an unchanged cycle; a
channel that fails leaves the cycle's outcome and exit code as they were, and is counted
in the next digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest

from orphan_cleanup.ledger.db import Database
from tests.support.sqs_harness import MotoPlatform

BACKEND = "aws-prod"
MARGIN = 1
DIGEST_KEYS = {"type", "backend", "provider", "account", "cycle_id", "mode", "outcome", "new_orphans", "deleted",
               "delete_failed", "open_orphans", "failures", "stale_seconds"}
GROUP_KEYS = {"provider_ref", "primary_id", "region", "reason", "first_seen", "resources"}

pytestmark = pytest.mark.usefixtures("moto_reset")


@pytest.fixture
def topic() -> Iterator[tuple[str, Any, str]]:
    """An SNS topic with an SQS subscription (raw delivery): (topic ARN, sqs client, queue URL)."""
    sns = boto3.client("sns", region_name="us-east-1")
    sqs = boto3.client("sqs", region_name="us-east-1")
    arn = sns.create_topic(Name="orphan-cleanup-digests")["TopicArn"]
    url = sqs.create_queue(QueueName="digests")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    yield arn, sqs, url


def received(sqs: Any, url: str) -> list[dict[str, Any]]:
    """Every digest the subscription holds now (each deleted from the queue)."""
    out = []
    while msgs := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []):
        out += [json.loads(m["Body"]) for m in msgs]
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                        for i, m in enumerate(msgs)])
    return out


class Sink(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        Sink.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slack() -> Iterator[str]:
    """A local HTTP sink for the webhook; returns its URL (bodies in ``Sink.bodies``)."""
    Sink.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/services/T000/B000/XXXX"
    server.shutdown()


def run(db: Database, *args: str, **env: str) -> tuple[int, dict[str, Any], str]:
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
               "NO_COLOR": "1", **env}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", "run", "--backend", BACKEND, "--json", *args],
                          env=environ, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def add_backend(db: Database, settings: dict[str, Any] | None = None) -> None:
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings) VALUES"
                 " (:i, 'aws', '123456789012', '{us-east-1}', CAST(:s AS jsonb))", i=BACKEND,
                 s=json.dumps(settings or {}))


def leak(db: Database) -> tuple[MotoPlatform, Any]:
    platform = MotoPlatform(db, BACKEND)
    platform.tracked()
    leaked = platform.terminated_leak()
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)
    return platform, leaked


def eventful(doc: dict[str, Any]) -> bool:
    return doc["outcome"] == "failed" or any(g["action"] in ("deleted", "delete_failed") for g in doc["groups"])


def test_sns_receives_exactly_the_digests_of_eventful_cycles(db, topic):
    arn, sqs, url = topic
    add_backend(db)
    platform, leaked = leak(db)

    # when a report cycle finds the leak, then one digest says so, with the documented fields
    code, doc, _ = run(db, NOTIFY_TOPIC_ARN=arn)
    assert code == 0 and doc["outcome"] == "clean"
    [digest] = received(sqs, url)
    assert DIGEST_KEYS <= set(digest)
    assert (digest["type"], digest["backend"], digest["provider"], digest["account"], digest["cycle_id"],
            digest["mode"], digest["outcome"]) == ("orphan-cleanup.cycle", BACKEND, "aws", "123456789012",
                                                  doc["cycle_id"], "report", "clean")
    [new] = digest["new_orphans"]
    assert GROUP_KEYS <= set(new)
    assert (new["provider_ref"], new["primary_id"], new["region"], new["reason"]) == (
        leaked.ref, leaked.instance_id, "us-east-1", "owner_terminated")
    assert datetime.fromisoformat(new["first_seen"]).tzinfo is not None
    assert {r["id"] for r in new["resources"]} == {leaked.instance_id, *leaked.volume_ids}
    assert new["size"]["instance_type"] == "m1.small"
    assert (digest["deleted"], digest["delete_failed"], digest["open_orphans"], digest["failures"],
            digest["stale_seconds"]) == ([], [], 1, [], None)

    # when the same report cycle runs again, nothing changed: no digest (the orphan is not new)
    code, doc, _ = run(db, NOTIFY_TOPIC_ARN=arn)
    assert code == 0 and doc["outcome"] == "clean"
    assert received(sqs, url) == []

    # when delete cycles run until nothing is left, then exactly one digest per cycle that deleted
    deleted: set[str] = set()
    for _ in range(5):
        code, doc, _ = run(db, "--mode", "delete", "--yes", NOTIFY_TOPIC_ARN=arn)
        assert code == 0
        digests = received(sqs, url)
        assert len(digests) == (1 if eventful(doc) else 0), (doc, digests)
        for d in digests:
            assert d["cycle_id"] == doc["cycle_id"] and d["mode"] == "delete" and d["new_orphans"] == []
            deleted |= {g["provider_ref"] for g in d["deleted"]}
        if not any(g["verdict"] == "orphan" for g in doc["groups"]):
            break
    assert deleted == {leaked.ref}
    assert platform.instance_state(leaked.instance_id) == "terminated"


def test_the_slack_text_reaches_the_webhook(db, slack):
    add_backend(db)
    _, leaked = leak(db)

    code, doc, _ = run(db, SLACK_WEBHOOK_URL=slack)

    assert code == 0 and doc["outcome"] == "clean"
    [body] = Sink.bodies
    text = body["text"]
    assert BACKEND in text and "1 new orphan(s), 0 deleted, 0 failed to delete, 1 open" in text
    assert leaked.ref in text and leaked.instance_id in text and "us-east-1" in text and "m1.small" in text
    assert f"orphan-cleanup explain --backend {BACKEND} {leaked.ref}" in text


PRICES = {"instance_hour": {"m1.small": 0.044}, "disk_gb_month": 0.1}


def test_each_orphan_names_its_owner_its_creation_how_long_orphaned_and_its_cost(db, topic, slack):
    """DESIGN C6: owner_name, created_at (as the provider reported it), orphan_since and
    cost_per_hour (from the backend's ``prices``), in the JSON and in the Slack text, every
    value escaped (SAFETY.md rule 22)."""
    arn, sqs, url = topic
    add_backend(db, {"prices": PRICES})
    platform, leaked = leak(db)
    with db.connection() as conn:
        conn.run("UPDATE instances SET name = 'train-7 <!here>' WHERE provider_ref = :r", r=leaked.ref)
        [[ended]] = conn.run("SELECT terminated_at FROM instances WHERE provider_ref = :r", r=leaked.ref)
    [launched] = [i["LaunchTime"] for r in platform.ec2.describe_instances(InstanceIds=[leaked.instance_id])[
        "Reservations"] for i in r["Instances"]]

    code, doc, _ = run(db, NOTIFY_TOPIC_ARN=arn, SLACK_WEBHOOK_URL=slack)

    assert code == 0 and doc["outcome"] == "clean"
    [digest] = received(sqs, url)
    [new] = digest["new_orphans"]
    assert new["owner_name"] == "train-7 <!here>"
    assert datetime.fromisoformat(new["created_at"]) == launched  # the instance's LaunchTime
    # its owner's end reads an hour before the instance was launched (age_ledger): an orphan since its creation
    assert ended < launched and new["orphan_since"] == new["created_at"]
    assert new["cost_per_hour"] == pytest.approx(0.044 + new["size"]["disk_gb"] * 0.1 / 730, abs=1e-6)
    [body] = Sink.bodies
    [line] = [x for x in body["text"].splitlines() if leaked.instance_id in x]
    assert "owner train-7 &lt;!here&gt;" in line and "orphan for" in line
    assert f"est. {new['cost_per_hour']:.4f}/h" in line
    assert "<" not in body["text"] and ">" not in body["text"]


def test_a_missing_topic_and_an_unreachable_webhook_change_nothing_and_are_counted_next(db, topic):
    arn, sqs, url = topic
    add_backend(db)
    platform, leaked = leak(db)
    broken = {"NOTIFY_TOPIC_ARN": arn.replace("orphan-cleanup-digests", "no-such-topic"),
              "SLACK_WEBHOOK_URL": "http://127.0.0.1:1/services/unreachable"}

    # when both channels fail, then the cycle's outcome and exit code are those of a run without them
    code, doc, err = run(db, **broken)
    doc_missed = doc
    assert code == 0 and doc["outcome"] == "clean", err
    assert [g["action"] for g in doc["groups"] if g["primary_id"] == leaked.instance_id] == ["reported"]
    assert "not delivered to sns" in err and "not delivered to slack" in err
    assert received(sqs, url) == []

    # and the next digest delivered counts them
    platform.terminated_leak()
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)
    code, doc, _ = run(db, NOTIFY_TOPIC_ARN=arn)
    assert code == 0
    [digest] = received(sqs, url)
    assert digest["notify_failures"] == 2 and len(digest["new_orphans"]) == 1
    assert digest["missed_cycles"] == [doc_missed["cycle_id"]]

    # and a failed cycle's digest goes out too (a failed cycle deserves one), its exit code 1 kept
    with db.connection() as conn:
        conn.run("UPDATE backends SET account = '210987654321' WHERE id = :b", b=BACKEND)  # not moto's account
    code, doc, _ = run(db, NOTIFY_TOPIC_ARN=arn, SLACK_WEBHOOK_URL="http://127.0.0.1:1/x")
    assert code == 1 and doc["outcome"] == "failed"
    [digest] = received(sqs, url)
    assert digest["outcome"] == "failed" and digest["failures"] and digest["failures"][0]["region"] == "*"
