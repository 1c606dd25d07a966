"""infra/aws against template.yaml: each Terraform variable accepts exactly what its SAM
parameter's AllowedPattern accepts (sample values run through both regexes), and the
least-privilege shapes that only a plan could show otherwise: one database role and user per
function unless ``database_roles = "shared"``, a ``*`` target account only with an
organisation or accounts, the ceilings in every function's environment."""

from __future__ import annotations

import re

from infra.checks._common import unquote
from infra.checks.terraform import Module, code_text

_REGEX = re.compile(r'regex\("((?:[^"\\]|\\.)*)"')

# SAM parameter -> the infra/aws variable that stands for it (a map variable: its values).
PARITY = {
    "ListerDatabaseUrlSecretArn": "function_database_url_secret_arns",
    "DatabaseUrlSecretArn": "database_url_secret_arn",
    "DatabaseSecretKmsKeyArn": "database_secret_kms_key_arn",
    "DatabaseIamResourceId": "database_iam_resource_id",
    "DatabaseIamUser": "database_iam_user",
    "ListerDatabaseIamUser": "database_iam_users",
    "TagKey": "tag_key",
    "ProtectTagKeys": "protect_tag_keys",
    "TargetListRoleArnPattern": "target_list_role_arn_pattern",
    "TargetDeleteRoleArnPattern": "target_delete_role_arn_pattern",
    "TargetOrganizationId": "target_organization_id",
    "TargetAccountIds": "target_account_ids",
    "LogsKmsKeyArn": "logs_kms_key_arn",
    "QueueKmsKeyArn": "queue_kms_key_arn",
    "RedriveRoleArn": "redrive_role_arn",
    "CodeSigningConfigArn": "code_signing_config_arn",
    "AlarmTopicArn": "alarm_topic_arn",
    "DigestEmail": "digest_email",
    "DigestQueueArn": "digest_queue_arn",
    "SlackWebhookSecretArn": "slack_webhook_secret_arn",
}
ACCOUNT = "123456789012"
SAMPLES = (
    f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:oc-db-AbCdEf",
    f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:rds!db-0a1b2c3d-AbCdEf",
    f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:*",
    f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:oc-*",
    f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:oc-db?",
    f"arn:aws:secretsmanager:*:{ACCOUNT}:secret:oc-db-AbCdEf",
    f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    f"arn:aws:kms:us-east-1:{ACCOUNT}:key/*",
    f"arn:aws:kms:us-east-1:{ACCOUNT}:alias/oc",
    f"arn:aws:sns:us-east-1:{ACCOUNT}:ops-alerts", f"arn:aws:sns:us-east-1:{ACCOUNT}:*",
    f"arn:aws:sqs:us-east-1:{ACCOUNT}:digests", f"arn:aws:sqs:us-east-1:{ACCOUNT}:*",
    f"arn:aws:iam::{ACCOUNT}:role/ops-redrive", "arn:aws:iam::*:role/orphan-cleanup-list",
    f"arn:aws:iam::{ACCOUNT}:role/*", f"arn:aws:lambda:us-east-1:{ACCOUNT}:code-signing-config:csc-0a1b2c3d4e5f67890",
    "db-ABCDEFGHIJKL0123456789", "cluster-ABC123", "db-*", "orphan_cleanup_lister", "oc*", "1bad",
    "o-abcdef1234", "o-*", ACCOUNT, "12345678901*", "ops@example.com", "not an address",
    "provider_ref", "orphan-cleanup-protect", "a*b", "*",
)


