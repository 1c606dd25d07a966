"""The deploy commands of docs/DEPLOY.md, run with the real tools on a copy of
the repository's IaC in tmp_path (nothing is written to the repository):
``sam validate --lint``, ``sam build``, ``sam package`` / ``sam deploy`` against
a moto server, ``aws cloudformation deploy`` of the target-account roles against
moto, ``terraform init`` + ``validate`` for infra/aws.

Each test skips, saying why, when its tool is absent: sam from
``ORPHAN_CLEANUP_SAM`` or PATH; aws from PATH; terraform from PATH with an hashicorp/aws
provider mirror from ``ORPHAN_CLEANUP_TF_MIRROR`` or a few known folders (the
registry is not reachable from CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from infra import checks

REPO = checks.REPO
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-db-AbCdEf"
# Each function's own database secret (docs/DATABASE.md, "One role per function"), the default.
OWN_SECRETS = {fn: f"arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-{fn}-AbCdEf"
               for fn in ("lister", "classifier", "deleter")}
OWN_SECRETS_VAR = f"-var=function_database_url_secret_arns={json.dumps(OWN_SECRETS)}"
# Folders that may hold a filesystem mirror (<dir>/registry.terraform.io/hashicorp/aws).
TF_MIRROR_ROOTS = ("/opt/tf-plugins", "/usr/local/share/terraform/plugins", "/usr/share/terraform/plugins",
                   "~/.terraform.d/plugins", "~/.local/share/terraform/plugins")


def _sam() -> str:
    found = os.environ.get("ORPHAN_CLEANUP_SAM") or shutil.which("sam")
    if not found or not os.access(found, os.X_OK):
        pytest.skip("sam CLI not found: set ORPHAN_CLEANUP_SAM or put sam on PATH")
    return found


def _terraform_and_mirror() -> tuple[str, Path]:
    terraform = shutil.which("terraform")
    if not terraform:
        pytest.skip("terraform not found on PATH")
    candidates = [os.environ["ORPHAN_CLEANUP_TF_MIRROR"]] if os.environ.get("ORPHAN_CLEANUP_TF_MIRROR") else []
    candidates += TF_MIRROR_ROOTS
    for root in candidates:
        path = Path(root).expanduser()
        if (path / "registry.terraform.io" / "hashicorp" / "aws").is_dir():
            return terraform, path
    pytest.skip("no hashicorp/aws provider mirror: set ORPHAN_CLEANUP_TF_MIRROR to a folder holding "
                f"registry.terraform.io/hashicorp/aws (searched {', '.join(TF_MIRROR_ROOTS)})")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _sam_env(tmp_path: Path, endpoint: str | None = None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"),
           "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "LANG": "C.UTF-8"}
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def _lambda_zip(root: Path) -> None:
    """root/build/aws/lambda.zip, laid out by infra/package.py (no third-party wheels: offline)."""
    built = subprocess.run([sys.executable, str(REPO / "infra" / "package.py"), "--no-deps", "--target", "aws",
                            "--out", str(root / "build")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr


@pytest.fixture()
def stack(tmp_path: Path) -> Path:
    """template.yaml and the Lambda zip as `python infra/package.py` lays them
    out (without third-party wheels: offline, and the tools do not look inside)."""
    work = tmp_path / "stack"
    work.mkdir()
    shutil.copy(REPO / "template.yaml", work / "template.yaml")
    _lambda_zip(work)
    assert (work / "build" / "aws" / "lambda.zip").is_file()
    return work


# ------------------------------------------------------------------- SAM CLI


@pytest.mark.parametrize("template", ["template.yaml", "infra/aws-target-account/template.yaml"])
def test_sam_validate_lint_passes_and_catches_a_broken_template(tmp_path, template):
    sam = _sam()
    work = tmp_path / "validate"
    work.mkdir()
    shutil.copy(REPO / template, work / "template.yaml")
    ok = _run([sam, "validate", "--lint", "--template-file", "template.yaml"], work, _sam_env(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "is a valid SAM Template" in ok.stdout + ok.stderr
    # The same command fails on a template with a property its resource type lacks.
    broken = checks.load_template(REPO / template)
    role = next(r for r in broken["Resources"].values() if r["Type"] == "AWS::IAM::Role")
    role["Properties"]["NotAProperty"] = True
    (work / "template.yaml").write_text(json.dumps(broken))  # JSON is YAML
    bad = _run([sam, "validate", "--lint", "--template-file", "template.yaml"], work, _sam_env(tmp_path))
    assert bad.returncode != 0
    assert "NotAProperty" in bad.stdout + bad.stderr


def test_sam_build_copies_the_prebuilt_zip_and_points_every_function_at_it(tmp_path, stack):
    sam = _sam()
    result = _run([sam, "build"], stack, _sam_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Build Succeeded" in result.stdout + result.stderr
    built = stack / ".aws-sam" / "build"
    template = checks.load_template(built / "template.yaml")
    functions = {k: r for k, r in template["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
    assert set(functions) == {"ListerFunction", "ClassifierFunction", "DeleterFunction"}
    for name, fn in functions.items():
        # What sam package / sam deploy upload next: it must exist relative to the built template.
        code = (built / fn["Properties"]["CodeUri"]).resolve()
        assert code == (stack / "build" / "aws" / "lambda.zip").resolve(), name
    assert "CodeUri" not in template.get("Globals", {}).get("Function", {})


def test_sam_package_and_deploy_against_moto_up_to_the_change_set(tmp_path, stack, moto_reset):
    """The documented sequence (package.py, sam build, sam deploy) against moto.
    `sam package` uploads the zip and the template; `sam deploy` creates the
    change set of the whole stack. Executing it is where moto stops: its IAM
    Role model cannot read a Policies entry that is Fn::If ... AWS::NoValue
    (TypeError in moto/iam/models.py), so the test ends at the change set
    (--no-execute-changeset) and reads it back."""
    sam = _sam()
    # moto finds the bucket of a TemplateURL in the path only for a "localhost" host.
    endpoint = moto_reset.replace("127.0.0.1", "localhost")
    env = _sam_env(tmp_path, endpoint)
    boto3.client("s3", endpoint_url=moto_reset).create_bucket(Bucket="oc-artifacts")
    build = _run([sam, "build"], stack, env)
    assert build.returncode == 0, build.stdout + build.stderr

    package = _run([sam, "package", "--s3-bucket", "oc-artifacts", "--output-template-file", "packaged.yaml"],
                   stack, env)
    assert package.returncode == 0, package.stdout + package.stderr
    packaged = checks.load_template(stack / "packaged.yaml")
    uris = {r["Properties"]["CodeUri"] for r in packaged["Resources"].values()
            if r["Type"] == "AWS::Serverless::Function"}
    assert len(uris) == 1 and next(iter(uris)).startswith("s3://oc-artifacts/")
    key = next(iter(uris)).removeprefix("s3://oc-artifacts/")
    s3 = boto3.client("s3", endpoint_url=moto_reset)
    assert s3.head_object(Bucket="oc-artifacts", Key=key)["ContentLength"] == \
        (stack / "build" / "aws" / "lambda.zip").stat().st_size

    deploy = _run([sam, "deploy", "--stack-name", "oc-test", "--s3-bucket", "oc-artifacts",
                   "--capabilities", "CAPABILITY_IAM", "--no-execute-changeset", "--no-confirm-changeset",
                   "--parameter-overrides", *(f"{fn.title()}DatabaseUrlSecretArn={arn}"
                                              for fn, arn in OWN_SECRETS.items())], stack, env)
    out = deploy.stdout + deploy.stderr
    assert deploy.returncode == 0, out
    assert "Changeset created successfully" in out
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset)
    (summary,) = cfn.list_change_sets(StackName="oc-test")["Summaries"]
    changes = cfn.describe_change_set(StackName="oc-test", ChangeSetName=summary["ChangeSetId"])["Changes"]
    added = {c["ResourceChange"]["LogicalResourceId"]: c["ResourceChange"]["ResourceType"] for c in changes
             if c["ResourceChange"]["Action"] == "Add"}
    assert [k for k, t in added.items() if t == "AWS::Scheduler::Schedule"] == ["TickSchedule"]
    assert {"JobsQueue", "JobsDLQ", "ListingQueue", "DeleteQueue", "JobsQueuePolicy", "ListerFunction",
            "DeleterRole", "JobsDLQAlarm"} <= set(added)


def test_aws_cloudformation_deploy_of_the_target_account_roles_against_moto(tmp_path, moto_reset):
    """DEPLOY.md section 7, step 2, with the AWS CLI: moto evaluates the JSON-string
    delete policy (Fn::Sub, Fn::Join over ProtectTagKeys) as CloudFormation does."""
    aws = shutil.which("aws")
    if not aws:
        pytest.skip("aws CLI not found on PATH")
    lister, deleter = (f"arn:aws:iam::123456789012:role/oc-{n}" for n in ("lister", "deleter"))
    deploy = _run([aws, "cloudformation", "deploy", "--template-file",
                   str(REPO / "infra" / "aws-target-account" / "template.yaml"), "--stack-name", "oc-target",
                   "--capabilities", "CAPABILITY_NAMED_IAM", "--parameter-overrides", f"ListerRoleArn={lister}",
                   f"DeleterRoleArn={deleter}", "ExternalId=0123456789abcdef-external",
                   "ProtectTagKeys=orphan-cleanup-protect,platform-keep"], tmp_path, _sam_env(tmp_path, moto_reset))
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset)
    # (moto leaves Outputs empty on a stack made through a change set, so the roles are read directly.)
    assert cfn.describe_stacks(StackName="oc-target")["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    iam = boto3.client("iam", endpoint_url=moto_reset)
    trust = {r: iam.get_role(RoleName=r)["Role"]["AssumeRolePolicyDocument"]["Statement"]
             for r in ("orphan-cleanup-list", "orphan-cleanup-delete")}
    assert [s["Principal"]["AWS"] for s in trust["orphan-cleanup-list"]] == [lister]
    assert [s["Principal"]["AWS"] for s in trust["orphan-cleanup-delete"]] == [deleter]
    delete = iam.get_role_policy(RoleName="orphan-cleanup-delete", PolicyName="delete")["PolicyDocument"]
    delete = json.loads(delete) if isinstance(delete, str) else delete
    denies = [s for s in delete["Statement"] if s["Effect"] == "Deny"]
    assert [d["Condition"] for d in denies] == [{"Null": {"aws:ResourceTag/orphan-cleanup-protect": "false"}},
                                                {"Null": {"aws:ResourceTag/platform-keep": "false"}}]
    assert all(set(d["Action"]) == checks.DELETE_ACTIONS for d in denies)
    allows = {s["Sid"]: s for s in delete["Statement"] if s["Effect"] == "Allow"}
    assert set(allows) == {"DeleteOnlyRefTaggedResources", "SnapshotOnlyRefTaggedVolumes", "SnapshotsCarryTheRef",
                           "TagSnapshotsAsTheyAreCreated", "DeleteOnlySnapshotsTheDeleterTook"}
    # ec2:DeleteSnapshot only on a snapshot with the deleter's source tag, a volume id (SAFETY.md rule 15)
    assert allows["DeleteOnlySnapshotsTheDeleterTook"]["Action"] == "ec2:DeleteSnapshot"
    assert allows["DeleteOnlySnapshotsTheDeleterTook"]["Condition"] == {
        "StringLike": {"aws:ResourceTag/provider_ref": "????????????",
                       "aws:ResourceTag/orphan-cleanup-source": "vol-*"}}
    allow = allows["DeleteOnlyRefTaggedResources"]
    assert not any(r.endswith(":snapshot/*") for r in allow["Resource"])
    assert allow["Condition"] == {"StringLike": {"aws:ResourceTag/provider_ref": "????????????"}}
    assert all(r.startswith(("arn:aws:ec2:*:123456789012:", "arn:aws:elasticloadbalancing:*:123456789012:"))
               for r in allow["Resource"])
    assert allows["TagSnapshotsAsTheyAreCreated"]["Condition"] == {
        "StringEquals": {"ec2:CreateAction": "CreateSnapshot"},
        "StringLike": {"aws:RequestTag/provider_ref": "????????????", "aws:RequestTag/orphan-cleanup-source": "vol-*"}}
    assert iam.list_role_policies(RoleName="orphan-cleanup-list")["PolicyNames"] == ["describe"]


# ----------------------------------------------------------------- Terraform


def _terraform_work(tmp_path: Path, endpoint: str | None = None) -> tuple[str, Path, dict[str, str]]:
    """infra/aws copied to tmp_path/infra/aws (so its default lambda_zip,
    ../../build/aws/lambda.zip, is tmp_path/build/aws/lambda.zip), `terraform
    init` done with the provider from the local mirror."""
    terraform, mirror = _terraform_and_mirror()
    work = tmp_path / "infra" / "aws"
    shutil.copytree(REPO / "infra" / "aws", work, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    rc = tmp_path / "terraform.rc"
    rc.write_text(f'provider_installation {{\n  filesystem_mirror {{\n    path = "{mirror}"\n  }}\n}}\n')
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "TF_CLI_CONFIG_FILE": str(rc),
           "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    if endpoint:
        env |= {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    init = _run([terraform, "init", "-backend=false", "-input=false", "-no-color"], work, env, timeout=120)
    assert init.returncode == 0, init.stdout + init.stderr
    assert "Terraform has been successfully initialized" in init.stdout
    return terraform, work, env


def test_terraform_init_and_validate_infra_aws(tmp_path):
    terraform, work, env = _terraform_work(tmp_path)
    validate = _run([terraform, "validate", "-no-color"], work, env)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "The configuration is valid" in validate.stdout
    # Both stacks are formatted as `terraform fmt` writes them (no provider needed).
    for stack in ("aws", "gcp"):
        fmt = _run([terraform, "fmt", "-check", "-diff", "-no-color", str(REPO / "infra" / stack)], tmp_path, env)
        assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    # validate does fail: an argument the resource type does not have.
    (work / "broken.tf").write_text('resource "aws_sqs_queue" "broken" {\n  not_an_argument = 1\n}\n')
    broken = _run([terraform, "validate", "-no-color"], work, env)
    assert broken.returncode != 0
    assert "not_an_argument" in broken.stdout + broken.stderr


def test_terraform_plan_with_the_example_tfvars_against_moto(tmp_path, moto_reset):
    """The documented `cp terraform.tfvars.example terraform.tfvars` + plan: every
    variable the example sets exists, and the plan has one schedule, the tick."""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    _lambda_zip(tmp_path)
    shutil.copy(work / "terraform.tfvars.example", work / "terraform.tfvars")
    plan = _run([terraform, "plan", "-input=false", "-no-color", "-out", "tf.plan"], work, env)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    shown = _run([terraform, "show", "-json", "tf.plan"], work, env)
    assert shown.returncode == 0, shown.stderr
    changes = json.loads(shown.stdout)["resource_changes"]
    schedules = [c["address"] for c in changes if c["type"] == "aws_scheduler_schedule"]
    assert schedules == ["aws_scheduler_schedule.tick"]
    (tick,) = [c for c in changes if c["address"] == "aws_scheduler_schedule.tick"]
    assert json.loads(tick["change"]["after"]["target"][0]["input"]) == {}
    queues = {c["index"] for c in changes if c["address"].startswith("aws_sqs_queue.main[")}
    assert queues == {"jobs", "listing", "delete"}


@pytest.mark.slow
def test_terraform_apply_infra_aws_against_moto(tmp_path, moto_reset):
    """`terraform apply` of infra/aws against moto (about 80 s: the provider waits
    ~25 s for each queue's attributes), then the rendered IAM and queue policies."""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    _lambda_zip(tmp_path)
    apply = _run([terraform, "apply", "-auto-approve", "-input=false", "-no-color",
                  OWN_SECRETS_VAR,
                  '-var=protect_tag_keys=["orphan-cleanup-protect", "platform-keep"]'], work, env, timeout=300)
    assert apply.returncode == 0, apply.stdout[-3000:] + apply.stderr
    iam = boto3.client("iam", endpoint_url=moto_reset)
    deleter = iam.get_role_policy(RoleName="orphan-cleanup-deleter", PolicyName="deleter")["PolicyDocument"]
    assert [s["Condition"] for s in deleter["Statement"] if s["Effect"] == "Deny"] == [
        {"Null": {"aws:ResourceTag/orphan-cleanup-protect": "false"}},
        {"Null": {"aws:ResourceTag/platform-keep": "false"}}]
    sqs = boto3.client("sqs", endpoint_url=moto_reset)
    for queue, producer in (("jobs", "lister"), ("listing", "lister"), ("delete", "classifier")):
        url = sqs.get_queue_url(QueueName=f"orphan-cleanup-{queue}")["QueueUrl"]
        policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
        (only,) = [s for s in policy["Statement"] if s.get("Sid") == "OnlyTheProducerSends"]
        assert only["Condition"] == {"ArnNotLike": {
            "aws:PrincipalArn": f"arn:aws:iam::123456789012:role/orphan-cleanup-{producer}"}}
    lam = boto3.client("lambda", endpoint_url=moto_reset)
    mappings = {m["EventSourceArn"].rsplit(":", 1)[1]: m
                for m in lam.list_event_source_mappings()["EventSourceMappings"]}
    assert mappings["orphan-cleanup-jobs"]["FunctionArn"].endswith(":orphan-cleanup-lister")
    assert mappings["orphan-cleanup-jobs"]["BatchSize"] == 1
    lister = lam.get_function_configuration(FunctionName="orphan-cleanup-lister")
    assert lister["Runtime"] == "python3.11" and lister["Environment"]["Variables"]["JOBS_QUEUE_URL"].endswith(
        "/orphan-cleanup-jobs")


@pytest.mark.slow  # a real plan, ~10-20 s; infra/checks checks the same shapes statically in the default run
def test_terraform_plan_with_an_rds_managed_secret_and_iam_auth(tmp_path, moto_reset):
    """RDS-managed secrets (``rds!db-...``) and their KMS key, and IAM database auth: each
    function's role may decrypt with that key through Secrets Manager, and rds-db:connect
    as its own database user only, the one its DATABASE_USER names (docs/DATABASE.md, "One
    role per function"); database_roles = "shared" connects all three as database_iam_user.
    (The GetSecretValue grant holds values known only after apply.)"""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    _lambda_zip(tmp_path)
    rds = {fn: f"arn:aws:secretsmanager:us-east-1:123456789012:secret:rds!db-0a1b2c3d-{fn}-AbCdEf"
           for fn in ("lister", "classifier", "deleter")}
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    dbuser = "arn:aws:rds-db:us-east-1:123456789012:dbuser:db-ABCDEFGHIJKL01234567890123/"
    for extra, users in (([f"-var=function_database_url_secret_arns={json.dumps(rds)}"],
                          {fn: f"orphan_cleanup_{fn}" for fn in rds}),
                         (["-var=database_roles=shared", f"-var=database_url_secret_arn={rds['lister']}"],
                          {fn: "orphan_cleanup_runtime" for fn in rds})):
        plan = _run([terraform, "plan", "-input=false", "-no-color", "-out", "tf.plan", *extra,
                     f"-var=database_secret_kms_key_arn={key}",
                     "-var=database_iam_resource_id=db-ABCDEFGHIJKL01234567890123"], work, env)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        shown = _run([terraform, "show", "-json", "tf.plan"], work, env)
        changes = {c["address"]: c["change"]["after"] for c in json.loads(shown.stdout)["resource_changes"]}
        for fn, user in users.items():
            connect = json.loads(changes[f'aws_iam_role_policy.database_iam_auth["{fn}"]']["policy"])["Statement"]
            assert connect == [{"Sid": "ConnectAsItsOwnDatabaseUser", "Effect": "Allow", "Action": "rds-db:connect",
                                "Resource": dbuser + user}]
            decrypt = json.loads(changes[f'aws_iam_role_policy.secret_key["{fn}"]']["policy"])["Statement"]
            assert [(s["Action"], s["Resource"]) for s in decrypt] == [("kms:Decrypt", key)]
        console = subprocess.run([terraform, "console", "-no-color", *extra,
                                  "-var=database_iam_resource_id=db-ABCDEFGHIJKL01234567890123"],
                                 input="jsonencode(local.database_user)\n", cwd=work, env=env, capture_output=True,
                                 text=True, timeout=120)
        assert json.loads(json.loads(console.stdout.strip())) == users, console.stderr
    main = (work / "main.tf").read_text()
    assert "local.iam_auth ? { DATABASE_USER = local.database_user[each.key] } : {}" in main


@pytest.mark.slow  # a real plan, ~10-20 s; infra/checks checks the same shapes statically in the default run
def test_terraform_refuses_wildcard_role_names_and_scopes_assume_role(tmp_path, moto_reset):
    """A * in a target role's name, or anywhere in the redrive role, stops the plan with the
    variable's message; a fixed name with * for the account plans, and the organisation and
    accounts given become conditions of each function's sts:AssumeRole."""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    _lambda_zip(tmp_path)
    base = ["plan", "-input=false", "-no-color", OWN_SECRETS_VAR]
    for var, value in (("target_list_role_arn_pattern", "arn:aws:iam::*:role/*"),
                       ("target_delete_role_arn_pattern", "arn:aws:iam::*:role/orphan-cleanup-*"),
                       ("redrive_role_arn", "arn:aws:iam::*:role/ops-redrive")):
        refused = _run([terraform, *base, f"-var={var}={value}"], work, env)
        assert refused.returncode != 0, refused.stdout
        assert f"{var} must be" in " ".join((refused.stdout + refused.stderr).split()), refused.stderr
    # a * account without an organisation or accounts: the plan stops, naming them
    for var in ("target_list_role_arn_pattern", "target_delete_role_arn_pattern"):
        unscoped = _run([terraform, *base, f"-var={var}=arn:aws:iam::*:role/orphan-cleanup-x"], work, env)
        text = " ".join((unscoped.stdout + unscoped.stderr).split())
        assert unscoped.returncode != 0 and f"{var} names every account (*): set target_organization_id or " \
            "target_account_ids" in text, text
    fixed = _run([terraform, *base, "-var=target_delete_role_arn_pattern=arn:aws:iam::210987654321:role/oc-delete"],
                 work, env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    plan = _run([terraform, *base, "-out", "tf.plan",
                 "-var=target_list_role_arn_pattern=arn:aws:iam::*:role/orphan-cleanup-list",
                 "-var=target_delete_role_arn_pattern=arn:aws:iam::*:role/orphan-cleanup-delete",
                 "-var=target_organization_id=o-abcdef1234",
                 '-var=target_account_ids=["111111111111", "222222222222"]'], work, env)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    shown = _run([terraform, "show", "-json", "tf.plan"], work, env)
    changes = {c["address"]: c["change"]["after"] for c in json.loads(shown.stdout)["resource_changes"]}
    for fn, role in (("lister", "orphan-cleanup-list"), ("deleter", "orphan-cleanup-delete")):
        (statement,) = json.loads(changes[f'aws_iam_role_policy.assume_target["{fn}"]']["policy"])["Statement"]
        assert statement["Resource"] == f"arn:aws:iam::*:role/{role}"
        assert statement["Condition"] == {"StringEquals": {"aws:ResourceOrgID": "o-abcdef1234",
                                                           "aws:ResourceAccount": ["111111111111", "222222222222"]}}


def test_terraform_gives_each_function_its_own_database_secret(tmp_path, moto_reset):
    """One database role per function by default (docs/DATABASE.md, "One role per
    function"): each function reads its own secret (its DATABASE_URL_SECRET_ARN and the one
    secret its role may read are known after apply, so ``terraform console`` evaluates what
    both are made of); a function without its own secret stops the plan, naming it (no
    fallback to the shared secret); database_roles = "shared" is the explicit choice."""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    _lambda_zip(tmp_path)

    def console(*args: str) -> dict:
        done = subprocess.run([terraform, "console", "-no-color", *args], input="jsonencode(local.database_secret)\n",
                              cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(json.loads(done.stdout.strip()))

    assert console(OWN_SECRETS_VAR) == OWN_SECRETS
    assert console("-var=database_roles=shared", f"-var=database_url_secret_arn={SECRET_ARN}") == {
        fn: SECRET_ARN for fn in OWN_SECRETS}
    main = (work / "main.tf").read_text() + (work / "iam.tf").read_text()
    assert "DATABASE_URL_SECRET_ARN = local.database_secret[each.key]" in main
    assert "resources = [local.database_secret[each.key]]" in main
    two = {fn: arn for fn, arn in OWN_SECRETS.items() if fn != "deleter"}
    for args, named in (([f"-var=database_url_secret_arn={SECRET_ARN}", f"-var=function_database_url_secret_arns="
                          f"{json.dumps(two)}"], 'function_database_url_secret_arns["deleter"]'),
                        (["-var=database_roles=shared"], "database_url_secret_arn")):
        refused = _run([terraform, "plan", "-input=false", "-no-color", *args], work, env)
        text = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode != 0 and f"needs {named}" in text, text
    refused = _run([terraform, "plan", "-input=false", "-no-color",
                    '-var=function_database_url_secret_arns={"tick": "x"}'], work, env)
    assert refused.returncode != 0 and "function_database_url_secret_arns" in refused.stdout + refused.stderr


@pytest.mark.slow  # a real plan, ~10-20 s; infra/checks checks the same shapes statically in the default run
def test_terraform_validations_refuse_what_sams_patterns_refuse(tmp_path, moto_reset):
    """A * in a secret ARN, a Slack secret or KMS key that is no such ARN: the plan stops
    with the variable's message, as SAM's AllowedPattern refuses the same values
    (infra/checks compares the two regexes on samples)."""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    wildcard = "arn:aws:secretsmanager:us-east-1:123456789012:secret:*"
    for var, value in (("function_database_url_secret_arns", json.dumps({**OWN_SECRETS, "deleter": wildcard})),
                       ("database_url_secret_arn", wildcard), ("slack_webhook_secret_arn", wildcard),
                       ("slack_webhook_secret_arn", "https://hooks.slack.example/x"),
                       ("database_secret_kms_key_arn", "arn:aws:kms:us-east-1:123456789012:key/*"),
                       ("logs_kms_key_arn", "alias/aws/logs"), ("queue_kms_key_arn", "arn:aws:kms:us-east-1:1:key/x"),
                       ("max_mode", "off")):
        refused = _run([terraform, "plan", "-input=false", "-no-color", OWN_SECRETS_VAR, f"-var={var}={value}"],
                       work, env)
        assert refused.returncode != 0, (var, refused.stdout)
        assert f'variable "{var}"' in refused.stderr and "validation rule" in refused.stderr, (var, refused.stderr)


def test_terraform_refuses_a_delete_mode_under_a_report_ceiling(tmp_path, moto_reset):
    """mode = "delete" with the default max_mode ("report"): the plan stops and says both
    (docs/SAFETY.md rule 8), rather than a stack that reports only while it says delete."""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    refused = _run([terraform, "plan", "-input=false", "-no-color", OWN_SECRETS_VAR, "-var=mode=delete"], work, env)
    text = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0 and 'mode = "delete" needs max_mode = "delete"' in text, text


@pytest.mark.slow  # a real plan, ~10-20 s; infra/checks checks the same shapes statically in the default run
def test_terraform_plan_signs_code_and_keeps_the_log_groups(tmp_path, moto_reset):
    """code_signing_config_arn reaches every function; the log groups are kept by destroy. (The
    deleter's policy names queue ARNs known only after apply: its instance-only
    DescribeInstanceAttribute is checked statically, tests/unit/test_deploy_terraform.py.)"""
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    _lambda_zip(tmp_path)
    csc = "arn:aws:lambda:us-east-1:123456789012:code-signing-config:csc-0a1b2c3d4e5f67890"
    plan = _run([terraform, "plan", "-input=false", "-no-color", "-out", "tf.plan",
                 OWN_SECRETS_VAR, f"-var=code_signing_config_arn={csc}", "-var=max_mode=delete",
                 '-var=protect_tag_keys=["platform-keep", "orphan-cleanup-protect"]'], work, env)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    shown = _run([terraform, "show", "-json", "tf.plan"], work, env)
    changes = {c["address"]: c["change"]["after"] for c in json.loads(shown.stdout)["resource_changes"]}
    for fn in ("lister", "classifier", "deleter"):
        assert changes[f'aws_lambda_function.fn["{fn}"]']["code_signing_config_arn"] == csc
        assert changes[f'aws_cloudwatch_log_group.fn["{fn}"]']["skip_destroy"] is True
    # the ceilings (docs/SAFETY.md rules 8 and 16) in every function's environment (its queue URLs
    # are known after apply: terraform console reads the two values)
    console = subprocess.run([terraform, "console", "-no-color", OWN_SECRETS_VAR, "-var=max_mode=delete",
                              '-var=protect_tag_keys=["platform-keep", "orphan-cleanup-protect"]'],
                             input="jsonencode([nonsensitive(local.environment.ORPHAN_CLEANUP_MAX_MODE), "
                                   "nonsensitive(local.environment.ORPHAN_CLEANUP_PROTECT_TAG_KEY)])\n",
                             cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(json.loads(console.stdout.strip())) == ["delete", "platform-keep"], console.stderr
    assert "variables = merge(local.environment," in (work / "main.tf").read_text()
    refused = _run([terraform, "plan", "-input=false", "-no-color", OWN_SECRETS_VAR,
                    "-var=code_signing_config_arn=arn:aws:iam::123456789012:role/x"], work, env)
    assert refused.returncode != 0 and "code_signing_config_arn" in refused.stdout + refused.stderr
