"""infra/ Terraform, offline: every file parses with python-hcl2, every
reference is declared, every variable/output is documented, and the AWS IAM
documents keep EC2 writes behind the ref-tag condition."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from infra import checks

TF_DIRS = {d.name: d for d in checks.TERRAFORM_DIRS}


@pytest.fixture(scope="module")
def modules() -> dict[str, checks.Module]:
    return {name: checks.Module.load(path) for name, path in TF_DIRS.items()}


def test_every_tf_file_parses(modules):
    for name, path in TF_DIRS.items():
        files = sorted(p.name for p in path.glob("*.tf"))
        assert files and sorted(modules[name].files) == files


@pytest.mark.parametrize("stack", sorted(TF_DIRS))
def test_references_are_declared_and_variables_used(modules, stack):
    assert checks.terraform_reference_problems(modules[stack]) == []


@pytest.mark.parametrize("stack", sorted(TF_DIRS))
def test_every_variable_and_output_has_a_description(modules, stack):
    assert checks.terraform_description_problems(modules[stack]) == []
    assert any(True for _ in modules[stack].blocks("variable"))
    assert any(True for _ in modules[stack].blocks("output"))


def test_infra_readme_lists_every_variable_and_output(modules):
    readme = (checks.REPO / "infra" / "README.md").read_text()
    for stack, module in modules.items():
        for kind in ("variable", "output"):
            for name, _ in module.blocks(kind):
                assert f"| `{name}` |" in readme, f"{stack} {kind} {name} is not in infra/README.md"


BROKEN = {
    "main.tf": '''
terraform {
  required_providers {
    google = { source = "hashicorp/google" }
  }
}
variable "project_id" {
  description = "p"
  type        = string
}
variable "unused" {
  type = string
}
locals {
  name = "oc-${var.prefix}"
}
resource "google_pubsub_topic" "listing" {
  project = var.project_id
  name    = local.name
  labels  = { role = "roles/compute.instances.list" }
}
resource "google_pubsub_subscription" "push" {
  topic = google_pubsub_topic.delete.id
  name  = "${local.missing}-${module.queues.name}"
  filter = "attributes.kind = \\"google_fake.literal\\""
  project = data.google_project.this.number
}
output "topic" {
  value = google_pubsub_topic.listing.id
}
''',
}


def test_reference_checker_catches_missing_declarations():
    module = checks.Module.from_text(BROKEN)
    assert sorted(checks.terraform_reference_problems(module)) == sorted([
        "<memory>: undeclared var.prefix",
        "<memory>: undeclared local.missing",
        "<memory>: undeclared module.queues",
        "<memory>: undeclared data.google_project.this",
        "<memory>: undeclared resource google_pubsub_topic.delete",
        "<memory>: variable unused is never used",
    ])
    assert sorted(checks.terraform_description_problems(module)) == [
        "<memory>: output topic has no description", "<memory>: variable unused has no description"]


def test_string_literals_are_not_mistaken_for_references():
    text = checks.code_text('"roles/${var.role}.x google_a.b ${local.y == "var.z" ? 1 : 2}"')
    assert "var.role" in text and "local.y" in text
    assert "google_a.b" not in text and "var.z" not in text


# --------------------------------------------------------------------- AWS


def test_aws_iam_documents_keep_ec2_writes_behind_the_tag(modules):
    assert checks.terraform_iam_problems(modules["aws"]) == []
    docs = checks.terraform_policy_documents(modules["aws"])
    condition = next(s for s in docs["deleter"] if s["Sid"] == "DeleteOnlyRefTaggedResources")["Condition"]
    assert condition == {"StringLike": {"aws:ResourceTag/${var.tag_key}": ["????????????"]}}


def _mutated_aws(modules, old: str, new: str) -> checks.Module:
    files = {name: (checks.TERRAFORM_DIRS[1] / name).read_text() for name in modules["aws"].files}
    assert old in files["iam.tf"]
    files["iam.tf"] = files["iam.tf"].replace(old, new, 1)
    return checks.Module.from_text(files)


def test_aws_unconditioned_delete_is_caught(modules):
    broken = _mutated_aws(modules, '''    condition {
      test     = "StringLike"
      variable = "aws:ResourceTag/${var.tag_key}"''', '''    condition {
      test     = "StringLikeIfExists"
      variable = "aws:ResourceTag/${var.tag_key}"''')
    problems = checks.terraform_iam_problems(broken)
    assert "aws_iam_policy_document.deleter: lacks ec2:TerminateInstances under the tag condition" in problems
    assert len([p for p in problems if "is not limited" in p]) == 7


def test_aws_delete_in_another_document_or_managed_policy_is_caught(modules):
    broken = _mutated_aws(modules, '''    sid       = "PublishListingBatches"
    actions   = ["sqs:SendMessage"]''', '''    sid       = "PublishListingBatches"
    actions   = ["sqs:SendMessage", "ec2:DeleteVolume"]''')
    assert checks.terraform_iam_problems(broken) == [
        "aws_iam_policy_document.lister: ec2:DeleteVolume (statement PublishListingBatches) is not "
        "limited to resources tagged ${var.tag_key}"]
    attached = checks.Module.from_text({"x.tf": '''
resource "aws_iam_role_policy_attachment" "vpc" {
  role       = "r"
  policy_arn = "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
}
data "aws_iam_policy_document" "d" {
  dynamic "statement" {
    for_each = [1]
    content {
      actions = ["ec2:DeleteVolume"]
    }
  }
}
'''})
    problems = checks.terraform_iam_problems(attached)
    assert "aws_iam_role_policy_attachment.vpc: managed policies are not allowed on the function roles" in problems
    assert any("statement dynamic statement" in p for p in problems)


def test_aws_queues_event_sources_and_schedules(modules):
    aws = modules["aws"]
    resources = {(t, n): body for t, n, body in aws.labelled("resource")}
    main = resources[("aws_sqs_queue", "main")]
    assert main["visibility_timeout_seconds"] == "${6 * local.functions[each.value.consumer].timeout}"
    assert "maxReceiveCount" in main["redrive_policy"]
    esm = resources[("aws_lambda_event_source_mapping", "queue")]
    assert esm["function_response_types"] == ['"ReportBatchItemFailures"']
    assert esm["scaling_config"][0]["maximum_concurrency"] == "${each.value.max_concurrency}"
    schedule = resources[("aws_scheduler_schedule", "backend")]
    assert schedule["for_each"] == "${var.backends}"
    assert schedule["target"][0]["input"] == "${jsonencode({backend = each.key})}"
    fn = resources[("aws_lambda_function", "fn")]
    assert fn["architectures"] == ['"arm64"'] and fn["runtime"] == "${var.runtime}"
    assert fn["environment"][0]["variables"] == "${local.environment}"
    assert sorted(checks.terraform_literals(aws, "handler")) == sorted(checks.AWS_HANDLERS.values())


def test_aws_stack_validates_with_terraform_when_the_provider_is_local(tmp_path):
    """`terraform validate` needs the aws provider; this machine may carry a
    plugin mirror in /opt/tf-plugins (the registry is not reachable)."""
    plugins = Path("/opt/tf-plugins/registry.terraform.io/hashicorp/aws")
    if not shutil.which("terraform") or not plugins.is_dir():
        pytest.skip("terraform or a local aws provider mirror is not available")
    work = tmp_path / "aws"
    shutil.copytree(TF_DIRS["aws"], work, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path), "TF_IN_AUTOMATION": "1",
           "CHECKPOINT_DISABLE": "1"}
    init = subprocess.run(["terraform", "init", "-backend=false", "-input=false", "-no-color",
                           "-plugin-dir=/opt/tf-plugins"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)
    assert init.returncode == 0, init.stdout + init.stderr
    validate = subprocess.run(["terraform", "validate", "-no-color"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)
    assert validate.returncode == 0, validate.stdout + validate.stderr


# --------------------------------------------------------------------- GCP


def test_gcp_functions_topics_and_schedules(modules):
    gcp = modules["gcp"]
    resources = {(t, n): body for t, n, body in gcp.labelled("resource")}
    assert sorted(checks.terraform_literals(gcp, "entry_point")) == sorted(checks.GCP_ENTRY_POINTS)
    service = resources[("google_cloudfunctions2_function", "fn")]["service_config"][0]
    secret_env = service["secret_environment_variables"][0]
    assert secret_env["key"] == '"DATABASE_URL"'
    assert "DATABASE_URL" not in str(service["environment_variables"])
    push = resources[("google_pubsub_subscription", "push")]
    assert push["dead_letter_policy"][0]["max_delivery_attempts"] == "${var.max_delivery_attempts}"
    assert "oidc_token" in push["push_config"][0]
    job = resources[("google_cloud_scheduler_job", "backend")]
    assert job["for_each"] == "${var.backends}"
    assert job["http_target"][0]["body"] == "${base64encode(jsonencode({backend = each.key}))}"
    assert "oidc_token" in job["http_target"][0]


def test_gcp_custom_roles_are_minimal(modules):
    gcp = modules["gcp"]
    perms = {}
    for parsed in gcp.files.values():
        for block in parsed.get("locals", []):
            for key in ("lister_permissions", "deleter_permissions"):
                if key in block:
                    perms[key] = {checks.unquote(p) for p in block[key]}
    kinds = ("instances", "disks", "addresses")
    identity = {"compute.projects.get"}  # DESIGN §5 rule 11, before listing and before deleting
    assert perms["lister_permissions"] == {f"compute.{k}.list" for k in kinds} | identity
    assert perms["deleter_permissions"] == ({f"compute.{k}.{v}" for k in kinds for v in ("get", "delete")}
                                            | {"compute.zoneOperations.get", "compute.regionOperations.get"}
                                            | identity)
