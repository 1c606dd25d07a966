"""Messages are hints, the database is the truth (SAFETY.md rule 12), through
the real classifier and deleter Lambda handlers with Powertools SQS events,
real SQS and EC2 on the moto server and a real Postgres ledger.

A ListingBatch or DeleteRequest that disagrees with its cycle's own rows
(mode, backend, listing time, the resources classified), or that names one
group twice, fails alone in ``batchItemFailures`` and nothing of it is
applied, while a good record of the same event is.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from typing import Any

import pytest

from functions.aws import classifier, deleter, lister
from orphan_cleanup.core.listing import Resource, ResourceKind
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.ledger.db import Database
from tests.support.ledger_helpers import add_backend, cycle_row
from tests.support.sqs_harness import DeployedQueues, Launched, MotoPlatform, context, lambda_record

GONE = ("shutting-down", "terminated")
pytestmark = pytest.mark.usefixtures("moto_reset")


class Stack(DeployedQueues):
    """The deployed functions' queues and three backends on moto's account:
    ``aws-r`` (report), ``aws-d`` (delete) and ``aws-x`` (report, the "other"
    backend a forged message names). The fleet (owners of ``aws-d``): a tracked
    owner, two orphans of terminated owners and a foreign instance."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(db, monkeypatch, "hints")
        add_backend(db, "aws-r", mode="report")
        add_backend(db, "aws-d", mode="delete")
        add_backend(db, "aws-x", mode="report")
        self.platform = MotoPlatform(db, "aws-d")
        self.tracked: Launched = self.platform.tracked()
        self.leaks: list[Launched] = [self.platform.terminated_leak(), self.platform.terminated_leak()]
        self.foreign: Launched = self.platform.foreign()

    def list_scheduled(self, backend: str) -> tuple[str, list[str]]:
        """A scheduled lister run (the backend's own mode); returns its cycle and batches."""
        summary = lister.handler({"backend": backend}, context("lister"))
        assert summary["ok"] and summary["started"], summary
        bodies = self.receive(self.listing)
        assert bodies and all(json.loads(b)["cycle_id"] == summary["cycle_id"] for b in bodies)
        return summary["cycle_id"], bodies

    def classify(self, records: list[dict[str, Any]]) -> set[str]:
        response = classifier.handler({"Records": records}, context("classifier"))
        return {f["itemIdentifier"] for f in response["batchItemFailures"]}

    def delete(self, records: list[dict[str, Any]]) -> set[str]:
        response = deleter.handler({"Records": records}, context("deleter"))
        return {f["itemIdentifier"] for f in response["batchItemFailures"]}

    def state(self, instance_id: str) -> str:
        return self.platform.instance_state(instance_id)

    def applied(self, cycle_id: str) -> dict[str, int]:
        """What the cycle's rows say was applied for it."""
        with self.db.connection() as conn:
            return {t: conn.run(f"SELECT count(*) FROM {t} WHERE cycle_id = :c", c=cycle_id)[0][0]
                    for t in ("cycle_batches", "cycle_groups", "delete_requests")}

    def all_running(self) -> bool:
        launched = (self.tracked, self.foreign, *self.leaks)
        return all(x.instance_id is not None and self.state(x.instance_id) == "running" for x in launched)


@pytest.fixture
def stack(emptied_db: Database, monkeypatch: pytest.MonkeyPatch) -> Stack:
    return Stack(emptied_db, monkeypatch)


NOTHING = {"cycle_batches": 0, "cycle_groups": 0, "delete_requests": 0}


