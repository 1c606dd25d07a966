"""Safety seams of the AWS path, on real parts: `orphan-cleanup run` as a subprocess against
a real Postgres ledger and EC2 on the moto server (where moto leaves a field out or stamps
times now, the recording proxy of ``tests/support/aws_proxy.py`` fills it into moto's reply,
as EC2 would send it), and the in-process runner where a test acts between classification
and deletion. Each test reproduced a defect of the code before docs/SAFETY.md rules 15-20
(committed as a strict xfail naming the failure it gave), and asserts the behaviour now."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest

from infra import checks
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.plan import Plan
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.ledger_helpers import add_backend
from tests.support.seams import GONE, cli, delete_results, run_json, skip_reasons, verdicts
from tests.support.sqs_harness import AMI, MotoPlatform

pytestmark = pytest.mark.usefixtures("moto_reset")
SOURCE_KEY = "orphan-cleanup-source"


@pytest.fixture
def proxy(moto_reset: str) -> Iterator[AwsProxy]:
    with AwsProxy(moto_reset) as p:
        yield p


def orphan(platform: MotoPlatform, *, tags: dict[str, str] | None = None, **launch: object) -> str:
    """An instance whose owner row was hard-deleted (a failed placeholder); returns its id."""
    issued = platform.ledger.issue_ref(owner_name="placeholder")
    iid, _ = platform.launch(issued.provider_ref, data_volume=False, **launch)  # type: ignore[arg-type]
    if tags:
        platform.ec2.create_tags(Resources=[iid], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    platform.ledger.hard_delete(issued.owner_id)
    return iid


def in_process(db: Database, moto_url: str) -> Pipeline:
    """The CLI's pipeline, built in this process (real adapters on moto, in-process queues)."""
    settings = Settings.explicit(confirm_seconds=0, margin_seconds=0, aws_endpoint_url=moto_url)
    return bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def aged_snapshots(days: int) -> Callable[[bytes], bytes]:
    """A DescribeSnapshots reply as EC2 sends it for snapshots taken ``days`` ago (moto stamps them now)."""
    def rewrite(body: bytes) -> bytes:
        def older(m: re.Match[bytes]) -> bytes:
            when = datetime.fromisoformat(m.group(1).decode().replace("Z", "+00:00")) - timedelta(days=days)
            return b"<startTime>" + when.strftime("%Y-%m-%dT%H:%M:%S.000Z").encode() + b"</startTime>"
        return re.sub(rb"<startTime>([^<]+)</startTime>", older, body)
    return rewrite


def spot_request_ids(requests: dict[str, str]) -> Callable[[bytes], bytes]:
    """A DescribeInstances reply naming each spot instance's request, as EC2 does (moto leaves it out)."""
    def rewrite(body: bytes) -> bytes:
        for iid, sir in requests.items():
            body = body.replace(f"<instanceId>{iid}</instanceId>".encode(),
                                f"<instanceId>{iid}</instanceId><spotInstanceRequestId>{sir}</spotInstanceRequestId>"
                                .encode())
        return body
    return rewrite


# ---- 2. snapshot retention deletes only the snapshots the deleter took -----------------------------

def test_retention_leaves_a_ref_tagged_snapshot_the_deleter_never_took(emptied_db, proxy):
    """Setup: retain_snapshots_days 7; a 10-day-old snapshot of the account tagged with the ref of
    an owner hard-deleted long ago, but without orphan-cleanup-source (someone else's backup).
    Shows: a delete run neither lists it nor deletes it."""
    db = emptied_db
    add_backend(db, "aws-snap", settings={"retain_snapshots_days": 7})
    platform = MotoPlatform(db, "aws-snap")
    issued = platform.ledger.issue_ref(owner_name="gone")
    platform.ledger.hard_delete(issued.owner_id)
    volume = platform.ec2.create_volume(AvailabilityZone="us-east-1a", Size=1)["VolumeId"]  # not ours
    snapshot = platform.ec2.create_snapshot(VolumeId=volume, TagSpecifications=[{
        "ResourceType": "snapshot", "Tags": [{"Key": "provider_ref", "Value": issued.provider_ref}]}])["SnapshotId"]
    platform.age_ledger()
    proxy.add_rule(Rule("DescribeSnapshots", rewrite=aged_snapshots(10)))

    code, doc, _ = run_json(db, "aws-snap", "--mode", "delete", "--yes", AWS_ENDPOINT_URL=proxy.url)

    assert code == 0, doc
    assert [(g["verdict"], g["reason"], g["action"]) for g in doc["groups"]
            if snapshot in {r["id"] for r in g["resources"]}] == []
    left = platform.ec2.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "snapshot-id", "Values": [snapshot]}])
    assert [s["SnapshotId"] for s in left["Snapshots"]] == [snapshot]


