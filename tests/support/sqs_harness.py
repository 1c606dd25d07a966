"""Drive the real Lambda handlers through real SQS queues on the moto server.

What AWS does between a queue and a function, done here in the test process:

- ``create_queue_with_dlq`` makes a queue whose ``RedrivePolicy`` sends a
  message to its dead-letter queue after ``maxReceiveCount`` receives;
- ``SqsEventSource.poll`` is one turn of Lambda's SQS poller: it receives up to
  ten messages (which hides them for the visibility timeout and counts a
  receive), builds the SQS event exactly as Lambda delivers it, invokes the
  handler with a Lambda-like context, and deletes only the records the handler
  did not report in ``batchItemFailures`` (an invocation that raises fails
  them all). Failed records are made visible again at once, instead of after
  the visibility timeout, so retries and the redrive to the DLQ are fast;
- ``drain`` runs the classifier and deleter sources until both queues are empty.

Tests that assert how many calls reached the provider put ``tests.support.aws_proxy``
in front of moto.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"
LAMBDA_ATTRIBUTES = ("ApproximateReceiveCount", "SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp")
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class LambdaContext:
    """The fields of the Lambda context object that Powertools reads."""

    function_name: str
    memory_limit_in_mb: int = 256
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = "/aws/lambda/test"
    log_stream_name: str = "test"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def context(function_name: str) -> LambdaContext:
    """A fresh context per invocation (a new request id, as Lambda gives)."""
    return LambdaContext(function_name=function_name)


@dataclass(frozen=True)
class QueueRef:
    url: str
    arn: str
    dlq_url: str
    dlq_arn: str


def queue_arn(sqs: Any, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def create_queue_with_dlq(sqs: Any, name: str, *, max_receive_count: int = 2,
                          visibility_timeout: int = 30) -> QueueRef:
    """A queue and its dead-letter queue, wired with a real ``RedrivePolicy``."""
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = queue_arn(sqs, dlq_url)
    url = sqs.create_queue(QueueName=name, Attributes={
        "VisibilityTimeout": str(visibility_timeout),
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}),
    })["QueueUrl"]
    return QueueRef(url=url, arn=queue_arn(sqs, url), dlq_url=dlq_url, dlq_arn=dlq_arn)


def queue_depth(sqs: Any, url: str) -> int:
    """Messages in the queue, visible or in flight."""
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def receive_all(sqs: Any, url: str, *, visibility_timeout: int = 30) -> list[dict[str, Any]]:
    """Receive every visible message, hiding each for ``visibility_timeout``."""
    seen: dict[str, dict[str, Any]] = {}
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                  VisibilityTimeout=visibility_timeout).get("Messages", [])
        if not got:
            return list(seen.values())
        seen.update((m["MessageId"], m) for m in got)


def receive_bodies(sqs: Any, url: str) -> list[str]:
    """The bodies of every visible message (for inspecting a dead-letter queue)."""
    return [m["Body"] for m in receive_all(sqs, url)]


def duplicate_messages(sqs: Any, url: str, copies: int = 2) -> list[str]:
    """Replace each waiting message by ``copies`` identical ones (at-least-once
    delivery at its worst). Returns the bodies that were duplicated."""
    originals = receive_all(sqs, url)
    for m in originals:
        for _ in range(copies):
            sqs.send_message(QueueUrl=url, MessageBody=m["Body"])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return [m["Body"] for m in originals]


def sqs_record(message: dict[str, Any], source_arn: str) -> dict[str, Any]:
    """One record of an SQS event, as Lambda builds it from a received message."""
    attrs = message.get("Attributes", {})
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": {k: attrs[k] for k in LAMBDA_ATTRIBUTES},
        "messageAttributes": {},
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": source_arn,
        "awsRegion": REGION,
    }


@dataclass
class PollResult:
    received: int = 0
    deleted: int = 0
    failed: list[str] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class SqsEventSource:
    """An SQS event source mapping: one queue feeding one handler."""

    sqs: Any
    queue: QueueRef
    handler: Handler
    function_name: str
    batch_size: int = 10
    fast_retry: bool = True
    invocations: int = 0
    errors: list[BaseException] = field(default_factory=list)

    def poll(self) -> PollResult:
        """One receive/invoke/delete turn; returns what happened."""
        messages = self.sqs.receive_message(
            QueueUrl=self.queue.url, MaxNumberOfMessages=self.batch_size, WaitTimeSeconds=0,
            MessageSystemAttributeNames=["All"]).get("Messages", [])
        result = PollResult(received=len(messages))
        if not messages:
            return result
        event = {"Records": [sqs_record(m, self.queue.arn) for m in messages]}
        self.invocations += 1
        try:
            response = self.handler(event, context(self.function_name))
            failed = {f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])}
        except Exception as exc:  # the whole invocation failed: every record returns to the queue
            self.errors.append(exc)
            result.error = exc
            failed = {m["MessageId"] for m in messages}
        done = [m for m in messages if m["MessageId"] not in failed]
        for chunk in _chunks(done, 10):
            self.sqs.delete_message_batch(QueueUrl=self.queue.url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)])
        retry = [m for m in messages if m["MessageId"] in failed]
        if self.fast_retry:
            for chunk in _chunks(retry, 10):
                self.sqs.change_message_visibility_batch(QueueUrl=self.queue.url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                    for i, m in enumerate(chunk)])
        result.deleted = len(done)
        result.failed = sorted(failed)
        return result

    def drain(self, max_polls: int = 1000) -> list[PollResult]:
        """Poll until a receive returns nothing."""
        results = []
        for _ in range(max_polls):
            r = self.poll()
            if not r.received:
                return results
            results.append(r)
        raise AssertionError(f"{self.function_name}: queue not drained after {max_polls} polls")


def drain(sources: Iterable[SqsEventSource], max_rounds: int = 200) -> int:
    """Poll every source in turn until a whole round receives nothing.
    Returns the number of rounds that received something."""
    sources = list(sources)
    for rounds in range(max_rounds):
        if sum(len(s.drain()) for s in sources) == 0:
            return rounds
    raise AssertionError(f"queues not drained after {max_rounds} rounds")


def _chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


# -- a platform that provisions on moto the way the ledger protocol says ---------------------

AMI = "ami-12c6146b"


@dataclass(frozen=True)
class Launched:
    ref: str
    owner_id: str | None
    instance_id: str | None
    volume_ids: tuple[str, ...]  # every volume carrying the ref (the root volume included)


class MotoPlatform:
    """Creates EC2 resources on the moto server with the ledger protocol of
    ``orphan_cleanup.ledger.client``: issue the ref first, tag every resource
    with it, record the provisioning data. Leak scenarios are the real ones:
    termination that gave up, a hard-deleted placeholder, detached leftovers."""

    def __init__(self, db: Any, backend_id: str = "aws-prod", region: str = REGION) -> None:
        import boto3

        from orphan_cleanup.ledger.client import LedgerClient

        self.db = db
        self.backend_id = backend_id
        self.region = region
        self.ledger = LedgerClient(db)
        self.ec2 = boto3.client("ec2", region_name=region)

    def launch(self, ref: str, *, protect: bool = False, data_volume: bool = True,
               termination_protection: bool = False) -> tuple[str, tuple[str, ...]]:
        """One instance (its root volume tagged too) and, optionally, an attached data volume."""
        from orphan_cleanup.ledger.client import aws_tag_specifications

        specs = aws_tag_specifications(ref)
        if protect:
            for spec in specs:
                spec["Tags"].append({"Key": "orphan-cleanup-protect", "Value": "yes"})
        inst = self.ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, TagSpecifications=specs)["Instances"][0]
        iid = inst["InstanceId"]
        if termination_protection:  # moto ignores DisableApiTermination on run_instances
            self.ec2.modify_instance_attribute(InstanceId=iid, DisableApiTermination={"Value": True})
        if data_volume:
            vol = self.volume(ref, az=inst["Placement"]["AvailabilityZone"])
            self.ec2.attach_volume(VolumeId=vol, InstanceId=iid, Device="/dev/sdf")
        return iid, self.volumes_of(ref)

    def volume(self, ref: str, *, az: str | None = None) -> str:
        return self.ec2.create_volume(
            AvailabilityZone=az or f"{self.region}a", Size=1,
            TagSpecifications=[{"ResourceType": "volume", "Tags": [{"Key": "provider_ref", "Value": ref}]}],
        )["VolumeId"]

    def volumes_of(self, ref: str) -> tuple[str, ...]:
        vols = self.ec2.describe_volumes(Filters=[{"Name": "tag:provider_ref", "Values": [ref]}])["Volumes"]
        return tuple(sorted(v["VolumeId"] for v in vols))

    def tracked(self, **kw: Any) -> Launched:
        issued = self.ledger.issue_ref(owner_name="tracked")
        iid, vols = self.launch(issued.provider_ref, **kw)
        from orphan_cleanup.core.owners import OwnerStatus

        self.ledger.mark_provisioning(issued.owner_id, backend_id=self.backend_id, primary_id=iid,
                                      region=self.region, status=OwnerStatus.BUSY)
        return Launched(issued.provider_ref, issued.owner_id, iid, vols)

    def terminated_leak(self, **kw: Any) -> Launched:
        """Termination gave up: the owner is terminated, the instance still runs."""
        launched = self.tracked(**kw)
        self.ledger.mark_terminated(launched.owner_id)
        return launched

    def asg_leak(self, name: str = "web-asg") -> Launched:
        """An orphan candidate an Auto Scaling group would replace: the ref's owner is
        terminated, but its instance was launched by a real ASG (moto's autoscaling API,
        from a launch template tagging the ref), which tags it ``aws:autoscaling:groupName``."""
        issued = self.ledger.issue_ref(owner_name=name)
        self.ec2.create_launch_template(LaunchTemplateName=f"{name}-lt", LaunchTemplateData={
            "ImageId": AMI, "InstanceType": "t3.micro",
            "TagSpecifications": [{"ResourceType": "instance",
                                   "Tags": [{"Key": "provider_ref", "Value": issued.provider_ref}]}]})
        import boto3

        boto3.client("autoscaling", region_name=self.region).create_auto_scaling_group(
            AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": f"{name}-lt"}, MinSize=1, MaxSize=1,
            DesiredCapacity=1, AvailabilityZones=[f"{self.region}a"])
        [iid] = [i["InstanceId"] for r in self.ec2.describe_instances(
            Filters=[{"Name": "tag:provider_ref", "Values": [issued.provider_ref]}])["Reservations"]
            for i in r["Instances"]]
        from orphan_cleanup.core.owners import OwnerStatus

        self.ledger.mark_provisioning(issued.owner_id, backend_id=self.backend_id, primary_id=iid,
                                      region=self.region, status=OwnerStatus.BUSY)
        self.ledger.mark_terminated(issued.owner_id)
        return Launched(issued.provider_ref, issued.owner_id, iid, self.volumes_of(issued.provider_ref))

    def placeholder_leak(self) -> Launched:
        """The provider call created an instance, then the failed placeholder row was hard-deleted."""
        issued = self.ledger.issue_ref(owner_name="placeholder")
        iid, vols = self.launch(issued.provider_ref)
        self.ledger.hard_delete(issued.owner_id)
        return Launched(issued.provider_ref, issued.owner_id, iid, vols)

    def leftover_volumes(self, n: int = 2) -> Launched:
        """Volumes of an owner that is gone, with no instance left."""
        issued = self.ledger.issue_ref(owner_name="leftovers")
        for _ in range(n):
            self.volume(issued.provider_ref)
        self.ledger.hard_delete(issued.owner_id)
        return Launched(issued.provider_ref, issued.owner_id, None, self.volumes_of(issued.provider_ref))

    def foreign(self, ref: str = "zzzzforeign1") -> Launched:
        """Another platform's instance: a valid-looking ref this ledger never issued."""
        iid, vols = self.launch(ref)
        return Launched(ref, None, iid, vols)

    def age_ledger(self, seconds: int = 3600) -> None:
        """Move every ledger timestamp into the past (plain SQL), outside the STEP 5 margin."""
        delta = f"{seconds} seconds"
        with self.db.transaction() as conn:
            conn.run("UPDATE instances SET created_at = created_at - CAST(:d AS interval),"
                     " provisioned_at = provisioned_at - CAST(:d AS interval),"
                     " terminated_at = terminated_at - CAST(:d AS interval),"
                     " deleted_at = deleted_at - CAST(:d AS interval)", d=delta)
            conn.run("UPDATE provider_refs SET issued_at = issued_at - CAST(:d AS interval)", d=delta)

    def instance_state(self, instance_id: str) -> str:
        reply = self.ec2.describe_instances(InstanceIds=[instance_id])
        return reply["Reservations"][0]["Instances"][0]["State"]["Name"]

    def all_volumes(self) -> set[str]:
        return {v["VolumeId"] for v in self.ec2.describe_volumes()["Volumes"]}


