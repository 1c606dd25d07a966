"""infra/ Terraform, offline: every file parses with python-hcl2, every
reference is declared, every variable/output is documented, and the AWS IAM
documents keep EC2 writes behind the ref-tag condition."""

from __future__ import annotations

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
    # every delete of that statement: DeleteSnapshot has a statement of its own
    assert len([p for p in problems if "is not limited" in p]) == len(checks.DELETE_ACTIONS - {"ec2:DeleteSnapshot"})


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


def test_aws_queues_event_sources_and_the_one_schedule(modules):
    aws = modules["aws"]
    assert checks.aws_stack_problems(aws) == []
    resources = {(t, n): body for t, n, body in aws.labelled("resource")}
    main = resources[("aws_sqs_queue", "main")]
    assert main["visibility_timeout_seconds"] == "${6 * local.functions[each.value.consumer].timeout}"
    assert "maxReceiveCount" in main["redrive_policy"]
    esm = resources[("aws_lambda_event_source_mapping", "queue")]
    assert esm["function_response_types"] == ['"ReportBatchItemFailures"']
    assert esm["scaling_config"][0]["maximum_concurrency"] == "${each.value.max_concurrency}"
    schedules = [n for t, n in resources if t == "aws_scheduler_schedule"]
    assert schedules == ["tick"]
    tick = resources[("aws_scheduler_schedule", "tick")]
    assert "for_each" not in tick
    assert tick["target"][0]["input"] == "${jsonencode({})}"
    assert "backends" not in {n for n, _ in aws.blocks("variable")}
    fn = resources[("aws_lambda_function", "fn")]
    assert fn["architectures"] == ['"arm64"'] and fn["runtime"] == "${var.runtime}"
    assert dict(aws.blocks("variable"))["runtime"]["default"] == '"python3.11"'
    # each function's own database secret and user (docs/DATABASE.md, "One role per function")
    assert fn["environment"][0]["variables"] == (
        "${merge(local.environment, {DATABASE_URL_SECRET_ARN = local.database_secret[each.key]}, "
        "local.iam_auth ? {DATABASE_USER = local.database_user[each.key]} : {})}")
    assert checks.aws_least_privilege_problems(aws) == []
    assert sorted(checks.terraform_literals(aws, "handler")) == sorted(checks.AWS_HANDLERS.values())


def test_aws_protect_keys_become_one_deny_each(modules):
    deleter = checks.terraform_policy_documents(modules["aws"])["deleter"]
    (deny,) = [s for s in deleter if s["Effect"] == "Deny"]
    assert deny["ForEach"] == "${var.protect_tag_keys}"
    assert deny["Condition"] == {"Null": {"aws:ResourceTag/${statement.value}": ["false"]}}
    assert set(deny["Action"]) == checks.DELETE_ACTIONS and deny["Resource"] == ["*"]
    variables = dict(modules["aws"].blocks("variable"))
    assert variables["protect_tag_keys"]["default"] == ['"orphan-cleanup-protect"']
    assert "protect_tag_key" not in variables and "target_role_arn_pattern" not in variables
    assert {"target_list_role_arn_pattern", "target_delete_role_arn_pattern", "lister_max_concurrency",
            "queue_kms_key_arn"} <= set(variables)