def _delete_snapshot_allows(statements: list[dict]) -> list[dict]:
    def actions(s: dict) -> list[str]:
        a = s.get("Action", [])
        return [a] if isinstance(a, str) else list(a)
    return [s for s in statements if s.get("Effect") == "Allow" and "ec2:DeleteSnapshot" in actions(s)]


def _requires_source_tag(statement: dict) -> bool:
    value = (statement.get("Condition") or {}).get("StringLike", {}).get(f"aws:ResourceTag/{SOURCE_KEY}")
    return value in ("vol-*", ["vol-*"])


def test_the_deleter_may_delete_only_snapshots_carrying_the_source_tag():
    """Setup: the deleter's IAM as deployed: template.yaml's DeleterRole and infra/aws/iam.tf's
    deleter document (read as tests/unit/test_deploy_sam.py and test_deploy_terraform.py do).
    Shows: every statement allowing ec2:DeleteSnapshot requires the orphan-cleanup-source tag,
    its value a volume id (``StringLike: {aws:ResourceTag/orphan-cleanup-source: vol-*}``), so
    IAM itself keeps the deleter off snapshots it did not take."""
    sam = _delete_snapshot_allows(checks.role_statements(checks.load_template(checks.TEMPLATE), "DeleterRole"))
    module = checks.Module.load(checks.REPO / "infra" / "aws")
    tf = _delete_snapshot_allows(checks.terraform_policy_documents(module)["deleter"])
    assert sam and tf
    assert [s.get("Sid") for s in sam if not _requires_source_tag(s)] == []
    assert [s.get("Sid") for s in tf if not _requires_source_tag(s)] == []


# ---- 3. protect and controller keys are the account's ------------------------------------------------

def _two_backends_on_one_account(db: Database) -> MotoPlatform:
    add_backend(db, "aws-b", mode="report", settings={"protect_tag_key": "platform-keep",
                                                      "controller_tag_keys": ["my-controller"]})
    add_backend(db, "aws-a", mode="delete")
    return MotoPlatform(db, "aws-a")


def test_another_backends_protect_and_controller_keys_on_the_account_keep_its_instances(emptied_db):
    """Setup: aws-b (report; protect key platform-keep, controller key my-controller) and aws-a
    (delete, defaults) on one account and region; two orphans, one tagged platform-keep=yes, one
    my-controller=c1. Shows: aws-a's delete run keeps both, protected / protect_tag and
    managed_by_controller."""
    db = emptied_db
    platform = _two_backends_on_one_account(db)
    kept = orphan(platform, tags={"platform-keep": "yes"})
    managed = orphan(platform, tags={"my-controller": "c1"})
    platform.age_ledger()

    code, doc, _ = run_json(db, "aws-a", "--mode", "delete", "--yes")

    assert code == 0, doc
    groups = verdicts(doc)
    assert (groups[kept][:2], groups[managed][:2]) == (("protected", "protect_tag"),
                                                       ("protected", "managed_by_controller"))
    assert platform.instance_state(kept) == platform.instance_state(managed) == "running"


