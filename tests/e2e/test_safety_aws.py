"""The safety rules of docs/SAFETY.md on real parts: `orphan-cleanup run` as a
subprocess and the real AWS Lambda handlers, against a real Postgres ledger and
EC2/SQS on the moto server (whose credentials reach account 123456789012).

- rule 10: ownership is by provider account, not by backend id;
- rule 11: identity before action;
- `off` is final (C5), for an event's `mode` and for `run --mode`;
- rule 9: an edit of the backend's own row is activity;
- rule 1: a ref tag with an empty or invalid value is `ignored` / `malformed_ref`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from functions.aws import classifier, lister
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.db import Database
from tests.support.ledger_helpers import add_backend, count_rows, cycle_row
from tests.support.sqs_harness import ACCOUNT, AMI, DeployedQueues, MotoPlatform, context, lambda_record

OTHER_ACCOUNT = "210987654321"
GONE = ("shutting-down", "terminated")

pytestmark = pytest.mark.usefixtures("moto_reset")


# ---- helpers -----------------------------------------------------------------------------------

def cli(db: Database, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m orphan_cleanup ...` as a user runs it (margin 0: moto stamps whole seconds)."""
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": "0", "NO_COLOR": "1"}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)


def run_json(db: Database, backend: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = cli(db, "run", "--backend", backend, "--json", *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one document
    assert doc["backend"] == backend
    return proc.returncode, doc, proc.stderr


def by_primary(doc: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {g["primary_id"] or g["provider_ref"]: (g["verdict"], g["reason"], g["action"]) for g in doc["groups"]}


def retry_leak(platform: MotoPlatform) -> tuple[str, str]:
    """A live owner whose first attempt leaked: (leaked VM, recorded VM)."""
    issued = platform.ledger.issue_ref(owner_name="retried")
    leaked, _ = platform.launch(issued.provider_ref, data_volume=False)
    kept, _ = platform.launch(issued.provider_ref)
    platform.ledger.mark_provisioning(issued.owner_id, backend_id=platform.backend_id, primary_id=kept,
                                      region=platform.region, status=OwnerStatus.BUSY)
    return leaked, kept


def owner_on(platform: MotoPlatform, backend_id: str, *, primary_id: str | None = None) -> tuple[str, str]:
    """A VM launched by ``platform`` whose live owner records backend ``backend_id``
    (and ``primary_id``, by default the VM itself). Returns (VM, owner id)."""
    issued = platform.ledger.issue_ref(owner_name="elsewhere")
    vm, _ = platform.launch(issued.provider_ref, data_volume=False)
    platform.ledger.mark_provisioning(issued.owner_id, backend_id=backend_id, primary_id=primary_id or vm,
                                      region=platform.region, status=OwnerStatus.BUSY)
    return vm, issued.owner_id


def cycles_of(db: Database, backend: str) -> int:
    with db.connection() as conn:
        return conn.run("SELECT count(*) FROM cycles WHERE backend_id = :b", b=backend)[0][0]


class Functions(DeployedQueues):
    """The deployed functions' environment: real SQS queues on moto, the test database."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(db, monkeypatch, "safety")

    def classify_all(self) -> None:
        """Deliver every waiting listing batch to the real classifier handler."""
        bodies = self.receive(self.listing)
        assert bodies
        response = classifier.handler({"Records": [lambda_record(b) for b in bodies]}, context("classifier"))
        assert response["batchItemFailures"] == []


@pytest.fixture
def functions(emptied_db: Database, monkeypatch: pytest.MonkeyPatch) -> Functions:
    return Functions(emptied_db, monkeypatch)


# ---- rule 10: ownership is by provider account ---------------------------------------------------

def test_owners_of_another_backend_on_the_same_account_stay_tracked(emptied_db):
    # given two backends on the same account, each with live tracked owners, and
    # leaks of aws-b: a terminated owner's VM and a retry's first attempt
    db = emptied_db
    add_backend(db, "aws-a")
    add_backend(db, "aws-b")
    a, b = MotoPlatform(db, "aws-a"), MotoPlatform(db, "aws-b")
    a_tracked = a.tracked()
    b_tracked = [b.tracked(), b.tracked()]
    b_terminated = b.terminated_leak()
    b_leaked, b_kept = retry_leak(b)

    # when aws-a runs in delete mode
    code, doc, _ = run_json(db, "aws-a", "--mode", "delete", "--yes")

    # then aws-b's tracked VMs are tracked and still run; its leaks are orphans of
    # this account, classified by the rule (not as another backend's leftovers)
    assert code == 0 and doc["outcome"] == "clean" and doc["failures"] == [], doc
    groups = by_primary(doc)
    for launched in [a_tracked, *b_tracked]:
        assert groups[launched.instance_id] == ("tracked", "tracked", "none")
        assert b.instance_state(launched.instance_id) == "running"
    assert groups[b_kept] == ("tracked", "tracked", "none")
    assert b.instance_state(b_kept) == "running"
    assert groups[b_terminated.instance_id] == ("orphan", "owner_terminated", "deleted")
    assert groups[b_leaked] == ("orphan", "primary_mismatch", "deleted")
    assert b.instance_state(b_terminated.instance_id) in GONE and b.instance_state(b_leaked) in GONE


def test_an_owner_naming_no_known_backend_is_skipped_never_deleted(emptied_db):
    # given owners whose backend_id is 'aws' (no such backends row), one recording
    # the listed VM and one recording another VM; and an owner on a backend of
    # another account that records this account's VM (a conflict)
    db = emptied_db
    add_backend(db, "aws-a")
    add_backend(db, "aws-dr", account=OTHER_ACCOUNT)
    a = MotoPlatform(db, "aws-a")
    same_vm, _ = owner_on(a, "aws")
    other_vm, _ = owner_on(a, "aws", primary_id="i-0123456789abcdef0")
    conflict, _ = owner_on(a, "aws-dr")
    tracked = a.tracked()

    # when aws-a runs in delete mode
    code, doc, _ = run_json(db, "aws-a", "--mode", "delete", "--yes")

    # then they are skipped, not deleted, and the cycle stays unsettled
    assert code == 0 and doc["outcome"] == "unsettled", doc
    groups = by_primary(doc)
    assert groups[same_vm] == ("skipped", "unknown_owner_backend", "none")
    assert groups[other_vm] == ("skipped", "unknown_owner_backend", "none")
    assert groups[conflict] == ("skipped", "owner_backend_conflict", "none")
    assert groups[tracked.instance_id] == ("tracked", "tracked", "none")
    for vm in (same_vm, other_vm, conflict, tracked.instance_id):
        assert a.instance_state(vm) == "running"


def test_a_failover_to_another_account_leaves_a_backend_mismatch_orphan(emptied_db):
    # given an owner provisioned on aws-a (123456789012) that failed over to
    # aws-dr (another account) with another primary, recorded with plain SQL
    db = emptied_db
    add_backend(db, "aws-a")
    add_backend(db, "aws-dr", account=OTHER_ACCOUNT, regions=("us-west-2",))
    a = MotoPlatform(db, "aws-a")
    old_vm, owner = owner_on(a, "aws-a")
    with db.connection() as conn:
        conn.run("UPDATE instances SET backend_id = 'aws-dr', primary_id = 'i-0fa11over0000001',"
                 " region = 'us-west-2', provisioned_at = now() WHERE id = :o", o=owner)
    tracked = a.tracked()

    # when aws-a runs in delete mode
    code, doc, _ = run_json(db, "aws-a", "--mode", "delete", "--yes")

    # then the old VM is a failover leftover and is deleted; the tracked one stays
    assert code == 0 and doc["outcome"] == "clean", doc
    groups = by_primary(doc)
    assert groups[old_vm] == ("orphan", "backend_mismatch", "deleted")
    assert a.instance_state(old_vm) in GONE
    assert groups[tracked.instance_id] == ("tracked", "tracked", "none")
    assert a.instance_state(tracked.instance_id) == "running"


# ---- rule 11: identity before action ---------------------------------------------------------------

def test_a_backend_whose_credentials_reach_another_account_fails_and_touches_nothing(emptied_db):
    # given a backend that says 210987654321 while the credentials reach moto's
    # 123456789012, with what would be an orphan there
    db = emptied_db
    add_backend(db, "aws-wrong", account=OTHER_ACCOUNT)
    platform = MotoPlatform(db, "aws-wrong")
    leak = platform.terminated_leak()
    tracked = platform.tracked()

    # when it runs in delete mode
    code, doc, stderr = run_json(db, "aws-wrong", "--mode", "delete", "--yes")

    # then the cycle fails with one `*` failure, lists and deletes nothing
    expected = f"account_mismatch: credentials reach {ACCOUNT}, backend aws-wrong says {OTHER_ACCOUNT}"
    assert code == 1 and doc["outcome"] == "failed"
    assert doc["failures"] == [{"region": "*", "error": expected}]
    assert doc["groups"] == []
    assert platform.instance_state(leak.instance_id) == "running"
    assert platform.instance_state(tracked.instance_id) == "running"
    # one error line says why (the log line before it carries the same error among its fields)
    lines = [line for line in stderr.splitlines() if "account_mismatch" in line and not line.startswith("ERROR ")]
    assert len(lines) == 1 and expected in lines[0], stderr
    assert cycle_row(db, doc["cycle_id"])["outcome"] == "failed"
    assert count_rows(db, "cycle_groups") == 0


@pytest.mark.parametrize(("delete_account", "deleted"), [(OTHER_ACCOUNT, False), (ACCOUNT, True)],
                         ids=["delete-role-reaches-another-account", "delete-role-of-the-account"])
def test_the_deleter_assumes_the_delete_role_and_the_lister_the_listing_role(emptied_db, delete_account, deleted):
    # given a backend whose listing role and delete role are separate roles (the
    # target-account template's two roles); moto's AssumeRole reaches the role's account
    db = emptied_db
    add_backend(db, "aws-roles", settings={"role_arn": f"arn:aws:iam::{ACCOUNT}:role/orphan-cleanup-lister",
                                           "delete_role_arn": f"arn:aws:iam::{delete_account}:role/deleter"})
    platform = MotoPlatform(db, "aws-roles")
    leak = platform.terminated_leak()

    # when it runs in delete mode
    code, doc, stderr = run_json(db, "aws-roles", "--mode", "delete", "--yes")

    # then the listing (listing role: the right account) found the orphan, and the deleter
    # checked the identity of the delete role: a delete role of another account deletes nothing
    [group] = [g for g in doc["groups"] if g["primary_id"] == leak.instance_id]
    assert group["verdict"] == "orphan"
    if deleted:
        assert group["action"] == "deleted" and code == 0, doc
        assert platform.instance_state(leak.instance_id) in ("shutting-down", "terminated")
    else:
        assert group["action"] == "delete_failed" and doc["outcome"] == "failed", doc
        assert platform.instance_state(leak.instance_id) == "running"
        with db.connection() as conn:
            [[result]] = conn.run("SELECT result::text FROM delete_requests WHERE cycle_id = :c", c=doc["cycle_id"])
        assert f"account_mismatch: credentials reach {OTHER_ACCOUNT}" in result


# ---- off is final ----------------------------------------------------------------------------------

OFF_CASES = [pytest.param("off", None, id="backend-off"), pytest.param(None, "off", id="global-off")]


@pytest.mark.parametrize(("backend_mode", "global_mode"), OFF_CASES)
def test_an_off_backend_runs_for_no_event_mode(functions, monkeypatch, backend_mode, global_mode):
    # given a backend that is off (its own mode, or the global one), with an orphan
    db = functions.db
    add_backend(db, "aws-off", mode=backend_mode)
    if global_mode:
        monkeypatch.setenv("ORPHAN_CLEANUP_MODE", global_mode)
    leak = MotoPlatform(db, "aws-off").terminated_leak()

    # when the lister is asked for a delete-mode run
    response = lister.handler({"backend": "aws-off", "mode": "delete"}, context("lister"))

    # then no cycle starts and nothing is listed or deleted
    assert response.get("started") is False and not response.get("cycle_id"), response
    assert cycles_of(db, "aws-off") == 0
    assert functions.receive(functions.listing) == []
    assert MotoPlatform(db, "aws-off").instance_state(leak.instance_id) == "running"


# (``--yes`` and the terminal prompt of C3 are issue #14's: without a terminal, run proceeds)
@pytest.mark.parametrize("output", [(), ("--json",)], ids=["table", "json"])
@pytest.mark.parametrize(("backend_mode", "global_mode"), OFF_CASES)
def test_an_off_backend_runs_for_no_run_mode(emptied_db, backend_mode, global_mode, output):
    db = emptied_db
    add_backend(db, "aws-off", mode=backend_mode)
    platform = MotoPlatform(db, "aws-off")
    leak = platform.terminated_leak()

    env = {"ORPHAN_CLEANUP_MODE": global_mode} if global_mode else {}
    proc = cli(db, "run", "--backend", "aws-off", "--mode", "delete", *output, **env)

    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "backend aws-off is off" in proc.stderr and "Traceback" not in proc.stderr
    assert cycles_of(db, "aws-off") == 0
    assert platform.instance_state(leak.instance_id) == "running"


# ---- rule 9: an edit of the backend's own row is activity ---------------------------------------

def scheduled(backend: str) -> dict[str, Any]:
    response = lister.handler({"backend": backend}, context("lister"))
    assert response["ok"], response
    return response


def make_due(db: Database, backend: str) -> None:
    with db.connection() as conn:
        conn.run("UPDATE cleanup SET next_due_at = now() - interval '1 hour' WHERE backend_id = :b", b=backend)


def test_a_region_added_with_plain_sql_is_listed_by_the_next_scheduled_run(functions):
    # given a backend of us-east-1 after a clean scheduled cycle, and an orphan in
    # us-west-2 whose ledger rows were all written before that cycle
    db = functions.db
    add_backend(db, "aws-r9", mode="report")
    MotoPlatform(db, "aws-r9").tracked()
    west = MotoPlatform(db, "aws-r9", region="us-west-2")
    leak = west.terminated_leak()
    first = scheduled("aws-r9")
    assert first["started"] and first["reason"] == "never_cleaned", first
    functions.classify_all()
    assert cycle_row(db, first["cycle_id"])["outcome"] == "clean"
    make_due(db, "aws-r9")
    idle = scheduled("aws-r9")
    assert idle["started"] is False and idle["reason"] == "no_activity", idle  # nothing changed yet

    # when a region is added by a plain SQL UPDATE and the backend is due again
    with db.connection() as conn:
        conn.run("UPDATE backends SET regions = '{us-east-1,us-west-2}' WHERE id = 'aws-r9'")
    make_due(db, "aws-r9")
    second = scheduled("aws-r9")

    # then the scheduled run lists, for activity, and sees the new region
    assert second["started"] and second["reason"] == "activity", second
    functions.classify_all()
    with db.connection() as conn:
        rows = conn.run("SELECT region, primary_id, verdict, reason, action FROM cycle_groups"
                        " WHERE cycle_id = :c AND region = 'us-west-2'", c=second["cycle_id"])
    assert [tuple(r) for r in rows] == [("us-west-2", leak.instance_id, "orphan", "owner_terminated", "reported")]
    assert west.instance_state(leak.instance_id) == "running"  # report mode


# ---- rule 1: malformed refs are ignored ----------------------------------------------------------

def test_malformed_refs_are_shown_ignored_and_never_deleted(emptied_db):
    # given instances tagged with an empty and an invalid ref (and a volume
    # attached to one, with the same raw value), and a tracked owner
    db = emptied_db
    add_backend(db, "aws-m")
    platform = MotoPlatform(db, "aws-m")
    ec2 = platform.ec2

    def launch(value: str) -> str:
        tags = [{"Key": "provider_ref", "Value": value}]
        return ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, TagSpecifications=[
            {"ResourceType": "instance", "Tags": tags}])["Instances"][0]["InstanceId"]

    empty_vm = launch("")
    bad_vm = launch("NOT-A-REF")
    az = ec2.describe_instances(InstanceIds=[bad_vm])["Reservations"][0]["Instances"][0]["Placement"][
        "AvailabilityZone"]
    vol = ec2.create_volume(AvailabilityZone=az, Size=1, TagSpecifications=[
        {"ResourceType": "volume", "Tags": [{"Key": "provider_ref", "Value": "NOT-A-REF"}]}])["VolumeId"]
    ec2.attach_volume(VolumeId=vol, InstanceId=bad_vm, Device="/dev/sdf")
    tracked = platform.tracked()

    # when the backend runs in delete mode
    code, doc, _ = run_json(db, "aws-m", "--mode", "delete", "--yes")

    # then both are ignored / malformed_ref under their raw value, nothing is
    # terminated, and the cycle is clean
    assert code == 0 and doc["outcome"] == "clean", doc
    groups = {g["primary_id"]: g for g in doc["groups"]}
    for vm, raw, resources in ((empty_vm, "", {("instance", empty_vm)}),
                               (bad_vm, "NOT-A-REF", {("instance", bad_vm), ("volume", vol)})):
        g = groups[vm]
        assert (g["verdict"], g["reason"], g["action"], g["provider_ref"]) == ("ignored", "malformed_ref", "none", raw)
        assert {(r["kind"], r["id"]) for r in g["resources"]} == resources
        assert platform.instance_state(vm) == "running"
    assert groups[tracked.instance_id]["verdict"] == "tracked"
    assert vol in platform.all_volumes()