@pytest.mark.parametrize("old, new, problem", [
    ("input    = jsonencode({})", 'input    = jsonencode({ backend = "aws-prod" })',
     """aws: the schedule's input is '${jsonencode({backend = "aws-prod"})}', expected {} (the tick)"""),
    ('resource "aws_scheduler_schedule" "tick" {', 'resource "aws_scheduler_schedule" "tick" {\n  for_each = {}',
     "aws: aws_scheduler_schedule.tick is repeated (for_each); expected one tick"),
    ("      batch_size        = 1\n      max_concurrency   = var.lister_max_concurrency",
     "      batch_size        = 10\n      max_concurrency   = var.lister_max_concurrency",
     "aws: the jobs queue must feed the lister one job at a time, capped by lister_max_concurrency"),
    ("    for_each = var.protect_tag_keys", '    for_each = ["orphan-cleanup-protect"]',
     "aws: the deleter has no Deny of the deletes per entry of var.protect_tag_keys"),
    ("values   = concat([aws_iam_role.fn[statement.value].arn]", 'values   = concat([aws_iam_role.fn["deleter"].arn]',
     "aws: no queue policy Deny of sqs:SendMessage for principals other than the producer"),
    ('      producer          = "classifier"', '      producer          = "deleter"',
     "aws: local.queues.delete is not consumed by deleter and produced by classifier"),
])
def test_aws_shape_mistakes_are_caught(modules, old, new, problem):
    files = {name: (TF_DIRS["aws"] / name).read_text() for name in modules["aws"].files}
    (name,) = [n for n, text in files.items() if old in text]
    files[name] = files[name].replace(old, new, 1)
    assert checks.aws_stack_problems(checks.Module.from_text(files)) == [problem]


def test_a_dynamic_allow_statement_is_still_unreadable():
    dynamic_allow = checks.Module.from_text({"x.tf": """
data "aws_iam_policy_document" "deleter" {
  dynamic "statement" {
    for_each = var.keys
    content {
      effect  = "Allow"
      actions = ["ec2:TerminateInstances"]
    }
  }
}
"""})
    assert checks.terraform_policy_documents(dynamic_allow)["deleter"] == [
        {"Sid": "dynamic statement", "Effect": "Allow", "Action": "*"}]


# --------------------------------------------------------------------- GCP


def test_gcp_functions_topics_and_the_one_scheduler_job(modules):
    gcp = modules["gcp"]
    assert checks.gcp_stack_problems(gcp) == []
    resources = {(t, n): body for t, n, body in gcp.labelled("resource")}
    assert sorted(checks.terraform_literals(gcp, "entry_point")) == sorted(checks.GCP_ENTRY_POINTS)
    service = resources[("google_cloudfunctions2_function", "fn")]["service_config"][0]
    secret_env = service["secret_environment_variables"][0]
    assert secret_env["key"] == '"DATABASE_URL"'
    assert "DATABASE_URL" not in str(service["environment_variables"])
    push = resources[("google_pubsub_subscription", "push")]
    assert push["dead_letter_policy"][0]["max_delivery_attempts"] == "${var.max_delivery_attempts}"
    assert "oidc_token" in push["push_config"][0]
    assert push["ack_deadline_seconds"] >= 540  # the lister's timeout
    assert [n for t, n in resources if t == "google_cloud_scheduler_job"] == ["tick"]
    job = resources[("google_cloud_scheduler_job", "tick")]
    assert "for_each" not in job
    assert job["http_target"][0]["body"] == "${base64encode(jsonencode({}))}"
    assert "oidc_token" in job["http_target"][0]
    assert resources[("google_pubsub_topic", "dead_letter")]["for_each"] == '${toset(["jobs", "listing", "delete"])}'
    variables = dict(gcp.blocks("variable"))
    assert "backends" not in variables
    assert variables["runtime"]["default"] == '"python311"'
    assert variables["pubsub_kms_key_name"]["default"] is None
    assert resources[("google_pubsub_topic", "jobs")]["kms_key_name"] == "${local.pubsub_kms_key}"


