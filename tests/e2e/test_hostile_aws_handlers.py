"""Hostile input for the AWS Lambda handlers, wired as deployed: real SQS and
EC2 on the moto server, a real Postgres ledger, real Powertools event models.

- The lister answers any event with a result (``ok`` false and an error for a
  bad one), never an exception.
- The classifier and the deleter fail exactly the bad records of a batch in
  ``batchItemFailures``: wrong types, not JSON, huge bodies, bad refs, unknown
  backends; a good record in the same batch succeeds, duplicates change nothing,
  and a forged or tampered delete request deletes nothing.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.aws import classifier, deleter, lister
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.db import Database
from tests.support.sqs_harness import DeployedQueues, Launched, MotoPlatform, context

BACKEND = "aws-prod"
pytestmark = pytest.mark.usefixtures("moto_reset")


def record(body: str, source: str = "arn:aws:sqs:us-east-1:123456789012:q") -> dict[str, Any]:
    """An SQS record as Lambda delivers it (valid per Powertools' SqsRecordModel)."""
    mid = str(uuid.uuid4())
    return {"messageId": mid, "receiptHandle": f"rh-{mid}", "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000",
                           "SenderId": "AIDAEXAMPLE", "ApproximateFirstReceiveTimestamp": "1700000000000"},
            "messageAttributes": {}, "md5OfBody": "0" * 32, "eventSource": "aws:sqs",
            "eventSourceARN": source, "awsRegion": "us-east-1"}