def lambda_record(body: str, source: str = f"arn:aws:sqs:{REGION}:{ACCOUNT}:q") -> dict[str, Any]:
    """One SQS record carrying ``body`` as Lambda delivers it (valid per Powertools'
    ``SqsRecordModel``), for a handler invoked directly rather than through a queue."""
    mid = str(uuid.uuid4())
    return {"messageId": mid, "receiptHandle": f"rh-{mid}", "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000",
                           "SenderId": "AIDAEXAMPLE", "ApproximateFirstReceiveTimestamp": "1700000000000"},
            "messageAttributes": {}, "md5OfBody": "0" * 32, "eventSource": "aws:sqs",
            "eventSourceARN": source, "awsRegion": REGION}


class DeployedQueues:
    """The deployed functions' environment for handler tests: a listing, a delete and
    a jobs queue on moto, the test database, and the environment the Lambdas read
    (margin 0, no global mode), set through ``monkeypatch``."""

    def __init__(self, db: Any, monkeypatch: Any, name: str) -> None:
        import boto3

        self.db = db
        self.sqs = boto3.client("sqs", region_name="us-east-1")
        self.listing = self.sqs.create_queue(QueueName=f"{name}-listing")["QueueUrl"]
        self.deletes = self.sqs.create_queue(QueueName=f"{name}-delete")["QueueUrl"]
        self.jobs = self.sqs.create_queue(QueueName=f"{name}-jobs")["QueueUrl"]
        for key, value in {"LISTING_QUEUE_URL": self.listing, "DELETE_QUEUE_URL": self.deletes,
                           "JOBS_QUEUE_URL": self.jobs,
                           "DATABASE_URL": db.info.url(), "POWERTOOLS_METRICS_NAMESPACE": f"OrphanCleanup-{name}",
                           "POWERTOOLS_SERVICE_NAME": "orphan-cleanup", "ORPHAN_CLEANUP_MARGIN_SECONDS": "0",
                           # the stack lets a backend row say delete (SAFETY.md rule 8)
                           "ORPHAN_CLEANUP_MAX_MODE": "delete"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("ORPHAN_CLEANUP_MODE", raising=False)

    def receive(self, url: str) -> list[str]:
        """Every visible message's body, each deleted from the queue."""
        bodies = []
        while msgs := self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                               WaitTimeSeconds=0).get("Messages", []):
            bodies += [m["Body"] for m in msgs]
            self.sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)])
        return bodies