@pytest.mark.parametrize("file, old, new, problem", [
    ("scheduler.tf", "body        = base64encode(jsonencode({}))",
     'body        = base64encode(jsonencode({ backend = "gcp-prod" }))',
     """gcp: the scheduler job posts '${base64encode(jsonencode({backend = "gcp-prod"}))}', expected {} (the tick)"""),
    ("iam.tf", 'topic   = google_pubsub_topic.jobs.name\n  role    = "roles/pubsub.publisher"\n'
     '  member  = google_service_account.fn["lister"].member',
     'topic   = google_pubsub_topic.jobs.name\n  role    = "roles/pubsub.publisher"\n'
     '  member  = google_service_account.push.member',
     "gcp: publishers of topic jobs are ['${google_service_account.push.member}'], expected only the lister's account"),
    ("iam.tf", 'name     = google_cloudfunctions2_function.fn["lister"].service_config[0].service\n'
     '  role     = "roles/run.invoker"\n  member   = google_service_account.jobs_push.member',
     'name     = google_cloudfunctions2_function.fn["deleter"].service_config[0].service\n'
     '  role     = "roles/run.invoker"\n  member   = google_service_account.jobs_push.member',
     "gcp: jobs_push must be run.invoker on the lister's service only"),
    ("pubsub.tf", "      invoker  = google_service_account.jobs_push", "      invoker  = google_service_account.push",
     "gcp: listing jobs are not pushed with the dedicated jobs_push account"),
    ("pubsub.tf", "ack_deadline_seconds       = 600", "ack_deadline_seconds       = 300",
     "gcp: push ack deadline 300 s < the lister's 540 s"),
    ("main.tf", "      JOBS_TOPIC                      = google_pubsub_topic.jobs.id\n", "",
     "gcp: the functions' environment lacks JOBS_TOPIC"),
])
def test_gcp_shape_mistakes_are_caught(modules, file, old, new, problem):
    files = {name: (TF_DIRS["gcp"] / name).read_text() for name in modules["gcp"].files}
    assert old in files[file]
    files[file] = files[file].replace(old, new, 1)
    assert checks.gcp_stack_problems(checks.Module.from_text(files)) == [problem]


def test_gcp_custom_roles_are_minimal(modules):
    gcp = modules["gcp"]
    perms = {}
    for parsed in gcp.files.values():
        for block in parsed.get("locals", []):
            for key in ("lister_permissions", "deleter_permissions"):
                if key in block:
                    perms[key] = {checks.unquote(p) for p in block[key]}
    kinds = ("instances", "disks", "addresses", "forwardingRules", "images")
    identity = {"compute.projects.get"}  # SAFETY.md rule 11, before listing and before deleting
    # snapshots listed past retain_snapshots_days, taken with snapshot_before_delete
    snapshots = {f"compute.snapshots.{v}" for v in ("create", "get", "list", "delete", "setLabels")}
    assert perms["lister_permissions"] == {f"compute.{k}.list" for k in kinds} | identity | {"compute.snapshots.list"}
    # the deleter reads by numeric id (a list filtered on it) and holds_instance lists a
    # retry leak's VM: .list of every kind
    assert perms["deleter_permissions"] == ({f"compute.{k}.{v}" for k in kinds for v in ("get", "list", "delete")}
                                            | {"compute.zoneOperations.get", "compute.regionOperations.get",
                                               "compute.globalOperations.get", "compute.disks.createSnapshot"}
                                            | snapshots | identity)
    # and exactly what the code calls, derived from it
    assert checks.gcp_permission_problems(gcp) == []


def _gcp_with(modules, file: str, old: str, new: str) -> checks.Module:
    files = {name: (TF_DIRS["gcp"] / name).read_text() for name in modules["gcp"].files}
    assert old in files[file], old
    files[file] = files[file].replace(old, new, 1)
    return checks.Module.from_text(files)


def test_the_gcp_permissions_come_from_the_calls_the_code_makes():
    needed, unknown = checks.function_permissions()
    assert unknown == []
    # holds_instance: an aggregatedList of instances; a read by id: a list filtered on it
    assert {"compute.instances.list", "compute.disks.list", "compute.addresses.list",
            "compute.snapshots.list"} <= needed["deleter"]
    assert not {p for p in needed["lister"] if p.rsplit(".", 1)[1] in ("delete", "create", "createSnapshot")}