def test_the_deleters_reread_honours_another_backends_protect_key_on_the_account(emptied_db, moto_reset):
    """Setup: the same two backends; one orphan, classified by an in-process delete cycle of aws-a;
    between classification and deletion (the confirm callback) it is tagged platform-keep=yes.
    Shows: the deleter's re-read sees the account's protect key and does not terminate it."""
    db = emptied_db
    platform = _two_backends_on_one_account(db)
    vm = orphan(platform)
    platform.age_ledger()

    def tag_it(plan: Plan) -> bool:
        assert len(plan.deletes) == 1
        platform.ec2.create_tags(Resources=[vm], Tags=[{"Key": "platform-keep", "Value": "yes"}])
        return True

    run_cycle(in_process(db, moto_reset), "aws-a", mode="delete", confirm=tag_it)

    assert platform.instance_state(vm) == "running"


def test_a_backend_row_of_the_account_that_cannot_be_read_still_protects(emptied_db):
    """Setup: aws-a (delete, protect key keep-a) and, on the same account, aws-b whose settings the
    product refuses (``protect_tag_keys`` a string, not a list); two orphans, one tagged with the
    default protect key, one keep-c. Shows: aws-a's delete run keeps both (a row that cannot be read
    adds the default keys and every key string it holds: the safe direction)."""
    db = emptied_db
    add_backend(db, "aws-a", mode="delete", settings={"protect_tag_key": "keep-a"})
    add_backend(db, "aws-b", mode="report")
    with db.transaction() as conn:
        conn.run("UPDATE backends SET settings = CAST(:s AS jsonb) WHERE id = 'aws-b'",
                 s='{"protect_tag_key": "keep-b", "protect_tag_keys": "keep-c"}')
    platform = MotoPlatform(db, "aws-a")
    default = orphan(platform, tags={"orphan-cleanup-protect": "yes"})
    theirs = orphan(platform, tags={"keep-c": "yes"})
    platform.age_ledger()

    code, doc, _ = run_json(db, "aws-a", "--mode", "delete", "--yes")

    assert code == 0, doc
    groups = verdicts(doc)
    assert (groups[default][:2], groups[theirs][:2]) == (("protected", "protect_tag"), ("protected", "protect_tag"))
    assert platform.instance_state(default) == platform.instance_state(theirs) == "running"


# ---- 5. a primary_id that names no listed VM --------------------------------------------------------

def test_a_live_owner_whose_primary_id_names_no_listed_vm_keeps_its_vm(emptied_db):
    """Setup: a busy owner whose primary_id is ``i-0`` and 15 zeros (mangled: no such instance),
    its one VM tagged with its ref and running. Shows: a delete run keeps the VM, skipped /
    primary_not_listed (the recorded primary is not in the listing: nothing to compare with)."""
    db = emptied_db
    add_backend(db, "aws-prod")
    platform = MotoPlatform(db, "aws-prod")
    issued = platform.ledger.issue_ref(owner_name="busy")
    vm, _ = platform.launch(issued.provider_ref, data_volume=False)
    platform.ledger.mark_provisioning(issued.owner_id, backend_id="aws-prod", primary_id="i-0" + "0" * 15,
                                      region=platform.region, status=OwnerStatus.BUSY)

    code, doc, _ = run_json(db, "aws-prod", "--mode", "delete", "--yes")

    assert code == 0, doc
    assert verdicts(doc)[vm] == ("skipped", "primary_not_listed", "none")
    assert platform.instance_state(vm) == "running"


# ---- 9. one oversized group ---------------------------------------------------------------------------