class Stack(DeployedQueues):
    """The three handlers, their queues, a backend in delete mode and a fleet:
    an owner with a leaked earlier attempt (an orphan) and a detached volume of
    its own (protected), an orphan of a terminated owner, a foreign instance."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(db, monkeypatch, "hostile")
        with db.connection() as conn:
            conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                     " VALUES (:i, 'aws', '123456789012', '{us-east-1}', '{}', 'delete')", i=BACKEND)
        self.platform = platform = MotoPlatform(db, BACKEND)
        issued = platform.ledger.issue_ref(owner_name="live")
        self.leaked, _ = platform.launch(issued.provider_ref, data_volume=False)  # attempt 1: error after create
        self.tracked, _ = platform.launch(issued.provider_ref)  # attempt 2, recorded below
        self.detached = platform.volume(issued.provider_ref)  # the live owner's own detached volume
        platform.ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=self.tracked,
                                          region="us-east-1", status=OwnerStatus.BUSY)
        self.live_ref = issued.provider_ref
        self.terminated: Launched = platform.terminated_leak()
        self.foreign: Launched = platform.foreign()

    def list_manually(self) -> str:
        summary = lister.handler({"backend": BACKEND, "mode": "delete"}, context("lister"))
        assert summary["ok"], summary
        return summary["cycle_id"]

    def state(self, instance_id: str) -> str:
        return self.platform.instance_state(instance_id)

    def volumes(self) -> set[str]:
        return self.platform.all_volumes()

    def outcome(self, cycle_id: str) -> str | None:
        with self.db.connection() as conn:
            return conn.run("SELECT outcome FROM cycles WHERE id = :c", c=cycle_id)[0][0]


@pytest.fixture
def stack(db: Database, monkeypatch: pytest.MonkeyPatch) -> Stack:
    return Stack(db, monkeypatch)


def failures(response: dict[str, Any]) -> set[str]:
    return {f["itemIdentifier"] for f in response["batchItemFailures"]}


# ---- lister ---------------------------------------------------------------------------------

EVENTS = st.one_of(
    st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.text(max_size=10)), max_size=3),
    st.fixed_dictionaries({"backend": st.one_of(st.text(max_size=30), st.text(min_size=201, max_size=260),
                                                st.just("nope"), st.just(""), st.just("a\x00b"), st.integers(),
                                                st.none(), st.lists(st.text(), max_size=2))},
                          optional={"mode": st.one_of(st.sampled_from(["report", "delete", "off", "DELETE", ""]),
                                                      st.integers()),
                                    "extra": st.text(max_size=10)}),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event=EVENTS)
def test_the_lister_answers_any_event_with_a_result(stack: Stack, event: Any) -> None:
    response = lister.handler(event, context("lister"))

    assert isinstance(response, dict) and isinstance(response.get("ok"), bool)
    if not response["ok"]:
        assert isinstance(response.get("error"), str) and response["error"]
    elif event == {}:  # the schedule's tick
        assert isinstance(response.get("jobs"), list)
    else:  # only a real backend with a valid (or no) mode gets this far
        assert isinstance(event, dict) and event.get("backend") == BACKEND


def test_the_lister_refuses_a_backend_name_the_database_cannot_store(stack: Stack) -> None:
    response = lister.handler({"backend": "aws-prod\x00; DROP TABLE backends"}, context("lister"))

    assert response["ok"] is False and response["error"]


# ---- classifier -------------------------------------------------------------------------------

def hostile_listing_bodies(good: str) -> dict[str, str]:
    batch = json.loads(good)
    bad_ref = {**batch, "groups": [{**g, "provider_ref": "NOT-A-REF"} for g in batch["groups"]] or
               [{"provider_ref": "NOT-A-REF", "region": "us-east-1"}]}
    empty_id = {**batch, "groups": [{"provider_ref": "abcdefgh1234", "region": "us-east-1",
                                     "resources": [{"kind": "instance", "id": "", "region": "us-east-1"}]}]}
    return {
        "not json": "{not json",
        "a list": "[1, 2, 3]",
        "a number": "42",
        "a string": json.dumps("ListingBatch"),
        "null": "null",
        "wrong field types": json.dumps({**batch, "seq": "zero", "groups": "all"}),
        "bad ref": json.dumps(bad_ref),
        "empty resource id": json.dumps(empty_id),
        "unknown backend": json.dumps({**batch, "backend": "nope"}),
        "unknown message version": json.dumps({**batch, "v": 2}),
        "huge": json.dumps({**batch, "groups": [batch["groups"][0] if batch["groups"] else {}] * 3000}),
    }


def test_the_classifier_fails_exactly_the_bad_records(stack: Stack) -> None:
    # given a real cycle's listing batches, mixed with hostile records and duplicates
    cycle_id = stack.list_manually()
    good = stack.receive(stack.listing)
    bad = hostile_listing_bodies(good[0])
    forged = ListingBatch(cycle_id="f" * 32, backend=BACKEND, seq=0, listed_at=datetime.now(timezone.utc),
                          mode="delete", last=True, batch_count=1).model_dump_json()
    good_records = [record(b) for b in good] + [record(b) for b in good] + [record(forged)]
    bad_records = {name: record(body) for name, body in bad.items()}
    records = good_records + list(bad_records.values())
    random.Random(7).shuffle(records)

    # when the classifier gets them in one SQS batch
    response = classifier.handler({"Records": records}, context("classifier"))

    # then exactly the hostile records failed, the real batches were applied once,
    # and the cycle went on to dispatch its orphans
    assert failures(response) == {r["messageId"] for r in bad_records.values()}
    requests = [DeleteRequest.model_validate_json(b) for b in stack.receive(stack.deletes)]
    # (each once, or twice: a redelivered last batch re-publishes the requests still queued, SAFETY.md rule 20)
    assert sorted({r.group.primary_id or "-" for r in requests}) == sorted([stack.leaked, stack.terminated.instance_id])
    assert all(r.cycle_id == cycle_id for r in requests)
    assert stack.state(stack.tracked) == "running" and stack.state(stack.foreign.instance_id) == "running"


# ---- deleter ------------------------------------------------------------------------------------

def test_the_deleter_fails_exactly_the_bad_records_and_deletes_only_orphans(stack: Stack) -> None:
    # given the delete requests of a real cycle
    cycle_id = stack.list_manually()
    classified = classifier.handler({"Records": [record(b) for b in stack.receive(stack.listing)]},
                                    context("classifier"))
    assert failures(classified) == set()
    good = [DeleteRequest.model_validate_json(b) for b in stack.receive(stack.deletes)]
    leaked = next(r for r in good if r.group.primary_id == stack.leaked)
    volumes_before = stack.volumes()

    # and hostile ones: malformed bodies, and well-formed requests that try to
    # delete what is tracked, protected or foreign
    def forged(**kw: Any) -> str:
        return leaked.model_copy(update=kw).model_dump_json()

    tracked_group = ResourceGroup(provider_ref=stack.live_ref, region="us-east-1", primary_id=stack.tracked,
                                  resources=(Resource(kind=ResourceKind.INSTANCE, id=stack.tracked, region="us-east-1",
                                                      tags={"provider_ref": stack.live_ref}),))
    tampered = leaked.group.model_copy(update={"resources": leaked.group.resources + (
        Resource(kind=ResourceKind.VOLUME, id=stack.detached, region="us-east-1",
                 tags={"provider_ref": stack.live_ref}),)})
    foreign_group = ResourceGroup(provider_ref=stack.foreign.ref, region="us-east-1",
                                  primary_id=stack.foreign.instance_id, resources=(Resource(
                                      kind=ResourceKind.INSTANCE, id=stack.foreign.instance_id, region="us-east-1",
                                      tags={"provider_ref": stack.foreign.ref}),))
    bad = {
        "not json": "]]", "a list": "[]", "null": "null", "a number": "7",
        "bad ref": forged().replace(leaked.group.provider_ref, "NOT-A-REF"),
        "unknown backend": forged(backend="nope"),
        "no group": json.dumps({"v": 1, "cycle_id": cycle_id, "backend": BACKEND}),
        "huge": json.dumps({**json.loads(forged()), "pad": "x" * 300_000}),
    }
    harmless = {  # valid shapes: acknowledged, and nothing is deleted
        "tracked group, live cycle": forged(group=tracked_group),
        "tracked group, unknown cycle": forged(cycle_id="0" * 32, group=tracked_group),
        "foreign group": forged(group=foreign_group),
        "tampered orphan group": forged(group=tampered),
    }
    bad_records = [record(b) for b in bad.values()]
    records = [record(b) for b in harmless.values()] + bad_records + [record(r.model_dump_json()) for r in good * 2]
    random.Random(7).shuffle(records)
    event = {"Records": records}

    # when the deleter gets them in one SQS batch
    response = deleter.handler(event, context("deleter"))

    # then exactly the malformed records failed; only the orphans went, once
    assert failures(response) == {r["messageId"] for r in bad_records}
    assert stack.state(stack.leaked) in ("shutting-down", "terminated")
    assert stack.state(stack.terminated.instance_id) in ("shutting-down", "terminated")
    assert stack.state(stack.tracked) == "running" and stack.state(stack.foreign.instance_id) == "running"
    assert stack.detached in stack.volumes(), "a tampered request deleted the live owner's own volume"
    assert set(stack.foreign.volume_ids) <= stack.volumes() <= volumes_before