@pytest.mark.parametrize("old, new, problem", [
    # every GCP retry-leak delete was skipped: holds_instance's aggregatedList refused
    ('    "compute.instances.list",\n    "compute.projects.get",\n    "compute.regionOperations.get",',
     '    "compute.projects.get",\n    "compute.regionOperations.get",',
     "gcp: the deleter role lacks compute.instances.list, which its code calls"),
    ('    "compute.addresses.delete",\n', '    "compute.addresses.delete",\n    "compute.instances.setLabels",\n',
     "gcp: the deleter role grants compute.instances.setLabels, which its code never calls"),
])
def test_a_gcp_role_unlike_the_code_is_caught(modules, old, new, problem):
    assert problem in checks.gcp_permission_problems(_gcp_with(modules, "iam.tf", old, new))


def test_gcp_least_privilege(modules):
    assert checks.gcp_least_privilege_problems(modules["gcp"]) == []


@pytest.mark.parametrize("file, old, new, problem", [
    ("variables.tf", 'default     = "per-function"', 'default     = "shared"',
     'gcp: variable database_roles must default to "per-function"'),
    ("iam.tf", "secret_id = google_secret_manager_secret.database_url[local.database_secret[each.key]].secret_id",
     'secret_id = google_secret_manager_secret.database_url["lister"].secret_id',
     "gcp: a function may read another function's database secret"),
    # one push account invoking both the classifier and the deleter
    ("pubsub.tf", 'invoker  = google_service_account.push["deleter"]',
     'invoker  = google_service_account.push["classifier"]',
     "gcp: topic delete is not pushed with the deleter's own push account"),
    ("iam.tf", "member   = google_service_account.push[each.value].member",
     'member   = google_service_account.push["classifier"].member',
     "gcp: push_invoker: a push account invokes another function than its own"),
    # cloudsql.client on every instance of the project
    ("iam.tf", '  condition {\n    title      = "orphan-cleanup ledger instance"',
     '  dynamic "unconditioned" {\n    title      = "orphan-cleanup ledger instance"',
     "gcp: google_project_iam_member.cloud_sql_client is not conditioned on the ledger's instance"),
    ("logging.tf", "prevent_destroy = true", "prevent_destroy = false",
     "gcp: terraform destroy would delete the log bucket (no prevent_destroy)"),
    ("main.tf", "ORPHAN_CLEANUP_MAX_MODE         = var.max_mode", 'ORPHAN_CLEANUP_MAX_MODE         = "delete"',
     "gcp: the functions' environment lacks ORPHAN_CLEANUP_MAX_MODE = var.max_mode"),
])
def test_gcp_least_privilege_mistakes_are_caught(modules, file, old, new, problem):
    assert problem in checks.gcp_least_privilege_problems(_gcp_with(modules, file, old, new))


def test_managed_database_settings_reach_the_functions(modules):
    aws, gcp = modules["aws"], modules["gcp"]
    aws_locals = dict(aws.blocks("locals"))
    assert 'local.iam_auth ? {DATABASE_IAM_AUTH = "true"} : {}' in str(aws_locals["environment"])
    assert aws_locals["iam_auth"] == "${var.database_iam_resource_id != null}"
    gcp_locals = dict(gcp.blocks("locals"))
    for variable in ("CLOUD_SQL_INSTANCE", "CLOUD_SQL_IP_TYPE", "CLOUD_SQL_IAM_AUTH"):
        assert variable in str(gcp_locals["environment"])
    assert "DATABASE_USER" in str(gcp_locals["function_environment"])
    resources = {(t, n): body for t, n, body in gcp.labelled("resource")}
    service = resources[("google_cloudfunctions2_function", "fn")]["service_config"][0]
    assert service["environment_variables"] == "${local.function_environment[each.key]}"
    assert resources[("google_project_iam_member", "cloud_sql_client")]["role"] == '"roles/cloudsql.client"'
    assert resources[("google_project_iam_member", "cloud_sql_instance_user")]["role"] == \
        '"roles/cloudsql.instanceUser"'