def test_an_oversized_malformed_group_does_not_fail_the_cycle(emptied_db):
    """Setup: twelve unattached volumes tagged provider_ref=JUNK (not a ref) with 45 long tags each
    (over 200 KB as one group), and one real orphan VM. Shows: a report run does not fail, the
    orphan is reported and the JUNK volumes are ignored / malformed_ref."""
    db = emptied_db
    add_backend(db, "aws-prod")
    platform = MotoPlatform(db, "aws-prod")
    vm = orphan(platform)
    long_tags = [{"Key": f"k{n:02d}-" + "x" * 124, "Value": "v" * 256} for n in range(45)]
    junk = {platform.ec2.create_volume(AvailabilityZone="us-east-1a", Size=1, TagSpecifications=[{
        "ResourceType": "volume", "Tags": [{"Key": "provider_ref", "Value": "JUNK"}, *long_tags]}])["VolumeId"]
        for _ in range(12)}
    platform.age_ledger()

    code, doc, stderr = run_json(db, "aws-prod")

    assert code == 0 and doc["outcome"] != "failed", (doc, stderr)
    assert verdicts(doc)[vm] == ("orphan", "owner_deleted", "reported")
    junk_groups = [g for g in doc["groups"] if g["provider_ref"] == "JUNK"]
    assert {(g["verdict"], g["reason"]) for g in junk_groups} == {("ignored", "malformed_ref")}
    assert {r["id"] for g in junk_groups for r in g["resources"]} == junk


# ---- 11. a persistent spot request without the ref ------------------------------------------------------

def test_an_untagged_persistent_spot_request_is_not_cancelled(emptied_db, proxy):
    """Setup: an orphan spot instance (its owner hard-deleted long ago, the instance tagged with the
    ref) whose persistent spot request carries no ref tag; DescribeInstances names the request, as
    EC2 does. Shows: a delete run cancels nothing and terminates nothing; the group's recorded
    result is skipped, spot_request_ref_missing."""
    db = emptied_db
    add_backend(db, "aws-prod")
    platform = MotoPlatform(db, "aws-prod")
    issued = platform.ledger.issue_ref(owner_name="spot")
    [request] = platform.ec2.request_spot_instances(
        SpotPrice="0.5", InstanceCount=1, Type="persistent",
        LaunchSpecification={"ImageId": AMI, "InstanceType": "t3.micro"})["SpotInstanceRequests"]
    sir, vm = request["SpotInstanceRequestId"], request["InstanceId"]
    platform.ec2.create_tags(Resources=[vm], Tags=[{"Key": "provider_ref", "Value": issued.provider_ref}])
    platform.ledger.hard_delete(issued.owner_id)
    platform.age_ledger()
    state = platform.ec2.describe_spot_instance_requests(SpotInstanceRequestIds=[sir])["SpotInstanceRequests"][0]
    proxy.add_rule(Rule("DescribeInstances", rewrite=spot_request_ids({vm: sir})))

    code, doc, _ = run_json(db, "aws-prod", "--mode", "delete", "--yes", AWS_ENDPOINT_URL=proxy.url)

    after = platform.ec2.describe_spot_instance_requests(
        Filters=[{"Name": "spot-instance-request-id", "Values": [sir]}])["SpotInstanceRequests"]
    assert [r["State"] for r in after] == [state["State"]]
    assert "CancelSpotInstanceRequests" not in proxy.actions()
    assert platform.instance_state(vm) == "running"
    [recorded] = delete_results(db, doc["cycle_id"])
    assert recorded["state"] == "skipped" and "spot_request_ref_missing" in skip_reasons(recorded).values(), recorded


# ---- 12. a lifted termination protection ------------------------------------------------------------------

def test_an_orphan_whose_termination_protection_was_lifted_is_deleted(emptied_db):
    """Setup: an orphan instance with DisableApiTermination. A delete run finds it protected /
    termination_protection and leaves it; then the protection is lifted. Shows: the next delete
    run terminates it (action deleted)."""
    db = emptied_db
    add_backend(db, "aws-prod")
    platform = MotoPlatform(db, "aws-prod")
    vm = orphan(platform, termination_protection=True)
    platform.age_ledger()

    _, first, _ = run_json(db, "aws-prod", "--mode", "delete", "--yes")
    assert verdicts(first)[vm] == ("protected", "termination_protection", "reported")
    assert platform.instance_state(vm) == "running"
    platform.ec2.modify_instance_attribute(InstanceId=vm, DisableApiTermination={"Value": False})

    code, second, _ = run_json(db, "aws-prod", "--mode", "delete", "--yes")

    assert code == 0, second
    assert verdicts(second)[vm][2] == "deleted", second
    assert platform.instance_state(vm) in GONE


