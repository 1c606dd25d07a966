"""One schedule per stack, through the real Lambda handlers and real SQS queues on the
moto server: the tick (``{}``) queues listing jobs, the lister consumes them from the
jobs queue, backends that share an account are listed once, and every backend's cycle
runs to its own end. The EC2 and STS calls are counted by a proxy in front of moto."""

from __future__ import annotations

import pytest

from functions.aws import classifier, deleter, lister
from orphan_cleanup.ledger.db import Database
from tests.support.aws_proxy import AwsProxy
from tests.support.ledger_helpers import add_backend, cleanup_row, cycle_row
from tests.support.sqs_harness import (
    DeployedQueues,
    MotoPlatform,
    QueueRef,
    SqsEventSource,
    context,
    drain,
    lambda_record,
    queue_arn,
)

pytestmark = pytest.mark.usefixtures("moto_reset")
SHARED = ("sky-a", "sky-b", "sky-c")


class Stack(DeployedQueues):
    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(db, monkeypatch, "tick")
        self.monkeypatch = monkeypatch

        def source(url: str, handler, name: str, batch_size: int) -> SqsEventSource:
            return SqsEventSource(self.sqs, QueueRef(url=url, arn=queue_arn(self.sqs, url), dlq_url="", dlq_arn=""),
                                  handler, name, batch_size=batch_size)
        self.jobs_source = source(self.jobs, lister.handler, "orphan-cleanup-lister", 1)
        self.classifier = source(self.listing, classifier.handler, "orphan-cleanup-classifier", 5)
        self.deleter = source(self.deletes, deleter.handler, "orphan-cleanup-deleter", 1)

    def tick(self) -> dict:
        response = lister.handler({}, context("orphan-cleanup-lister"))
        assert response["ok"], response
        return response

    def run_everything(self) -> None:
        drain([self.jobs_source, self.classifier, self.deleter])
        assert not (self.jobs_source.errors or self.classifier.errors or self.deleter.errors)


@pytest.fixture
def stack(emptied_db: Database, monkeypatch: pytest.MonkeyPatch) -> Stack:
    return Stack(emptied_db, monkeypatch)


def test_the_tick_lists_a_shared_account_once_and_every_backend_finishes_its_own_cycle(stack, moto_reset):
    db = stack.db
    for b in SHARED:
        add_backend(db, b, mode="delete" if b == "sky-c" else "report")
    tracked = {b: MotoPlatform(db, b).tracked() for b in SHARED}
    leak = MotoPlatform(db, "sky-c").terminated_leak()

    with AwsProxy(moto_reset) as counter:
        stack.monkeypatch.setenv("AWS_ENDPOINT_URL", counter.url)
        tick = stack.tick()
        assert tick["jobs"] == [list(SHARED)]
        assert tick["due"] == dict.fromkeys(SHARED, "never_cleaned")
        assert counter.service_counts()["ec2"] == counter.service_counts()["sts"] == 0  # the tick calls no provider
        stack.jobs_source.drain()
        shared = dict(counter.service_counts())
        stack.run_everything()

        # baseline: the same three backends listed one by one (manual invokes)
        counter.reset()
        for b in SHARED:
            assert lister.handler({"backend": b, "mode": "report"}, context("lister"))["started"]
        one_by_one = dict(counter.service_counts())
        stack.run_everything()
    stack.monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)

    # one listing and one identity check served three backends
    assert shared["ec2"] > 0 and shared["ec2"] * 3 == one_by_one["ec2"], (shared, one_by_one)
    assert shared["sts"] == 1, shared  # GetCallerIdentity once for the three
    # every backend has its own clean or finished cycle and clean_at
    with db.connection() as conn:
        cycles = dict(conn.run("SELECT backend_id, count(*) FROM cycles GROUP BY backend_id"))
    assert cycles == dict.fromkeys(SHARED, 2)
    for b in SHARED:
        assert cleanup_row(db, b)["clean_at"] is not None
    # the delete-mode backend deleted the leak; every tracked VM still runs
    assert MotoPlatform(db, "sky-c").instance_state(leak.instance_id) in ("shutting-down", "terminated")
    for launched in tracked.values():
        assert MotoPlatform(db).instance_state(launched.instance_id) == "running"


def test_a_direct_invoke_still_runs_exactly_that_backend(stack):
    add_backend(stack.db, "solo")
    add_backend(stack.db, "bystander")
    MotoPlatform(stack.db, "solo").tracked()
    response = lister.handler({"backend": "solo"}, context("lister"))
    assert response["ok"] and response["started"] and response["backend"] == "solo"
    assert stack.receive(stack.jobs) == []
    with stack.db.connection() as conn:
        assert [r[0] for r in conn.run("SELECT backend_id FROM cycles")] == ["solo"]
    assert cycle_row(stack.db, response["cycle_id"])["mode"] == "report"


def test_a_malformed_job_fails_its_record_alone(stack):
    add_backend(stack.db, "ok-backend")
    MotoPlatform(stack.db, "ok-backend").tracked()
    good = lambda_record('{"v": 1, "backends": ["ok-backend"]}')
    bad = lambda_record('{"v": 1, "backends": []}')
    response = lister.handler({"Records": [good, bad]}, context("lister"))
    assert response["batchItemFailures"] == [{"itemIdentifier": bad["messageId"]}]
    with stack.db.connection() as conn:
        assert conn.run("SELECT backend_id FROM cycles") == [["ok-backend"]]


def test_a_tick_without_a_jobs_queue_is_a_clear_error(stack, monkeypatch):
    monkeypatch.delenv("JOBS_QUEUE_URL")
    response = lister.handler({}, context("lister"))
    assert response == {"ok": False, "error": "the tick needs a jobs queue (JOBS_QUEUE_URL on AWS, JOBS_TOPIC on GCP)"}
