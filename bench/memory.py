"""Lambda memory and time per batch at the deployed memory size.

Every figure is one invocation in a fresh child process (``python -m bench.memory
--child ...``), so its peak resident set (``VmHWM``, ``common.peak_rss_mb``) belongs
to that invocation alone, next to the function's ``MemorySize`` (template.yaml's
Globals, read from the file):

- import baseline: the child imports the handler module (``functions.aws.classifier``
  or ``functions.aws.deleter``) and does nothing else: the cold-start floor;
- classifier: the real handler on a real SQS event (the record shape Powertools'
  ``SqsRecordModel`` parses, one record per message), wired as deployed
  (``entrypoints.aws.pipeline()``: settings from the environment, the database of
  ``DATABASE_URL``, SQS clients, the reporter, Sentry's integration when installed),
  with the database URL pointing at the bench's Postgres. The message is a
  ``ListingBatch`` of a report-mode cycle started for it, filled with groups (refs of a
  generated ledger: live owners, leaks, pending owners, leftovers, foreign refs:
  ``ledger_data``) up to the SQS body limit of 256 KiB; then the largest batch the
  lister actually cuts (``Queue.max_message_bytes - 4096``, as ``lister._Batcher``
  sizes it), then one invocation of the template's ``BatchSize`` such messages;
- deleter: the real handler on a real SQS event holding one ``DeleteRequest``, wired
  as deployed except the provider adapter (``bootstrap.provider_factory``), which is
  the ``MemoryProvider`` over ``tests/support/memory_cloud.py``. The request is the
  one a delete-mode cycle dispatched for a leaked group (mark-then-sweep with
  ``ORPHAN_CLEANUP_CONFIRM_SECONDS=0``) holding one resource of every kind both the
  memory cloud and an AWS listing have; the cloud's resources are handed to the child
  (pickled), and the outcome is reported, so a refused request cannot pass as measured.

The invocation is the first of its process (a cold start): its time includes building
the pipeline and opening the database connection; the child reads and decodes the
event before the clock starts, as Lambda's runtime does before calling the handler.
Each child runs ``REPS`` times (1 with ``quick``): the table shows the largest peak and
the median time.

    python -m bench.memory [--quick]     # prints the table (~35 s; --quick ~10 s)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the child imports nothing but the handler it measures: bench.common is the parent's
    from bench.common import PgServer, Table

ROOT = Path(__file__).resolve().parent.parent
SQS_BODY_LIMIT = 256 * 1024  # bytes SQS accepts in one message (body and attributes)
LEDGER_REFS = 100_000
REPS = 3
HANDLERS = {"classifier": "functions.aws.classifier", "deleter": "functions.aws.deleter"}
DELETE_BACKEND = "mem"
DELETE_REGION = "r1"
DELETE_SETTINGS = {"ORPHAN_CLEANUP_CONFIRM_SECONDS": "0", "ORPHAN_CLEANUP_MODE": "delete"}
COLUMNS = ["invocation", "handler", "records", "groups", "message bytes", "outcome", "peak MiB", "over import MiB",
           "x import", "ms", "memory MiB", "headroom x", "fits 2x"]


# ---- the deployed figures ---------------------------------------------------------------------


def template_figures() -> tuple[int, int]:
    """(MemorySize of template.yaml's Globals, the classifier's SQS BatchSize)."""
    text = (ROOT / "template.yaml").read_text()
    globals_ = text[text.index("\nGlobals:"):]
    memory = int(re.search(r"^\s+MemorySize:\s*(\d+)", globals_, re.M).group(1))  # type: ignore[union-attr]
    classifier = text[text.index("Handler: functions.aws.classifier.handler"):]
    batch = int(re.search(r"BatchSize:\s*(\d+)", classifier).group(1))  # type: ignore[union-attr]
    return memory, batch


# ---- the parent: ledger, messages, children -------------------------------------------------------


def run(server: PgServer, quick: bool = False) -> list[Table]:
    from bench.common import Table

    memory_mb, batch_size = template_figures()
    reps = 1 if quick else REPS
    table = Table(f"Lambda memory and time per invocation at the deployed MemorySize ({memory_mb} MiB)", COLUMNS)
    with tempfile.TemporaryDirectory(prefix="oc-bench-memory-") as tmp:
        work = Path(tmp)
        floor = _measure(work, reps, partial(_fixed, {"kind": "interpreter"}))
        baselines = {name: _measure(work, reps, partial(_fixed, {"kind": "import", "module": module}))
                     for name, module in HANDLERS.items()}
        _row(table, "interpreter and the bench's child harness (stdlib)", "-", floor, None, memory_mb)
        for name in HANDLERS:
            _row(table, "import baseline: handler module imported, nothing run", name, baselines[name], None,
                 memory_mb)
        classifier = _Classifier(server, work)
        try:
            lister_cut = classifier.lister_limit()
            verdicts: dict[str, int] = {}
            for title, records, cut in (
                    ("one listing message at the SQS limit (256 KiB)", 1, ("message", SQS_BODY_LIMIT)),
                    ("one listing message at the lister's cut", 1, ("lister", lister_cut)),
                    (f"a full SQS batch (template BatchSize {batch_size}) of messages at the SQS limit", batch_size,
                     ("message", SQS_BODY_LIMIT))):
                got = _measure(work, reps, partial(classifier.child, records, cut))
                verdicts = verdicts or got[0]["verdicts"]
                _row(table, title, "classifier", got, baselines["classifier"], memory_mb)
        finally:
            classifier.close()
        deleter = _Deleter(server, work)
        try:
            got = _measure(work, reps, deleter.child)
            clients = _measure(work, reps, partial(deleter.child, aws_clients=True))
        finally:
            deleter.close()
        kinds = ", ".join(k.value for k in deleter.kinds)
        _row(table, f"one delete request: a group of {len(deleter.kinds)} kinds", "deleter", got,
             baselines["deleter"], memory_mb)
        _row(table, "the same, then the real AWS adapter's clients built (no call)", "deleter", clients,
             baselines["deleter"], memory_mb)
    table.notes += [
        f"peak = VmHWM of a fresh child process per invocation, largest of {reps}; ms = median wall time of the "
        "handler call (import ms for the baselines); over import = peak - the handler's import baseline (its largest "
        "peak), x import = peak / that baseline.",
        f"headroom = {memory_mb} MiB / peak; fits 2x = peak <= {memory_mb // 2} MiB. Lambda's own runtime client "
        "(awslambdaric) is not in these figures; this machine is not the deployed arm64.",
        "classifier: the real handler and wiring (entrypoints.aws.pipeline(): settings from the environment, "
        "DATABASE_URL at the bench's Postgres, boto3 SQS clients made, nothing sent) on an SQS event built as "
        "Lambda delivers it; each message a report-mode ListingBatch of a cycle started for it (applied, not the "
        f"cycle's last batch), groups drawn from a {LEDGER_REFS:,}-ref ledger in the mix of bench.ledger_data "
        f"(verdicts of the first message: {', '.join(f'{k} {n}' for k, n in sorted(verdicts.items()))}).",
        f"message bytes = the JSON body (the largest of the invocation's records; groups: in all of them); "
        f"SQS's limit is "
        f"{SQS_BODY_LIMIT:,} bytes; the lister cuts at max_message_bytes - 4096 of group JSON = {lister_cut:,} "
        "bytes (queues.base.MAX_MESSAGE_BYTES is 200 KiB), so a lister's message is never at the SQS limit.",
        f"deleter: the real handler and wiring with the provider adapter replaced by MemoryProvider "
        f"(tests/support/memory_cloud.py): no EC2/ELB client is built or called. The group: {kinds}: every "
        "ResourceKind that both an AWS listing and the memory cloud have (launch templates, key pairs, placement "
        "groups, load balancers and target groups: no memory-cloud kind; disk, forwarding rule, image: GCP's).",
        "the deleter's child also imports tests/support/memory_cloud.py, its stand-in adapter (in its peak).",
        "the real AWS adapter's clients: after the handler returned, the deployed provider_factory builds the "
        "backend's adapter and the four boto3 clients a delete makes in the group's region (sts for the identity "
        "check, ec2, elbv2, autoscaling), none called: the model loading the memory cloud skips (ms: the handler's).",
        "every invocation is a cold start: the time includes building the pipeline and the first connection.",
    ]
    return [table]


def _measure(work: Path, reps: int, spec_for: Callable[[], tuple[dict[str, Any], dict[str, str]]]
             ) -> list[dict[str, Any]]:
    """``reps`` fresh children, each given the spec and environment ``spec_for()`` makes anew."""
    return [_child(work, *spec_for()) for _ in range(reps)]


def _fixed(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    return spec, {}


def _row(table: Table, title: str, handler: str, runs: list[dict[str, Any]], baseline: list[dict[str, Any]] | None,
         memory_mb: int) -> None:
    from bench.common import median

    peak = max(r["peak_mb"] for r in runs)
    times = [r["ms"] for r in runs if r.get("ms") is not None]
    outcomes = sorted({r.get("outcome", "-") for r in runs})
    floor = max(r["peak_mb"] for r in baseline) if baseline else None
    table.add(**{"invocation": title, "handler": handler, "records": runs[0].get("records"),
                 "groups": runs[0].get("groups"),
                 "message bytes": runs[0].get("message_bytes"), "outcome": ",".join(outcomes), "peak MiB": peak,
                 "over import MiB": peak - floor if floor else None, "x import": peak / floor if floor else None,
                 "ms": median(times) if times else None, "memory MiB": memory_mb, "headroom x": memory_mb / peak,
                 "fits 2x": "yes" if peak <= memory_mb / 2 else "no"})


def _child(work: Path, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Run one child (``--child SPEC``) with only ``env`` on top of a minimal environment."""
    name = uuid.uuid4().hex[:8]
    spec_path, out_path = work / f"{name}.spec.json", work / f"{name}.out.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out_path)}))
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    path = os.pathsep.join(p for p in (str(ROOT / "shared"), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    child_env = {**base, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", **env}
    proc = subprocess.run([sys.executable, "-m", "bench.memory", "--child", str(spec_path)], cwd=ROOT,
                          env=child_env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"memory bench child {spec['kind']} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def _lambda_env(db_url: str, **extra: str) -> dict[str, str]:
    """What the deployed functions find in their environment, pointing at nothing real:
    dummy credentials (no credential chain, no instance metadata), queue URLs that are
    never called, an endpoint that refuses a call at once."""
    return {"DATABASE_URL": db_url, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "LISTING_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/bench-listing",
            "DELETE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/bench-delete",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(template_figures()[0]), **extra}


def sqs_event(bodies: list[str], queue: str) -> dict[str, Any]:
    """An SQS event as Lambda delivers it (the fields Powertools' ``SqsRecordModel`` requires)."""
    now = str(int(time.time() * 1000))
    arn = f"arn:aws:sqs:us-east-1:123456789012:{queue}"
    return {"Records": [{
        "messageId": str(uuid.uuid4()), "receiptHandle": uuid.uuid4().hex, "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": now, "SenderId": "AIDAEXAMPLE",
                       "ApproximateFirstReceiveTimestamp": now},
        "messageAttributes": {}, "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": "us-east-1"} for body in bodies]}


class _Classifier:
    """A ledger of ``LEDGER_REFS`` refs and full listing messages of cycles started for them."""

    def __init__(self, server: PgServer, work: Path) -> None:
        from bench import ledger_data as data
        from orphan_cleanup.core.settings import Settings

        self.server, self.work = server, work
        self.db = server.fresh_database("oc_bench_memory")
        data.add_backend(self.db)
        data.populate(self.db, 0, LEDGER_REFS)
        self.settings = Settings()
        self.rng = random.Random(37)

    def close(self) -> None:
        self.db.close()
        self.server.drop(self.db)

    @staticmethod
    def lister_limit() -> int:
        from orphan_cleanup.queues.sqs import SqsQueue

        return SqsQueue.max_message_bytes - 4096  # as Lister hands it to _Batcher

    def start_cycle(self) -> tuple[str, datetime]:
        from bench import ledger_data as data
        from orphan_cleanup.core.policy import limits_for
        from orphan_cleanup.cycle import cycle_state
        from orphan_cleanup.ledger import queries
        from orphan_cleanup.ledger.store import LedgerStore

        with self.db.transaction() as conn:  # the previous measurement's cycle is still open: release it
            conn.run("UPDATE cycles SET outcome = 'failed', finished_at = now() WHERE outcome IS NULL")
            conn.run("UPDATE cleanup SET lease_owner = NULL, lease_expires_at = NULL, clean_at = NULL")
        with self.db.connection() as conn:
            backend = queries.get_backend(conn, data.BACKEND)
        started = cycle_state.start_cycle(LedgerStore(self.db), data.BACKEND, "report",
                                          limits_for(self.settings, backend), manual=False)
        assert started.cycle is not None, started.reason
        listed_at = datetime.now(UTC)
        cycle_state.set_listed_at(LedgerStore(self.db), started.cycle.id, listed_at)
        return started.cycle.id, listed_at

    def messages(self, count: int, cut: tuple[str, int]) -> list[str]:
        """``count`` message bodies of one new cycle, each filled with distinct groups: up to
        ``limit`` bytes of body (``message``) or of group JSON as the lister counts it (``lister``)."""
        from bench import ledger_data as data
        from orphan_cleanup.core.messages import ListingBatch

        how, limit = cut
        cycle_id, listed_at = self.start_cycle()
        pool = iter(data.make_groups(LEDGER_REFS, 700 * count, self.rng))
        bodies = []
        for seq in range(count):
            empty = ListingBatch(cycle_id=cycle_id, backend=data.BACKEND, seq=seq, listed_at=listed_at,
                                 mode="report", record_all=False, groups=(), last=False)
            size = len(empty.model_dump_json()) - 1 if how == "message" else 0  # a comma per group but the first
            groups = []
            for group in pool:
                added = len(group.model_dump_json()) + 1
                if size + added > limit:
                    break
                groups.append(group)
                size += added
            body = empty.model_copy(update={"groups": tuple(groups)}).model_dump_json()
            assert ListingBatch.model_validate_json(body).groups, "no group fits"
            if how == "message":
                assert len(body.encode()) <= limit, (len(body), limit)
            bodies.append(body)
        return bodies

    def child(self, records: int, cut: tuple[str, int]) -> tuple[dict[str, Any], dict[str, str]]:
        bodies = self.messages(records, cut)
        event = self.work / f"event-{uuid.uuid4().hex[:8]}.json"
        event.write_text(json.dumps(sqs_event(bodies, "bench-listing")))
        spec = {"kind": "classifier", "event": str(event), "message_bytes": max(len(b.encode()) for b in bodies),
                "groups": sum(len(json.loads(b)["groups"]) for b in bodies)}
        return spec, _lambda_env(self.db.info.url())


class _Deleter:
    """For each child: a fresh ledger and memory cloud, a delete-mode cycle that marked a
    leaked group of every kind as an orphan and dispatched its delete request."""

    def __init__(self, server: PgServer, work: Path) -> None:
        from orphan_cleanup.core.listing import ResourceKind

        self.server, self.work = server, work
        self.kinds: tuple[ResourceKind, ...] = ()
        self.databases: list[Any] = []

    def close(self) -> None:
        for db in self.databases:
            self.server.drop(db)

    def child(self, aws_clients: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
        db = self.server.fresh_database("oc_bench_memory_del")
        self.databases.append(db)
        try:
            request, resources = self._dispatched(db)
        finally:
            db.close()
        cloud = self.work / f"cloud-{uuid.uuid4().hex[:8]}.pickle"
        cloud.write_bytes(pickle.dumps(resources))
        event = self.work / f"event-{uuid.uuid4().hex[:8]}.json"
        body = request.model_dump_json()
        event.write_text(json.dumps(sqs_event([body], "bench-delete")))
        spec = {"kind": "deleter", "event": str(event), "cloud": str(cloud), "message_bytes": len(body.encode()),
                "groups": 1, "expect": sorted(r.id for r in request.group.resources), "aws_clients": aws_clients}
        return spec, _lambda_env(db.info.url(), **DELETE_SETTINGS)

    def _dispatched(self, db: Any) -> tuple[Any, dict[str, Any]]:
        from bench.classifier import quiet_reporter
        from orphan_cleanup.core.backends import DEFAULT_TAG_KEY, SNAPSHOT_SOURCE_KEY
        from orphan_cleanup.core.listing import PROVIDER_KINDS, ResourceKind
        from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
        from orphan_cleanup.core.settings import Settings
        from orphan_cleanup.cycle.pipeline import Pipeline
        from orphan_cleanup.cycle.runner import drain
        from orphan_cleanup.queues.memory import InProcessQueue
        from tests.support.memory_cloud import KINDS, MemoryCloud, MemoryProvider, MemorySnapshots
        from tests.support.platform import Platform, add_backend

        add_backend(db, DELETE_BACKEND, regions=(DELETE_REGION,), mode="delete",
                    settings=json.dumps({"retain_snapshots_days": 1}))
        cloud = MemoryCloud()
        platform = Platform(db, cloud, DELETE_BACKEND)
        for _ in range(3):
            platform.tracked(region=DELETE_REGION)
        pipeline = Pipeline(settings=Settings.model_validate(DELETE_SETTINGS), db=db,
                            provider_for=lambda backend: MemoryProvider(backend, cloud),
                            listing_queue=InProcessQueue(), delete_queue=InProcessQueue(), reporter=quiet_reporter())
        first = pipeline.run_lister(DELETE_BACKEND, manual=False)  # a clean cycle first
        drain(pipeline)
        assert first.started, first
        with db.transaction() as conn:  # as if that cycle ran half an hour ago
            conn.run("UPDATE ledger_activity SET at = at - interval '1 hour'")
            conn.run("UPDATE cleanup SET clean_at = clean_at - interval '30 minutes'")
        # The leak: an owner terminated whose instance runs on, with one resource of each other kind.
        ref, _owner, iid = platform.terminated_leak(region=DELETE_REGION)
        volume = next(r.id for r in cloud.resources.values() if r.attached_to == iid)
        old = datetime.now(UTC) - timedelta(days=2)
        for kind in (ResourceKind.SPOT_REQUEST, ResourceKind.ADDRESS, ResourceKind.NETWORK_INTERFACE,
                     ResourceKind.SECURITY_GROUP):
            rid = cloud.create(kind, DELETE_REGION, {DEFAULT_TAG_KEY: ref}, attached_to=iid, created_at=old)
            if kind is ResourceKind.SPOT_REQUEST:
                cloud.resources[iid].spot_request = rid
        # A snapshot the deleter took of the volume, past its retention (listed: rule 15).
        snap = cloud.create(ResourceKind.SNAPSHOT, DELETE_REGION, {DEFAULT_TAG_KEY: ref, SNAPSHOT_SOURCE_KEY: volume},
                            attached_to=iid, created_at=old, name=MemorySnapshots.name_for(ref, volume))
        cloud.resources[snap].source_id = volume
        with db.transaction() as conn:  # due now, on the database's clock (the child's pipeline has no other)
            conn.run("UPDATE cleanup SET next_due_at = now() - interval '1 minute'")
        second = pipeline.run_lister(DELETE_BACKEND, manual=False)
        assert second.started and second.mode == "delete", second
        lq, dq = pipeline.listing_queue, pipeline.delete_queue
        while (body := lq.pop()) is not None:  # type: ignore[attr-defined]
            result = pipeline.handle_batch(ListingBatch.model_validate_json(body))
            assert result.status == "applied", result
        requests = []
        while (body := dq.pop()) is not None:  # type: ignore[attr-defined]
            requests.append(DeleteRequest.model_validate_json(body))
        ours = [r for r in requests if r.group.primary_id == iid]
        assert len(ours) == 1, [r.group.key for r in requests]
        self.kinds = tuple(sorted({r.kind for r in ours[0].group.resources}, key=list(ResourceKind).index))
        expected = set(KINDS) & PROVIDER_KINDS["aws"]
        assert set(self.kinds) == expected, (self.kinds, expected)
        return ours[0], cloud.resources


# ---- the child ----------------------------------------------------------------------------------


def _child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    kind = spec["kind"]
    out: dict[str, Any] = {}
    if kind == "interpreter":
        out["ms"] = None
    elif kind == "import":
        start = time.perf_counter()
        __import__(spec["module"])
        out["ms"] = (time.perf_counter() - start) * 1000
    elif kind == "classifier":
        out.update(_invoke_classifier(spec))
    elif kind == "deleter":
        out.update(_invoke_deleter(spec))
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    out["peak_mb"] = _peak_mb()
    Path(spec["out"]).write_text(json.dumps(out))


def _peak_mb() -> float:
    """``VmHWM`` in MiB, as ``common.peak_rss_mb`` reads it (not imported: the child holds no
    more than the handler it measures)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status: the memory bench needs Linux")


class _LambdaContext:
    """The fields of the Lambda context object that Powertools reads."""

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name
        self.memory_limit_in_mb = int(os.environ["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"])
        self.aws_request_id = str(uuid.uuid4())
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _invoke(handler: Any, spec: dict[str, Any], function_name: str) -> dict[str, Any]:
    event = json.loads(Path(spec["event"]).read_text())  # as the runtime hands it over
    context = _LambdaContext(function_name)
    start = time.perf_counter()
    response = handler(event, context)
    elapsed = time.perf_counter() - start
    failures = (response or {}).get("batchItemFailures", [])
    return {"ms": elapsed * 1000, "records": len(event["Records"]), "failed_records": len(failures),
            "message_bytes": spec["message_bytes"], "groups": spec["groups"]}


def _invoke_classifier(spec: dict[str, Any]) -> dict[str, Any]:
    from functions.aws import classifier
    from orphan_cleanup.cycle.pipeline import Pipeline

    statuses: list[str] = []
    verdicts: dict[str, int] = {}
    handle_batch = Pipeline.handle_batch

    def recorded(self: Pipeline, batch: Any) -> Any:
        result = handle_batch(self, batch)
        statuses.append(result.status)
        for verdict, n in result.verdicts.items():
            verdicts[verdict] = verdicts.get(verdict, 0) + n
        return result

    Pipeline.handle_batch = recorded  # type: ignore[method-assign]
    out = _invoke(classifier.handler, spec, "orphan-cleanup-classifier")
    ok = len(statuses) == out["records"] and not out["failed_records"]
    out["outcome"] = ",".join(sorted(set(statuses))) if ok else f"FAILED {out['failed_records']} of {statuses}"
    out["verdicts"] = verdicts
    return out


def _invoke_deleter(spec: dict[str, Any]) -> dict[str, Any]:
    from functions.aws import deleter
    from orphan_cleanup.cycle.pipeline import Pipeline
    from orphan_cleanup.entrypoints import bootstrap
    from tests.support.memory_cloud import MemoryCloud, MemoryProvider

    cloud = MemoryCloud(resources=pickle.loads(Path(spec["cloud"]).read_bytes()))

    def memory_factory(settings: Any, **_: Any) -> Any:
        return lambda backend: MemoryProvider(backend, cloud)

    deployed_factory = bootstrap.provider_factory
    bootstrap.provider_factory = memory_factory  # type: ignore[assignment]  # only the adapter is not the deployed one
    outcomes: list[str] = []
    handle_delete = Pipeline.handle_delete

    def recorded(self: Pipeline, request: Any, holder: str | None = None) -> Any:
        outcome = handle_delete(self, request, holder)
        outcomes.append(outcome.value)
        return outcome

    Pipeline.handle_delete = recorded  # type: ignore[method-assign]
    out = _invoke(deleter.handler, spec, "orphan-cleanup-deleter")
    gone = [rid for rid in spec["expect"] if not cloud.exists(rid)]
    out["resources_gone"] = len(gone)
    out["outcome"] = ",".join(outcomes) if outcomes and not out["failed_records"] else \
        f"FAILED {out['failed_records']} of {outcomes}"
    if outcomes == ["deleted"] and len(gone) != len(spec["expect"]):
        out["outcome"] = f"deleted, but {len(spec['expect']) - len(gone)} resources remain"
    if spec["aws_clients"]:
        _real_clients(deployed_factory)
    return out


def _real_clients(deployed_factory: Any) -> None:
    """The deployed adapter of the request's backend and the clients a delete of its group
    makes (identity check, operations in the region), built, never called."""
    from orphan_cleanup.entrypoints import aws
    from orphan_cleanup.ledger import queries

    pipeline = aws.pipeline()
    with pipeline.db.connection() as conn:
        backend = queries.get_backend(conn, DELETE_BACKEND)
    provider = deployed_factory(pipeline.settings)(backend)
    provider.operations(DELETE_REGION)  # ec2, elbv2, autoscaling
    provider._client("sts", DELETE_REGION)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one child per figure instead of three")
    parser.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child_main(args.child)
        return 0
    from bench.common import PgServer, print_tables

    print_tables(lambda: run(PgServer(), quick=args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
