"""What the deployed functions tell CloudWatch (Powertools EMF on stdout): per-backend
counts (``Backend`` dimension) of groups listed, verdicts, delete outcomes and cycle
outcomes, and the tick's ``StalestBackendSeconds``, which the stacks alarm on; and the
digest the function that finished a cycle publishes to the stack's SNS topic. Through the
real Lambda handlers, real SQS queues and SNS on the moto server and a real Postgres."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from functions.aws import classifier, deleter, lister
from orphan_cleanup.ledger.db import Database
from tests.support.ledger_helpers import add_backend
from tests.support.sqs_harness import DeployedQueues, MotoPlatform, QueueRef, SqsEventSource, context, drain, queue_arn

pytestmark = pytest.mark.usefixtures("moto_reset")
BACKEND = "aws-prod"


def emf_documents(out: str) -> list[dict[str, Any]]:
    """Every EMF document printed: JSON lines with an ``_aws.CloudWatchMetrics`` block."""
    docs = []
    for line in out.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            doc = json.loads(line)
            if doc["_aws"].get("CloudWatchMetrics"):
                docs.append(doc)
    return docs


def metric_values(docs: list[dict[str, Any]], name: str, **dims: str) -> list[float]:
    """The values of ``name`` in documents whose dimension set is exactly ``service`` plus ``dims``."""
    found = []
    for doc in docs:
        for block in doc["_aws"]["CloudWatchMetrics"]:
            names = {m["Name"] for m in block["Metrics"]}
            if name in names and [sorted(d) for d in block["Dimensions"]] == [sorted({"service", *dims})] \
                    and all(doc.get(k) == v for k, v in dims.items()):
                value = doc[name]
                found += value if isinstance(value, list) else [value]
    return found


def test_per_backend_counts_and_the_stalest_backend_reach_the_emf_output(emptied_db: Database, monkeypatch,
                                                                         capsys):
    # given a deployed stack (jobs, listing and delete queues) and a backend in delete mode with a leak
    db = emptied_db
    stack = DeployedQueues(db, monkeypatch, "metrics")

    def source(url: str, handler: Any, name: str) -> SqsEventSource:
        return SqsEventSource(stack.sqs, QueueRef(url=url, arn=queue_arn(stack.sqs, url), dlq_url="", dlq_arn=""),
                              handler, name, batch_size=1)
    sources = [source(stack.jobs, lister.handler, "orphan-cleanup-lister"),
               source(stack.listing, classifier.handler, "orphan-cleanup-classifier"),
               source(stack.deletes, deleter.handler, "orphan-cleanup-deleter")]
    # and the stack's digest topic, with an SQS subscription collecting what it gets
    sns = boto3.client("sns", region_name="us-east-1")
    topic = sns.create_topic(Name="digests")["TopicArn"]
    inbox = stack.sqs.create_queue(QueueName="digest-inbox")["QueueUrl"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn(stack.sqs, inbox),
                  Attributes={"RawMessageDelivery": "true"})
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", topic)
    add_backend(db, BACKEND, mode="delete")
    platform = MotoPlatform(db, BACKEND)
    platform.tracked()
    leak = platform.terminated_leak()
    platform.age_ledger()
    capsys.readouterr()

    # when the tick runs and every queue is drained
    assert lister.handler({}, context("orphan-cleanup-lister"))["ok"]
    tick_docs = emf_documents(capsys.readouterr().out)
    drain(sources)
    assert not any(s.errors for s in sources)
    docs = emf_documents(capsys.readouterr().out)

    # then the tick emitted StalestBackendSeconds (the backend was just enrolled: a few seconds at most)
    [stalest] = metric_values(tick_docs, "StalestBackendSeconds")
    assert 0 <= stalest < 600
    # and the functions counted per backend: groups listed, verdicts, the delete, the cycle's outcome
    assert sum(metric_values(docs, "GroupsListed", Backend=BACKEND)) == 2
    assert sum(metric_values(docs, "Groups_orphan", Backend=BACKEND)) == 1
    assert sum(metric_values(docs, "Groups_tracked", Backend=BACKEND)) == 1
    assert sum(metric_values(docs, "Delete_deleted", Backend=BACKEND)) >= 1
    outcomes = {n for n in ("Cycles_clean", "Cycles_unsettled", "Cycles_failed")
                if metric_values(docs, n, Backend=BACKEND)}
    assert outcomes == {"Cycles_clean"}
    assert platform.instance_state(leak.instance_id) in ("shutting-down", "terminated")
    # and the function that finished the cycle sent its one digest: the orphan, new and deleted
    [digest] = [json.loads(b) for b in stack.receive(inbox)]
    assert (digest["backend"], digest["mode"], digest["outcome"]) == (BACKEND, "delete", "clean")
    assert [g["primary_id"] for g in digest["new_orphans"]] == [leak.instance_id]
    assert [g["primary_id"] for g in digest["deleted"]] == [leak.instance_id]

    # when the backend has gone two hours without a clean cycle and the tick runs again
    with db.connection() as conn:
        conn.run("UPDATE cleanup SET clean_at = oc_clock() - interval '2 hours',"
                 " next_due_at = oc_clock() + interval '1 hour' WHERE backend_id = :b", b=BACKEND)
    assert lister.handler({}, context("orphan-cleanup-lister"))["ok"]

    # then StalestBackendSeconds says so
    [stalest] = metric_values(emf_documents(capsys.readouterr().out), "StalestBackendSeconds")
    assert 7200 <= stalest < 7200 + 600