# ------------------------------------------------------------------ role patterns


def test_aws_role_variables_refuse_wildcard_role_names(modules):
    assert checks.terraform_role_pattern_problems(modules["aws"]) == []


@pytest.mark.parametrize("old, new, problem", [
    # a * back in the role name's characters
    ('iam::([0-9]{12}|\\\\*):role/[A-Za-z0-9+=,.@_/-]+$", var.target_list_role_arn_pattern',
     'iam::([0-9]{12}|\\\\*):role/[A-Za-z0-9+=,.@_/*-]+$", var.target_list_role_arn_pattern',
     "variable target_list_role_arn_pattern validation: accepts 'arn:aws:iam::*:role/*'"),
    # a * for the account of the redrive role
    ('iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$", var.redrive_role_arn',
     'iam::([0-9]{12}|\\\\*):role/[A-Za-z0-9+=,.@_/-]+$", var.redrive_role_arn',
     "variable redrive_role_arn validation: accepts 'arn:aws:iam::*:role/ops-redrive'"),
    ('        variable = "aws:ResourceOrgID"', '        variable = "aws:PrincipalOrgID"',
     "aws_iam_policy_document.assume_target: no aws:ResourceOrgID condition"),
])
def test_aws_role_variable_mistakes_are_caught(modules, old, new, problem):
    files = {name: (TF_DIRS["aws"] / name).read_text() for name in modules["aws"].files}
    (name,) = [n for n, text in files.items() if old in text]
    files[name] = files[name].replace(old, new, 1)
    assert problem in checks.terraform_role_pattern_problems(checks.Module.from_text(files))


def test_a_role_variable_without_validation_is_caught(modules):
    files = {name: (TF_DIRS["aws"] / name).read_text() for name in modules["aws"].files}
    start = files["variables.tf"].index('variable "redrive_role_arn"')
    block = files["variables.tf"][start:].split("\n}\n", 1)[0]
    files["variables.tf"] = files["variables.tf"].replace(
        block, block.split("\n\n  validation", 1)[0])
    assert checks.terraform_role_pattern_problems(checks.Module.from_text(files)) == [
        "variable redrive_role_arn: no validation with one regex"]


def test_aws_dlqs_logs_instance_attribute_and_code_signing(modules):
    aws = modules["aws"]
    resources = {(t, n): body for t, n, body in aws.labelled("resource")}
    assert resources[("aws_cloudwatch_log_group", "fn")]["skip_destroy"] is True
    assert resources[("aws_lambda_function", "fn")]["code_signing_config_arn"] == "${var.code_signing_config_arn}"
    deleter = checks.terraform_policy_documents(aws)["deleter"]
    (read,) = [s for s in deleter if s["Sid"] == "ReadTerminationProtection"]
    assert (read["Action"], read["Resource"]) == (["ec2:DescribeInstanceAttribute"], ["${local.ec2_arn}:instance/*"])
    assert all("ec2:DescribeInstanceAttribute" not in s["Action"] for s in deleter if s["Resource"] == ["*"])


@pytest.mark.parametrize("old, new, problem", [
    ('      sid       = "NobodySendsDeadLetters"', '      sid       = "SomebodySendsDeadLetters"',
     "aws: no queue policy Deny of sqs:SendMessage on the redrive DLQs for every principal"),
    ('    resources = ["${local.ec2_arn}:instance/*"]', '    resources = ["*"]',
     'aws_iam_policy_document.deleter: ec2:DescribeInstanceAttribute on "*"; only instance ARNs'),
])
def test_aws_dead_letter_and_instance_attribute_mistakes_are_caught(modules, old, new, problem):
    files = {name: (TF_DIRS["aws"] / name).read_text() for name in modules["aws"].files}
    (name,) = [n for n, text in files.items() if old in text]
    files[name] = files[name].replace(old, new, 1)
    module = checks.Module.from_text(files)
    assert problem in checks.aws_stack_problems(module) + checks.terraform_iam_problems(module)