# ---- 13. settings that are JSON but not an object ---------------------------------------------------------

def test_settings_that_are_not_an_object_fail_that_backend_alone_in_one_line(emptied_db):
    """Setup: backends X and Y; X's settings are set to '[1,2]' with SQL (JSON, not an object).
    Shows: `run --backend X` exits 2 with one line on stderr (besides its indented progress lines)
    naming X and settings, no traceback; Y still runs; `backend list` still lists both."""
    db = emptied_db
    add_backend(db, "X")
    add_backend(db, "Y")
    with db.connection() as conn:
        conn.run("UPDATE backends SET settings = '[1,2]' WHERE id = 'X'")

    bad = cli(db, "run", "--backend", "X")

    assert "Traceback" not in bad.stderr, bad.stderr
    said = [line for line in bad.stderr.splitlines() if line.strip() and not line.startswith("  ")]  # not progress
    assert bad.returncode == 2 and len(said) == 1, bad.stderr
    assert re.search(r"\bX\b", said[0]) and "settings" in said[0], said
    assert cli(db, "run", "--backend", "Y").returncode == 0
    listed = cli(db, "backend", "list")
    assert listed.returncode == 0, listed.stderr
    assert {"X", "Y"} <= set(listed.stdout.split())


# ---- the stack's protect key always protects (SAFETY.md rule 16) -------------------------------

def test_the_stacks_protect_key_protects_when_every_row_renames_its_own(emptied_db):
    """Setup: the only backend of the account renames its protect key to platform-keep; one orphan
    tagged with the product's default key, one with the stack's own key (stack-keep, set by
    ORPHAN_CLEANUP_PROTECT_TAG_KEY). Shows: a run with the default stack key keeps the first, and a
    run with the stack key stack-keep keeps the second: no row takes the stack's key away."""
    db = emptied_db
    add_backend(db, "aws-a", mode="delete", settings={"protect_tag_key": "platform-keep"})
    platform = MotoPlatform(db, "aws-a")
    default = orphan(platform, tags={"orphan-cleanup-protect": "yes"})
    stack = orphan(platform, tags={"stack-keep": "yes"})
    platform.age_ledger()

    code, doc, _ = run_json(db, "aws-a", "--mode", "report")
    assert code == 0, doc
    assert verdicts(doc)[default][:2] == ("protected", "protect_tag")
    assert verdicts(doc)[stack][0] == "orphan"  # stack-keep is no key of this stack (yet)

    code, doc, _ = run_json(db, "aws-a", "--mode", "delete", "--yes", ORPHAN_CLEANUP_PROTECT_TAG_KEY="stack-keep")
    assert code == 0, doc
    assert verdicts(doc)[stack][:2] == ("protected", "protect_tag")
    assert platform.instance_state(stack) == "running"


def test_the_deleters_reread_honours_the_stacks_protect_key(emptied_db, moto_reset):
    """Setup: a backend whose row renames its protect key; one orphan, tagged with the stack's key
    between classification and deletion. Shows: the deleter's re-read keeps it."""
    db = emptied_db
    add_backend(db, "aws-a", mode="delete", settings={"protect_tag_key": "platform-keep"})
    platform = MotoPlatform(db, "aws-a")
    vm = orphan(platform)
    platform.age_ledger()

    def tag_it(plan: Plan) -> bool:
        assert len(plan.deletes) == 1
        platform.ec2.create_tags(Resources=[vm], Tags=[{"Key": "stack-keep", "Value": "yes"}])
        return True

    settings = Settings.explicit(confirm_seconds=0,
                                 margin_seconds=0, aws_endpoint_url=moto_reset, protect_tag_key="stack-keep")
    pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                        delete_queue=InProcessQueue())
    run_cycle(pipeline, "aws-a", mode="delete", confirm=tag_it)

    assert platform.instance_state(vm) == "running"
