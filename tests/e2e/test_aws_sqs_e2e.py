"""The deployed AWS shape end to end: the real Lambda handlers wired through
real SQS queues (with redrive to a DLQ) on the moto server, EC2 resources on
moto, a real Postgres ledger written with ``LedgerClient``.

The harness (``tests/support/sqs_harness.py``) plays Lambda's SQS poller:
it builds the SQS event Lambda would deliver and deletes from the queue only
the records not reported in ``batchItemFailures``.

Moto stamps resources with the time of their creation, so the STEP 5 margin
is set to ``MARGIN`` seconds and each test waits that long after creating its
fleet; ledger timestamps are moved an hour back with plain SQL.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from functions.aws import classifier, deleter, lister
from orphan_cleanup.cli.commands import status_rows
from orphan_cleanup.ledger.db import Database
from tests.support.aws_proxy import AwsProxy
from tests.support.sqs_harness import (
    Launched,
    MotoPlatform,
    SqsEventSource,
    context,
    create_queue_with_dlq,
    drain,
    duplicate_messages,
    queue_depth,
    receive_bodies,
)

BACKEND = "aws-prod"
MARGIN = 1
INTERVAL = 1  # scheduled runs are due once per interval
pytestmark = pytest.mark.usefixtures("moto_reset")


class Deployment:
    """The three functions, their queues and the database of one test."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db = db
        self.monkeypatch = monkeypatch
        self.sqs = boto3.client("sqs", region_name="us-east-1")
        self.listing = create_queue_with_dlq(self.sqs, "orphan-cleanup-listing")
        self.deletes = create_queue_with_dlq(self.sqs, "orphan-cleanup-delete")
        for key, value in {
            "LISTING_QUEUE_URL": self.listing.url, "DELETE_QUEUE_URL": self.deletes.url,
            "DATABASE_URL": db.info.url(), "POWERTOOLS_METRICS_NAMESPACE": "OrphanCleanupE2E",
            "POWERTOOLS_SERVICE_NAME": "orphan-cleanup", "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
            "ORPHAN_CLEANUP_INTERVAL_SECONDS": str(INTERVAL),
            "ORPHAN_CLEANUP_MAX_MODE": "delete",  # the stack lets a backend row say delete (SAFETY.md rule 8)
        }.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("ORPHAN_CLEANUP_MODE", raising=False)
        self.classifier = SqsEventSource(self.sqs, self.listing, classifier.handler, "orphan-cleanup-classifier")
        self.deleter = SqsEventSource(self.sqs, self.deletes, deleter.handler, "orphan-cleanup-deleter")

    def add_backend(self, mode: str | None, regions: tuple[str, ...] = ("us-east-1",)) -> None:
        with self.db.connection() as conn:
            conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                     " VALUES (:i, 'aws', '123456789012', CAST(:r AS text[]), '{}', :m)",
                     i=BACKEND, r=list(regions), m=mode)

    def list(self, **event: Any) -> dict[str, Any]:
        """Invoke the lister Lambda as the schedule does (or manually with ``mode``)."""
        return lister.handler({"backend": BACKEND, **event}, context("orphan-cleanup-lister"))

    def drain(self) -> None:
        drain([self.classifier, self.deleter])

    def wait_until_due(self) -> None:
        """Let the schedule's next firing come (``cleanup.next_due_at``, database clock)."""
        [(left,)] = self.query("SELECT EXTRACT(EPOCH FROM next_due_at - clock_timestamp()) FROM cleanup"
                               " WHERE backend_id = :b", b=BACKEND)
        time.sleep(max(0.0, float(left)) + 0.05)

    def cycle(self, **event: Any) -> dict[str, Any]:
        summary = self.list(**event)
        assert summary["ok"], summary
        self.drain()
        return summary

    def query(self, sql: str, **params: Any) -> list[list[Any]]:
        with self.db.connection() as conn:
            return conn.run(sql, **params)

    def cycle_row(self, cycle_id: str) -> dict[str, Any]:
        [row] = self.query("SELECT outcome, listed_at, error, failures FROM cycles WHERE id = :c", c=cycle_id)
        return dict(zip(["outcome", "listed_at", "error", "failures"], row))

    def status(self) -> dict[str, Any]:
        [row] = [r for r in status_rows(self.db, "report") if r["backend"] == BACKEND]
        return row

    def clean_at(self):
        return self.query("SELECT clean_at FROM cleanup WHERE backend_id = :b", b=BACKEND)[0][0]

    def groups(self, cycle_id: str) -> dict[str, tuple[str, str, str]]:
        """primary id (or ref for a primary-less group) -> (verdict, reason, action)."""
        rows = self.query("SELECT provider_ref, primary_id, verdict, reason, action FROM cycle_groups"
                          " WHERE cycle_id = :c", c=cycle_id)
        return {r[1] or r[0]: (r[2], r[3], r[4]) for r in rows}