def test_gcp_functions_log_to_a_bucket_of_their_own(modules):
    resources = {(t, n): body for t, n, body in modules["gcp"].labelled("resource")}
    bucket = resources[("google_logging_project_bucket_config", "functions")]
    assert bucket["retention_days"] == "${var.log_retention_days}"
    sink = resources[("google_logging_project_sink", "functions")]
    assert "google_logging_project_bucket_config.functions.bucket_id" in sink["destination"]
    assert "cloud_run_revision" in sink["filter"] and "local.functions" in sink["filter"]


# ------------------------------------------------------ least privilege, AWS


def _aws_with(modules, file: str, old: str, new: str) -> checks.Module:
    files = {name: (TF_DIRS["aws"] / name).read_text() for name in modules["aws"].files}
    assert old in files[file], old
    files[file] = files[file].replace(old, new, 1)
    return checks.Module.from_text(files)


def test_terraform_validations_equal_sams_patterns(modules):
    sam = checks.load_template(checks.TEMPLATE)
    assert checks.validation_parity_problems(sam, modules["aws"]) == []


@pytest.mark.parametrize("old, new, problem", [
    # a * in a secret ARN, which SAM's AllowedPattern refuses
    ('secret:[A-Za-z0-9/_+=.@!-]+$", var.database_url_secret_arn', 'secret:.+$", var.database_url_secret_arn',
     "variable database_url_secret_arn accepts 'arn:aws:secretsmanager:us-east-1:123456789012:secret:*', which "
     "DatabaseUrlSecretArn refuses"),
    ('''  validation {
    condition     = var.slack_webhook_secret_arn == null''', '''  validatio_ {
    condition     = var.slack_webhook_secret_arn == null''',
     "variable slack_webhook_secret_arn: no validation with one regex (SAM's SlackWebhookSecretArn has an "
     "AllowedPattern)"),
    ('key/[a-f0-9-]+$", var.queue_kms_key_arn', 'key/.+$", var.queue_kms_key_arn',
     "variable queue_kms_key_arn accepts 'arn:aws:kms:us-east-1:123456789012:key/*', which QueueKmsKeyArn refuses"),
])
def test_a_terraform_validation_looser_than_sam_is_caught(modules, old, new, problem):
    sam = checks.load_template(checks.TEMPLATE)
    assert problem in checks.validation_parity_problems(sam, _aws_with(modules, "variables.tf", old, new))


@pytest.mark.parametrize("file, old, new, problem", [
    # the old fallback: a function left out of the map read the shared secret
    ("main.tf", "lookup(var.function_database_url_secret_arns, k, null)",
     "lookup(var.function_database_url_secret_arns, k, var.database_url_secret_arn)",
     "aws: local.database_secret falls back to the shared secret without database_roles = shared"),
    ("variables.tf", 'default     = "per-function"', 'default     = "shared"',
     'aws: variable database_roles must default to "per-function"'),
    ("iam.tf", "/${local.database_user[each.key]}", "/${var.database_iam_user}",
     "aws: rds-db:connect is not per function (local.database_user[each.key])"),
    ("iam.tf", "var.target_organization_id != null || length(var.target_account_ids) > 0", "true",
     "aws: no precondition refuses a * target account without target_organization_id or target_account_ids"),
    ("main.tf", "ORPHAN_CLEANUP_PROTECT_TAG_KEY  = var.protect_tag_keys[0]",
     'ORPHAN_CLEANUP_PROTECT_TAG_KEY  = "other"',
     "aws: the functions' environment lacks ORPHAN_CLEANUP_PROTECT_TAG_KEY = var.protect_tag_keys[0]"),
])
def test_aws_least_privilege_mistakes_are_caught(modules, file, old, new, problem):
    assert problem in checks.aws_least_privilege_problems(_aws_with(modules, file, old, new))