def _sam_accepts(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def _tf_regexes(body: dict) -> list[str]:
    found = [_REGEX.search(str(v.get("condition", ""))) for v in body.get("validation", [])]
    return [m.group(1).replace("\\\\", "\\") for m in found if m]


def validation_parity_problems(sam: dict, module: Module) -> list[str]:
    """Every SAM parameter with an AllowedPattern and a Terraform counterpart: the
    variable's ``validation`` regex gives every sample the same answer (SAM's empty value
    is Terraform's null); a ``*`` where SAM refuses it is the usual difference."""
    problems: list[str] = []
    params = sam.get("Parameters", {})
    variables = {unquote(name): body for name, body in module.blocks("variable")}
    for parameter, variable in PARITY.items():
        pattern = (params.get(parameter) or {}).get("AllowedPattern")
        if pattern is None:
            problems.append(f"{parameter}: no AllowedPattern to compare variable {variable} with")
            continue
        body = variables.get(variable)
        regexes = _tf_regexes(body or {})
        if body is None or len(regexes) != 1:
            problems.append(f"variable {variable}: no validation with one regex (SAM's {parameter} has an "
                            "AllowedPattern)")
            continue
        for value in SAMPLES:
            sam_ok, tf_ok = _sam_accepts(pattern, value), re.search(regexes[0], value) is not None
            if sam_ok != tf_ok:
                problems.append(f"variable {variable} {'accepts' if tf_ok else 'refuses'} {value!r}, which "
                                f"{parameter} {'accepts' if sam_ok else 'refuses'}")
    return problems


def _locals(module: Module) -> dict:
    out: dict = {}
    for parsed in module.files.values():
        for block in parsed.get("locals", []):
            out.update({k: v for k, v in block.items() if k != "__is_block__"})
    return out


def aws_least_privilege_problems(module: Module) -> list[str]:
    """infra/aws: one secret per function unless ``database_roles = "shared"`` (no fallback
    to the shared secret), a precondition refusing a missing one, rds-db:connect and
    DATABASE_USER per function, a precondition refusing a ``*`` target account without an
    organisation or accounts, ORPHAN_CLEANUP_MAX_MODE and ORPHAN_CLEANUP_PROTECT_TAG_KEY
    (the first protect key, which the Deny covers) in the environment."""
    problems: list[str] = []
    variables = {unquote(name): body for name, body in module.blocks("variable")}
    if unquote(str((variables.get("database_roles") or {}).get("default"))) != "per-function":
        problems.append('aws: variable database_roles must default to "per-function"')
    if unquote(str((variables.get("max_mode") or {}).get("default"))) != "report":
        problems.append('aws: variable max_mode must default to "report"')
    loc = _locals(module)
    secret = code_text(str(loc.get("database_secret", "")))
    if "local.shared_database" not in secret or "var.database_url_secret_arn" in secret.split(":")[-1]:
        problems.append("aws: local.database_secret falls back to the shared secret without database_roles = shared")
    data = {(t, n): b for t, n, b in module.labelled("data")}
    runtime = data.get(("aws_iam_policy_document", "runtime"), {})
    if "local.database_secret[each.key] != null" not in str(runtime.get("lifecycle")):
        problems.append("aws: no precondition refuses a function without its database secret")
    connect = data.get(("aws_iam_policy_document", "database_iam_auth"), {})
    if "local.database_user[each.key]" not in str(connect.get("statement")) or "for_each" not in connect:
        problems.append("aws: rds-db:connect is not per function (local.database_user[each.key])")
    fn = {n: b for t, n, b in module.labelled("resource") if t == "aws_lambda_function"}.get("fn", {})
    if "DATABASE_USER = local.database_user[each.key]" not in str(fn.get("environment")):
        problems.append("aws: the functions' DATABASE_USER is not their own database user")
    assume = data.get(("aws_iam_policy_document", "assume_target"), {})
    pre = str(assume.get("lifecycle"))
    if not all(t in pre for t in ("var.target_organization_id", "var.target_account_ids", "iam::")):
        problems.append("aws: no precondition refuses a * target account without target_organization_id or "
                        "target_account_ids")
    env = str(loc.get("environment"))
    for wanted in ("ORPHAN_CLEANUP_MAX_MODE = var.max_mode",
                   "ORPHAN_CLEANUP_PROTECT_TAG_KEY = var.protect_tag_keys[0]"):
        if wanted not in env:
            problems.append(f"aws: the functions' environment lacks {wanted}")
    return problems


# consumer -> the one push account that may invoke it (infra/gcp local.push)
GCP_PUSH_ACCOUNTS = {"lister": "${google_service_account.jobs_push}",
                     "classifier": '${google_service_account.push["classifier"]}',
                     "deleter": '${google_service_account.push["deleter"]}'}


def gcp_least_privilege_problems(module: Module) -> list[str]:
    """infra/gcp: one database secret per function unless ``database_roles = "shared"``,
    each function reading only its own; one push account per function, run.invoker on that
    function only; cloudsql.client and cloudsql.instanceUser conditioned on the ledger's
    instance; the log bucket kept by ``terraform destroy``; the ceilings in the environment."""
    problems: list[str] = []
    variables = {unquote(name): body for name, body in module.blocks("variable")}
    for name, default in (("database_roles", "per-function"), ("max_mode", "report")):
        if unquote(str((variables.get(name) or {}).get("default"))) != default:
            problems.append(f'gcp: variable {name} must default to "{default}"')
    resources = {(t, n): b for t, n, b in module.labelled("resource")}
    loc = _locals(module)
    secret = resources.get(("google_secret_manager_secret", "database_url"), {})
    if secret.get("for_each") != "${local.database_secrets}" or \
            "local.functions" not in str(loc.get("database_secrets")):
        problems.append("gcp: no database secret per function (google_secret_manager_secret.database_url over "
                        "local.database_secrets)")
    own = "google_secret_manager_secret.database_url[local.database_secret[each.key]].secret_id"
    fn = resources.get(("google_cloudfunctions2_function", "fn"), {})
    env = [e for e in (fn.get("service_config") or [{}])[0].get("secret_environment_variables", [])
           if unquote(str(e.get("key"))) == "DATABASE_URL"]
    if [e.get("secret") for e in env] != ["${" + own + "}"]:
        problems.append("gcp: DATABASE_URL is not each function's own secret")
    accessor = resources.get(("google_secret_manager_secret_iam_member", "database_url"), {})
    if accessor.get("secret_id") != "${" + own + "}":
        problems.append("gcp: a function may read another function's database secret")
    push = loc.get("push") or {}
    for topic, consumer in (("jobs", "lister"), ("listing", "classifier"), ("delete", "deleter")):
        if (push.get(topic) or {}).get("invoker") != GCP_PUSH_ACCOUNTS[consumer]:
            problems.append(f"gcp: topic {topic} is not pushed with the {consumer}'s own push account")
    for (kind, label), binding in resources.items():
        if kind != "google_cloud_run_v2_service_iam_member":
            continue
        member, service = str(binding.get("member")), str(binding.get("name"))
        if "google_service_account.push" in member and not (
                member == "${google_service_account.push[each.value].member}"
                and "google_cloudfunctions2_function.fn[each.value]" in service):
            problems.append(f"gcp: {label}: a push account invokes another function than its own")
    for name in ("cloud_sql_client", "cloud_sql_instance_user"):
        condition = (resources.get(("google_project_iam_member", name)) or {}).get("condition") or [{}]
        expression = str(condition[0].get("expression"))
        if "resource.name ==" not in expression or "local.cloud_sql_resource" not in expression:
            problems.append(f"gcp: google_project_iam_member.{name} is not conditioned on the ledger's instance")
    bucket = resources.get(("google_logging_project_bucket_config", "functions"), {})
    if "'prevent_destroy': True" not in str(bucket.get("lifecycle")):
        problems.append("gcp: terraform destroy would delete the log bucket (no prevent_destroy)")
    environment = str(loc.get("environment"))
    for wanted in ("ORPHAN_CLEANUP_MAX_MODE = var.max_mode", "ORPHAN_CLEANUP_PROTECT_TAG_KEY = var.protect_tag_key"):
        if wanted not in environment:
            problems.append(f"gcp: the functions' environment lacks {wanted}")
    return problems
