"""Safety seams of a cycle while it runs, on AWS and real parts: a terminate in flight when the
cycle loses its lease (the CLI as a subprocess, the call held at the recording proxy in front of
moto), a backend row edited between classification and deletion (the in-process runner's
``confirm``), and a lost publish in the deployed path (the real Lambda handlers on real SQS
queues, ``tests/support/sqs_harness.py``). Each test reproduced a defect of the code before
docs/SAFETY.md rules 15-20 (committed as a strict xfail naming the failure it gave), and asserts
the behaviour now."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from functions.aws import classifier, deleter, lister
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.plan import Plan
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.ledger_helpers import add_backend
from tests.support.seams import GONE, cli, query, start_cli
from tests.support.sqs_harness import (
    DeployedQueues,
    MotoPlatform,
    QueueRef,
    SqsEventSource,
    context,
    drain,
    queue_arn,
)

pytestmark = pytest.mark.usefixtures("moto_reset")
BACKEND = "aws-prod"
OTHER_ACCOUNT = "210987654321"
TERMINATE = "ec2:TerminateInstances"


@pytest.fixture
def proxy(moto_reset: str) -> Iterator[AwsProxy]:
    with AwsProxy(moto_reset) as p:
        yield p


def placeholder_orphan(db: Database, backend: str = BACKEND) -> tuple[MotoPlatform, str]:
    """A backend with one orphan VM: its owner row hard-deleted an hour ago. Returns (platform, VM id)."""
    add_backend(db, backend, mode="delete")
    platform = MotoPlatform(db, backend)
    leak = platform.placeholder_leak()
    platform.age_ledger()
    assert leak.instance_id is not None
    return platform, leak.instance_id


# ---- 6. a deletion after the lease is lost leaves a record ---------------------------------------

def _lose_the_lease(db: Database, how: str, cycle_id: str) -> None:
    if how == "expired":
        # the lease runs out while the call is in flight; the next run fails the old cycle as expired
        query(db, "UPDATE cleanup SET lease_expires_at = now() - interval '1 second' WHERE backend_id = :b",
              b=BACKEND)
        second = cli(db, "run", "--backend", BACKEND, "--mode", "report")
        assert second.returncode == 0, second.stderr
        assert query(db, "SELECT outcome FROM cycles WHERE id = :c", c=cycle_id) == [["failed"]]
    else:
        removed = cli(db, "backend", "remove", BACKEND, "--force")
        assert removed.returncode == 0, removed.stderr


@pytest.mark.parametrize("how", ["expired", "removed"], ids=["lease-expired", "backend-removed-force"])
def test_a_terminate_in_flight_when_the_lease_is_lost_is_journaled(emptied_db, proxy, how):
    """Setup: a delete run (CLI) of one orphan VM whose TerminateInstances is held at the proxy;
    meanwhile the cycle loses its lease (its lease expires and a second run fails the cycle, or
    `backend remove --force` fences it); then the call goes through. Shows: the VM is terminated
    and the append-only provider_journal holds the call's intent and its result (ok) for the old
    cycle, which `explain --json` lists under "journal"."""
    db = emptied_db
    platform, vm = placeholder_orphan(db)
    held = proxy.add_rule(Rule("TerminateInstances", hold=True, times=1))
    # a lease long enough that no heartbeat renews it while the test expires it
    first = start_cli(db, "run", "--backend", BACKEND, "--mode", "delete", "--yes", "--json",
                      AWS_ENDPOINT_URL=proxy.url, ORPHAN_CLEANUP_LEASE_SECONDS="600",
                      ORPHAN_CLEANUP_READ_TIMEOUT="120")
    try:
        assert held.arrived.wait(60), "the delete run never sent TerminateInstances"
        [[cycle_id]] = query(db, "SELECT id FROM cycles WHERE backend_id = :b", b=BACKEND)
        _lose_the_lease(db, how, cycle_id)
    finally:
        held.release()
        _, err = first.communicate(timeout=120)

    assert platform.instance_state(vm) in GONE, err
    rows = query(db, "SELECT phase, call, target, cycle_id, outcome FROM provider_journal"
                     " WHERE target = :vm AND call = :call ORDER BY phase", vm=vm, call=TERMINATE)
    assert [r[:4] for r in rows] == [["intent", TERMINATE, vm, cycle_id], ["result", TERMINATE, vm, cycle_id]], rows
    assert rows[1][4] == "ok"
    explained = cli(db, "explain", "--backend", BACKEND, vm, "--json")
    assert explained.returncode == 0, explained.stderr
    journal = json.loads(explained.stdout)["journal"]
    seen = {(e["cycle_id"], e["phase"], e["call"], e["target"], e["outcome"] if e["phase"] == "result" else None)
            for e in journal}
    assert {(cycle_id, "intent", TERMINATE, vm, None), (cycle_id, "result", TERMINATE, vm, "ok")} <= seen, journal


# ---- 8. a backend row edited while its cycle runs --------------------------------------------------

def test_the_deleter_works_on_the_backend_as_it_was_when_the_lease_was_taken(emptied_db, moto_reset):
    """Setup: backend aws-prod lists moto's account 123456789012 with one orphan VM; an in-process
    delete cycle, whose confirm callback (between classification and deletion) rewrites the row:
    account 210987654321 and a role_arn of that account (moto lets the role be assumed).
    Shows: the deleter neither follows the edit nor deletes against the account it no longer names:
    the request is skipped as backend_changed, the orphan in 123456789012 is still running, nothing
    is journaled, and the cycle does not settle (the next cycle lists the row as it is now)."""
    db = emptied_db
    platform, vm = placeholder_orphan(db)

    def edit_the_row(plan: Plan) -> bool:
        assert [g.primary_id for g in (d.group for d in plan.deletes)] == [vm]
        query(db, "UPDATE backends SET account = :a,"
                  " settings = jsonb_set(settings, '{role_arn}', CAST(:r AS jsonb)) WHERE id = :b",
              a=OTHER_ACCOUNT, r=json.dumps(f"arn:aws:iam::{OTHER_ACCOUNT}:role/other"), b=BACKEND)
        return True

    settings = Settings.explicit(confirm_seconds=0, margin_seconds=0, aws_endpoint_url=moto_reset, max_mode="delete")
    pipeline: Pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                                  delete_queue=InProcessQueue())
    report = run_cycle(pipeline, BACKEND, mode="delete", confirm=edit_the_row)

    assert platform.instance_state(vm) not in GONE
    [group] = [g for g in report.groups if g.primary_id == vm]
    assert group.action != "deleted", group
    assert query(db, "SELECT result->>'skipped' FROM delete_requests") == [["backend_changed"]]
    assert query(db, "SELECT count(*) FROM provider_journal") == [[0]]
    assert report.outcome != "clean"


# ---- 10. one lost publish ------------------------------------------------------------------------------

# SQS's answer to a send it does not take (JSON protocol), which botocore does not retry.
SQS_REFUSED = (400, [("Content-Type", "application/x-amz-json-1.0"),
                     ("x-amzn-query-error", "AWS.SimpleQueueService.InvalidSecurity;Sender")],
               b'{"__type": "com.amazonaws.sqs#InvalidSecurity", "message": "refused by the test proxy"}')


def _source(stack: DeployedQueues, url: str, handler: object, name: str) -> SqsEventSource:
    return SqsEventSource(stack.sqs, QueueRef(url, queue_arn(stack.sqs, url), "", ""), handler, name)  # type: ignore[arg-type]


def test_a_lost_publish_of_a_delete_request_is_published_again_on_redelivery(db, moto_reset, monkeypatch, proxy):
    """Setup: the deployed AWS path (real handlers, real SQS queues on moto, the functions' AWS calls
    through the proxy); a delete-mode cycle of one orphan VM whose first SendMessage of the delete
    request is refused, so the classifier's record fails and SQS redelivers the last batch.
    Shows: the redelivery publishes the still-queued request again, the deleter terminates the
    VM and the cycle finishes (has an outcome) without waiting for its deadline."""
    stack = DeployedQueues(db, monkeypatch, "lostpub")
    platform, vm = placeholder_orphan(db)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # the functions' calls; the harness's client goes direct
    lost = proxy.add_rule(Rule("SendMessage", match=lambda body: b"lostpub-delete" in body, times=1,
                               reply=SQS_REFUSED))
    summary = lister.handler({"backend": BACKEND}, context("orphan-cleanup-lister"))
    assert summary["ok"] and summary["started"], summary
    classify = _source(stack, stack.listing, classifier.handler, "orphan-cleanup-classifier")
    delete = _source(stack, stack.deletes, deleter.handler, "orphan-cleanup-deleter")

    first = classify.poll()
    assert first.received == 1 and first.failed and lost.seen == 1, first  # the publish was lost
    drain([classify, delete])

    [[outcome, open_deletes]] = query(db, "SELECT outcome, open_deletes FROM cycles WHERE id = :c",
                                      c=summary["cycle_id"])
    assert (outcome is not None, open_deletes) == (True, 0)
    assert platform.instance_state(vm) in GONE