def shuffled(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    random.Random(18).shuffle(records)
    return records


# ---- listing batches ----------------------------------------------------------------------------

def tampered_batches(body: str) -> dict[str, str]:
    batch = json.loads(body)
    listed_at = datetime.fromisoformat(batch["listed_at"])
    return {
        "mode flipped to delete": json.dumps({**batch, "mode": "delete"}),
        "another backend": json.dumps({**batch, "backend": "aws-x"}),
        "listed_at moved back": json.dumps({**batch, "listed_at": (listed_at - timedelta(hours=1)).isoformat()}),
        "listed_at moved on": json.dumps({**batch, "listed_at": (listed_at + timedelta(seconds=1)).isoformat()}),
    }


def test_a_listing_batch_that_disagrees_with_its_cycle_is_refused_whole(stack):
    # given a report-mode cycle's batch, tampered, and a good batch of another cycle
    report_cycle, bodies = stack.list_scheduled("aws-r")
    assert len(bodies) == 1 and json.loads(bodies[0])["mode"] == "report"
    other_cycle, other_bodies = stack.list_scheduled("aws-x")
    bad = {name: lambda_record(body) for name, body in tampered_batches(bodies[0]).items()}
    good = [lambda_record(b) for b in other_bodies]

    # when the classifier gets them in one event
    failed = stack.classify(shuffled([*bad.values(), *good]))

    # then exactly the tampered records failed, nothing of them was applied, the good one was
    assert failed == {r["messageId"] for r in bad.values()}
    assert stack.applied(report_cycle) == NOTHING
    assert cycle_row(stack.db, report_cycle)["outcome"] is None
    assert stack.applied(other_cycle)["cycle_batches"] == 1
    assert cycle_row(stack.db, other_cycle)["outcome"] == "clean"
    assert stack.receive(stack.deletes) == [] and stack.all_running()

    # and the genuine batch still applies afterwards, in the cycle's own mode
    assert stack.classify([lambda_record(bodies[0])]) == set()
    assert stack.applied(report_cycle)["cycle_batches"] == 1
    with stack.db.connection() as conn:
        orphans = conn.run("SELECT primary_id, action FROM cycle_groups WHERE cycle_id = :c AND verdict = 'orphan'",
                           c=report_cycle)
    assert sorted(map(tuple, orphans)) == sorted((leak.instance_id, "reported") for leak in stack.leaks)
    assert stack.receive(stack.deletes) == [] and stack.all_running()


@pytest.mark.parametrize("which", ["tracked", "orphan", "ignored", "same key, fewer resources"])
def test_a_listing_batch_with_a_group_twice_is_refused_whole(stack, which):
    # given a batch of a real cycle naming one group twice, and a good batch of another cycle
    cycle_id, bodies = stack.list_scheduled("aws-r")
    other_cycle, other_bodies = stack.list_scheduled("aws-x")
    batch = json.loads(bodies[0])
    primary = {"tracked": stack.tracked.instance_id, "orphan": stack.leaks[0].instance_id,
               "ignored": stack.foreign.instance_id, "same key, fewer resources": stack.tracked.instance_id}[which]
    group = next(g for g in batch["groups"] if g["primary_id"] == primary)
    twin = group if which != "same key, fewer resources" else {
        **group, "resources": [r for r in group["resources"] if r["id"] == primary]}
    assert len(twin["resources"]) >= 1
    bad = lambda_record(json.dumps({**batch, "groups": [*batch["groups"], twin]}))

    # when the classifier gets it with the good one
    failed = stack.classify(shuffled([bad, *(lambda_record(b) for b in other_bodies)]))

    # then it alone fails and nothing of it is applied
    assert failed == {bad["messageId"]}
    assert stack.applied(cycle_id) == NOTHING
    assert stack.applied(other_cycle)["cycle_batches"] == 1
    assert stack.receive(stack.deletes) == [] and stack.all_running()


# ---- delete requests ----------------------------------------------------------------------------

def delete_cycle(stack: Stack) -> tuple[str, dict[str, DeleteRequest]]:
    """A delete-mode cycle listed and classified; its delete requests by primary id."""
    cycle_id, bodies = stack.list_scheduled("aws-d")
    assert stack.classify([lambda_record(b) for b in bodies]) == set()
    requests = [DeleteRequest.model_validate_json(b) for b in stack.receive(stack.deletes)]
    by_primary = {r.group.primary_id: r for r in requests}
    assert set(by_primary) == {leak.instance_id for leak in stack.leaks}
    return cycle_id, by_primary


def test_a_delete_request_naming_another_backend_fails_and_deletes_nothing(stack):
    # given the delete requests of a real delete-mode cycle, one forged to name another backend
    _, requests = delete_cycle(stack)
    first, second = (requests[leak.instance_id] for leak in stack.leaks)
    bad = lambda_record(first.model_copy(update={"backend": "aws-x"}).model_dump_json())
    good = lambda_record(second.model_dump_json())

    # when the deleter gets both in one event
    failed = stack.delete(shuffled([bad, good]))

    # then the forged one failed and deleted nothing, the good one deleted its orphan
    assert failed == {bad["messageId"]}
    assert stack.state(stack.leaks[0].instance_id) == "running"
    assert stack.state(stack.leaks[1].instance_id) in GONE
    assert stack.state(stack.tracked.instance_id) == "running"


def test_a_delete_request_whose_group_gained_a_resource_deletes_nothing(stack):
    # given a real delete request whose group now also holds another owner's tracked VM
    _, requests = delete_cycle(stack)
    request = requests[stack.leaks[0].instance_id]
    tracked = Resource(kind=ResourceKind.INSTANCE, id=stack.tracked.instance_id, region="us-east-1",
                       tags={"provider_ref": stack.tracked.ref})
    widened = request.group.model_copy(update={"resources": (*request.group.resources, tracked)})
    assert widened.key == request.group.key

    # when the deleter gets it
    stack.delete([lambda_record(request.model_copy(update={"group": widened}).model_dump_json())])

    # then nothing was deleted: neither the tracked VM nor the orphan
    assert stack.all_running()
    assert set(stack.tracked.volume_ids) <= stack.platform.all_volumes()

    # and the genuine request still deletes only the orphan
    assert stack.delete([lambda_record(request.model_dump_json())]) == set()
    assert stack.state(stack.leaks[0].instance_id) in GONE
    assert stack.state(stack.tracked.instance_id) == "running"


def test_a_report_cycle_never_deletes_even_with_a_forged_delete_request(stack):
    # given a report-mode cycle, listed (still open) and then classified
    cycle_id, bodies = stack.list_scheduled("aws-r")
    batch = ListingBatch.model_validate_json(bodies[0])
    orphan_groups = [g for g in batch.groups if g.primary_id in {leak.instance_id for leak in stack.leaks}]
    assert len(orphan_groups) == 2

    def forged() -> list[dict[str, Any]]:
        return [lambda_record(DeleteRequest(cycle_id=cycle_id, backend="aws-r", group=g).model_dump_json())
                for g in orphan_groups]

    # when forged delete requests for its orphans arrive while it is open, and after it finished
    stack.delete(forged())
    assert stack.classify([lambda_record(bodies[0])]) == set()
    assert cycle_row(stack.db, cycle_id)["outcome"] == "clean"
    stack.delete(forged())

    # then nothing was deleted and the cycle's groups stayed reported
    assert stack.all_running()
    with stack.db.connection() as conn:
        actions = conn.run("SELECT DISTINCT action FROM cycle_groups WHERE cycle_id = :c AND verdict = 'orphan'",
                           c=cycle_id)
    assert [tuple(a) for a in actions] == [("reported",)]
    assert stack.applied(cycle_id)["delete_requests"] == 0