@pytest.fixture
def stack(db: Database, moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    return Deployment(db, monkeypatch)


@pytest.fixture
def platform(db: Database, moto_reset: str) -> MotoPlatform:
    return MotoPlatform(db, BACKEND)


class Fleet:
    def __init__(self, platform: MotoPlatform) -> None:
        self.tracked = platform.tracked()
        self.leaked = platform.terminated_leak()
        self.placeholder = platform.placeholder_leak()
        self.leftovers = platform.leftover_volumes()
        self.foreign = platform.foreign()
        self.protected = platform.terminated_leak(protect=True)
        platform.age_ledger()
        settle()

    @property
    def orphans(self) -> list[Launched]:
        return [self.leaked, self.placeholder, self.leftovers]


def settle() -> None:
    """Let the fleet's creation times fall behind the margin (moto stamps them
    now, truncated to whole seconds, which only makes them older)."""
    time.sleep(MARGIN + 0.1)


def test_report_mode_reports_each_orphan_once_per_cycle_and_deletes_nothing(stack, platform):
    stack.add_backend(mode="report")
    fleet = Fleet(platform)
    volumes_before = platform.all_volumes()

    first = stack.cycle()
    second = stack.cycle(mode="report")  # a manual invoke: lists again whatever STEP 1 says

    for summary in (first, second):
        assert summary["started"] and summary["batches"] >= 1
        assert stack.cycle_row(summary["cycle_id"])["outcome"] == "clean"
    groups = stack.groups(first["cycle_id"])
    assert groups[fleet.leaked.instance_id] == ("orphan", "owner_terminated", "reported")
    assert groups[fleet.placeholder.instance_id] == ("orphan", "owner_deleted", "reported")
    assert groups[fleet.leftovers.ref] == ("orphan", "owner_deleted", "reported")
    assert groups[fleet.protected.instance_id] == ("protected", "protect_tag", "reported")
    assert fleet.tracked.instance_id not in groups and fleet.foreign.instance_id not in groups
    events = stack.query("SELECT cycle_id, provider_ref, count(*) FROM events WHERE kind = 'orphan_reported'"
                         " GROUP BY cycle_id, provider_ref")
    assert sorted((c, r, n) for c, r, n in events) == sorted(
        (s["cycle_id"], o.ref, 1) for s in (first, second) for o in fleet.orphans)
    reported = stack.query("SELECT provider_ref, times_reported FROM orphans WHERE verdict = 'orphan'")
    assert sorted(map(tuple, reported)) == sorted((o.ref, 2) for o in fleet.orphans)
    for launched in (fleet.tracked, fleet.leaked, fleet.placeholder, fleet.foreign, fleet.protected):
        assert platform.instance_state(launched.instance_id) == "running"
    assert platform.all_volumes() == volumes_before
    assert queue_depth(stack.sqs, stack.deletes.url) == 0 and stack.deleter.invocations == 0
    status = stack.status()
    assert status["last_outcome"] == "clean" and status["open_orphans"] == 3


def test_delete_mode_removes_exactly_the_orphans(stack, platform):
    stack.add_backend(mode="delete")
    fleet = Fleet(platform)
    volumes_before = platform.all_volumes()
    orphan_volumes = {v for o in fleet.orphans for v in o.volume_ids}

    summary = stack.cycle()

    groups = stack.groups(summary["cycle_id"])
    assert groups[fleet.leaked.instance_id] == ("orphan", "owner_terminated", "deleted")
    assert groups[fleet.placeholder.instance_id] == ("orphan", "owner_deleted", "deleted")
    assert groups[fleet.leftovers.ref] == ("orphan", "owner_deleted", "deleted")
    assert groups[fleet.protected.instance_id] == ("protected", "protect_tag", "reported")
    row = stack.cycle_row(summary["cycle_id"])
    assert row["outcome"] == "clean"
    assert stack.clean_at() == row["listed_at"] - timedelta(seconds=MARGIN)
    for launched in (fleet.leaked, fleet.placeholder):
        assert platform.instance_state(launched.instance_id) == "terminated"
    for launched in (fleet.tracked, fleet.foreign, fleet.protected):
        assert platform.instance_state(launched.instance_id) == "running"
    assert len(orphan_volumes) == 6  # root + data volume of two instances, two leftovers
    assert platform.all_volumes() == volumes_before - orphan_volumes
    states = stack.query("SELECT state, count(*) FROM orphans WHERE verdict = 'orphan' GROUP BY state")
    assert states == [["deleted", 3]]
    assert stack.status()["open_orphans"] == 0
    deleted = stack.query("SELECT provider_ref, owner_name FROM events WHERE kind = 'orphan_deleted'")
    assert sorted(map(tuple, deleted)) == sorted(
        (o.ref, name) for o, name in zip(fleet.orphans, ("tracked", "placeholder", "leftovers")))

    # Nothing changed in the ledger since: the next scheduled run does not even list.
    stack.wait_until_due()
    assert stack.list() == {"ok": True, "backend": BACKEND, "started": False, "reason": "no_activity"}


def test_poisoned_messages_land_in_the_dlq_and_the_rest_of_their_batch_succeeds(stack, platform):
    stack.add_backend(mode="report")
    fleet = Fleet(platform)
    poison = ["this is not json", json.dumps({"v": 1, "cycle_id": "x", "groups": "not a list"})]
    poison_ids = sorted(stack.sqs.send_message(QueueUrl=stack.listing.url, MessageBody=b)["MessageId"] for b in poison)

    summary = stack.list()
    polls = stack.classifier.drain()

    # One delivery carried the poison and the cycle's batch: only the poison failed.
    assert (polls[0].received, polls[0].deleted, polls[0].failed) == (3, 1, poison_ids)
    # Redelivered alone, the poison fails whole invocations until the redrive policy
    # (maxReceiveCount=2) moves it to the dead-letter queue.
    assert [p.failed for p in polls[1:]] == [poison_ids]
    assert sorted(receive_bodies(stack.sqs, stack.listing.dlq_url)) == sorted(poison)
    assert queue_depth(stack.sqs, stack.listing.url) == 0
    assert stack.cycle_row(summary["cycle_id"])["outcome"] == "clean"
    assert stack.groups(summary["cycle_id"])[fleet.leaked.instance_id] == ("orphan", "owner_terminated", "reported")


def test_duplicated_deliveries_change_nothing(stack, platform, moto_reset):
    stack.add_backend(mode="delete")
    fleet = Fleet(platform)

    summary = stack.list()
    batches = duplicate_messages(stack.sqs, stack.listing.url)
    stack.classifier.drain()
    requests = duplicate_messages(stack.sqs, stack.deletes.url)
    stack.drain()

    cycle_id = summary["cycle_id"]
    # each delete request twice: the duplicated last batch re-published the still-queued ones (SAFETY.md rule 20)
    assert len(batches) == summary["batches"] and len(set(requests)) == len(fleet.orphans) == len(requests) / 2
    assert stack.cycle_row(cycle_id)["outcome"] == "clean"
    counts = dict(stack.query("SELECT kind, count(*) FROM events WHERE cycle_id = :c GROUP BY kind", c=cycle_id))
    assert counts == {"orphan_deleted": 3, "protected_reported": 1}
    assert stack.query("SELECT count(*) FROM cycle_batches WHERE cycle_id = :c", c=cycle_id)[0][0] == len(batches)
    attempts = stack.query("SELECT attempts FROM delete_requests WHERE cycle_id = :c", c=cycle_id)
    assert sorted(a for (a,) in attempts) == [1, 1, 1]
    assert platform.instance_state(fleet.tracked.instance_id) == "running"

    # A late third copy of everything, after the cycle is over: no change, no EC2 call.
    tables = "events, orphans, cycle_groups, cycle_batches, delete_requests, cycles"
    before = {t: stack.query(f"SELECT count(*) FROM {t}")[0][0] for t in tables.split(", ")}
    with AwsProxy(moto_reset) as counter:
        stack.monkeypatch.setenv("AWS_ENDPOINT_URL", counter.url)
        for url, bodies in ((stack.listing.url, batches), (stack.deletes.url, requests)):
            for body in bodies:
                stack.sqs.send_message(QueueUrl=url, MessageBody=body)
        stack.drain()
    assert counter.service_counts()["ec2"] == 0
    assert {t: stack.query(f"SELECT count(*) FROM {t}")[0][0] for t in before} == before
    assert stack.classifier.errors == [] and stack.deleter.errors == []


def test_owner_change_inside_the_margin_leaves_the_cycle_unsettled(stack, platform):
    stack.add_backend(mode="delete")
    tracked = platform.tracked()
    platform.age_ledger()
    settle()
    first = stack.cycle()
    assert stack.cycle_row(first["cycle_id"])["outcome"] == "clean"
    clean_at = stack.clean_at()
    stack.wait_until_due()

    platform.ledger.mark_terminated(tracked.owner_id)  # just now: inside the margin
    second = stack.cycle()

    assert second["reason"] == "activity"
    assert stack.groups(second["cycle_id"])[tracked.instance_id] == ("skipped", "recent_owner_change", "none")
    assert stack.cycle_row(second["cycle_id"])["outcome"] == "unsettled"
    assert stack.clean_at() == clean_at
    assert platform.instance_state(tracked.instance_id) == "running"
    assert stack.status()["last_outcome"] == "unsettled"


def test_a_failing_region_leaves_the_cycle_unsettled_and_the_others_are_processed(stack, platform):
    # moto serves no EC2 in "xx-nowhere-1" and answers 500: the region fails, us-east-1 goes on.
    stack.add_backend(mode="report", regions=("us-east-1", "xx-nowhere-1"))
    leaked = platform.terminated_leak()
    platform.age_ledger()
    settle()

    summary = stack.cycle()

    row = stack.cycle_row(summary["cycle_id"])
    assert row["outcome"] == "unsettled"
    failures = row["failures"] if isinstance(row["failures"], list) else json.loads(row["failures"])
    assert [f["region"] for f in failures] == ["xx-nowhere-1"]
    assert stack.groups(summary["cycle_id"])[leaked.instance_id] == ("orphan", "owner_terminated", "reported")
    assert stack.clean_at() is None


def test_an_asg_member_orphan_is_protected_every_cycle_and_never_terminated(stack, platform, moto_reset):
    # Given: a terminated owner whose instance a real Auto Scaling group launched (and would replace)
    stack.add_backend(mode="delete")
    asg = platform.asg_leak("web-asg")
    leaked = platform.terminated_leak()
    platform.age_ledger()
    settle()

    with AwsProxy(moto_reset) as counter:
        stack.monkeypatch.setenv("AWS_ENDPOINT_URL", counter.url)
        first = stack.cycle()
        stack.wait_until_due()
        second = stack.cycle(mode="delete")

    # Then: the ASG member is protected (reported, its controller in detail), the other orphan deleted
    for summary in (first, second):
        assert stack.groups(summary["cycle_id"])[asg.instance_id] == ("protected", "managed_by_controller",
                                                                      "reported")
        [(detail,)] = stack.query("SELECT evidence->>'d' FROM cycle_groups WHERE cycle_id = :c AND primary_id = :p",
                                  c=summary["cycle_id"], p=asg.instance_id)
        assert detail == f"{asg.instance_id} is managed by asg:web-asg"
    assert stack.groups(first["cycle_id"])[leaked.instance_id] == ("orphan", "owner_terminated", "deleted")
    assert stack.cycle_row(first["cycle_id"])["outcome"] == "clean"
    assert platform.instance_state(asg.instance_id) == "running"
    assert counter.action_counts()["TerminateInstances"] == 1  # the other orphan's, never the ASG member's
    asked = stack.query("SELECT count(*) FROM delete_requests WHERE group_key LIKE :k", k=f"%/{asg.instance_id}")
    assert asked[0][0] == 0


def test_a_termination_protected_orphan_is_protected_not_failed_and_not_tried_again(stack, platform, moto_reset):
    # Given: an orphan with DisableApiTermination, which no describe shows
    stack.add_backend(mode="delete")
    stuck = platform.terminated_leak(termination_protection=True)
    platform.age_ledger()
    settle()

    with AwsProxy(moto_reset) as counter:
        stack.monkeypatch.setenv("AWS_ENDPOINT_URL", counter.url)
        first = stack.cycle()
        first_terminates = counter.action_counts()["TerminateInstances"]
        first_reads = counter.action_counts()["DescribeInstanceAttribute"]
        stack.wait_until_due()
        second = stack.cycle(mode="delete")

    # Then: the delete's re-read finds the protection: a verdict, the cycle is not failed
    row = stack.cycle_row(first["cycle_id"])
    assert row["outcome"] == "clean" and row["error"] is None
    assert stack.groups(first["cycle_id"])[stuck.instance_id] == ("protected", "termination_protection", "reported")
    assert first_reads == 1 and first_terminates == 0
    status = stack.status()
    assert status["last_outcome"] == "clean" and status["open_orphans"] == 0
    assert stack.query("SELECT retry_delay_seconds FROM cleanup")[0][0] == 0  # no backoff
    # and the next delete cycle hands the remembered protection to the deleter's re-read (SAFETY.md
    # rule 14), read-only: one more attribute read finds it again; no terminate, still protected
    assert stack.groups(second["cycle_id"])[stuck.instance_id] == ("protected", "termination_protection", "reported")
    assert stack.query("SELECT count(*) FROM delete_requests WHERE cycle_id = :c", c=second["cycle_id"])[0][0] == 1
    actions = counter.action_counts()
    assert actions["TerminateInstances"] == 0 and actions["DescribeInstanceAttribute"] == 2
    assert stack.cycle_row(second["cycle_id"])["outcome"] == "clean"
    assert platform.instance_state(stuck.instance_id) == "running"


def test_a_lost_listing_queue_fails_the_cycle(stack, platform):
    stack.add_backend(mode="report")
    platform.terminated_leak()
    platform.age_ledger()
    stack.sqs.delete_queue(QueueUrl=stack.listing.url)

    with pytest.raises(ClientError) as err:  # the invocation fails (and the schedule retries it)
        stack.list()

    assert err.value.response["Error"]["Code"] in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
    [(outcome, error)] = stack.query("SELECT outcome, error FROM cycles")
    assert outcome == "failed" and error.startswith("listing failed")
    status = stack.status()
    assert status["last_outcome"] == "failed" and status["clean_at"] is None


def test_a_scheduled_run_without_ledger_activity_makes_no_aws_call(stack, platform, moto_reset):
    stack.add_backend(mode="report")
    platform.terminated_leak()
    platform.age_ledger()
    settle()
    first = stack.cycle()
    assert stack.cycle_row(first["cycle_id"])["outcome"] == "clean"
    cycles_before = stack.query("SELECT count(*) FROM cycles")[0][0]
    stack.wait_until_due()

    with AwsProxy(moto_reset) as counter:
        stack.monkeypatch.setenv("AWS_ENDPOINT_URL", counter.url)
        quiet = stack.list()
        assert dict(counter.service_counts()) == {}
        platform.ledger.issue_ref(owner_name="new")  # activity: the next run must list
        stack.wait_until_due()
        busy = stack.list()
        ec2_calls = counter.service_counts()["ec2"]

    assert quiet == {"ok": True, "backend": BACKEND, "started": False, "reason": "no_activity"}
    assert stack.query("SELECT count(*) FROM cycles")[0][0] == cycles_before + 1
    assert busy["started"] and busy["reason"] == "activity" and ec2_calls > 0


# -- scale: a 1,000-resource account through the SQS pipeline --------------------------------


@pytest.fixture
def moto_process(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A moto server in its own process, so this process's peak memory is the pipeline's."""
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_scale_1000_resources_through_the_sqs_pipeline(db, moto_process, monkeypatch):
    """500 instances + 500 volumes: 400 tracked instances with a data volume each,
    100 leaked instances (owner terminated), 100 leftover volumes (owner gone).
    Delete mode; prints end-to-end time and peak RSS of this process."""
    import resource

    stack = Deployment(db, monkeypatch)
    monkeypatch.setenv("ORPHAN_CLEANUP_MAX_DELETES", "500")
    stack.add_backend(mode="delete")
    platform = MotoPlatform(db, BACKEND)
    ec2 = platform.ec2

    def instance(ref: str) -> tuple[str, str]:
        inst = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "provider_ref", "Value": ref}]}])["Instances"][0]
        return inst["InstanceId"], inst["Placement"]["AvailabilityZone"]

    from orphan_cleanup.core.owners import OwnerStatus

    tracked, leaked, leftover_refs = [], [], []
    for i in range(500):
        issued = platform.ledger.issue_ref(owner_name=f"vm-{i}")
        iid, az = instance(issued.provider_ref)
        platform.ledger.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=iid,
                                          region="us-east-1", status=OwnerStatus.BUSY)
        if i < 400:
            vol = platform.volume(issued.provider_ref, az=az)
            ec2.attach_volume(VolumeId=vol, InstanceId=iid, Device="/dev/sdf")
            tracked.append(iid)
        else:
            platform.ledger.mark_terminated(issued.owner_id)
            leaked.append(iid)
    for i in range(100):
        issued = platform.ledger.issue_ref(owner_name=f"leftover-{i}")
        platform.volume(issued.provider_ref)
        platform.ledger.hard_delete(issued.owner_id)
        leftover_refs.append(issued.provider_ref)
    platform.age_ledger()
    settle()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    started = time.perf_counter()
    summary = stack.list()
    listed = time.perf_counter()
    stack.classifier.drain()
    classified = time.perf_counter()
    stack.drain()
    elapsed = time.perf_counter() - started

    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    row = stack.cycle_row(summary["cycle_id"])
    counts = dict(stack.query("SELECT action, count(*) FROM cycle_groups WHERE cycle_id = :c GROUP BY action",
                            c=summary["cycle_id"]))
    print(f"\nSCALE 1000 resources (500 instances, 500 volumes), 600 groups, 200 orphan groups: "
          f"end-to-end {elapsed:.1f}s (lister {listed - started:.1f}s, classifier {classified - listed:.1f}s, "
          f"deleter {started + elapsed - classified:.1f}s), batches {summary['batches']}, classifier invocations "
          f"{stack.classifier.invocations}, deleter invocations {stack.deleter.invocations}, "
          f"peak RSS {rss_peak / 1024:.0f} MiB (before the cycle {rss_before / 1024:.0f} MiB), "
          f"outcome {row['outcome']}, actions {counts}")
    assert row["outcome"] == "clean"
    assert counts == {"deleted": 200}
    assert all(platform.instance_state(i) == "terminated" for i in leaked[:10])
    assert all(platform.instance_state(i) == "running" for i in tracked[:10])
    assert all(platform.volumes_of(ref) == () for ref in leftover_refs[:10])
