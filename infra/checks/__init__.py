"""Offline checks of the deploy code: SAM template, Terraform stacks, entry points.

Each check returns a list of problems (empty means fine), so a test can feed
it a broken copy and assert the problem is caught. ``python -m infra.checks``
runs them all against the repository and exits 1 on any problem;
``python -m infra.checks --write-transformed build/template.json`` writes the
SAM-transformed template (for scanners that do not read SAM).

Needs the dev extras (cfn-lint, aws-sam-translator, python-hcl2); nothing here
talks to a cloud.
"""

from __future__ import annotations

from pathlib import Path

from infra.checks._common import (
    AWS_HANDLERS,
    GCP_ENTRY_POINTS,
    PROTECT_KEY,
    REPO,
    SAM_QUEUES,
    SAMPLE_PARAMETERS,
    SAMPLE_PROTECT_KEYS,
    TAG_KEY,
    TARGET_ROLES,
    TARGET_TEMPLATE,
    TEMPLATE,
    TERRAFORM_DIRS,
    as_list,
    resources_of_type,
    unquote,
)
from infra.checks.alarms import sam_alarm_problems, terraform_aws_alarm_problems, terraform_gcp_alarm_problems
from infra.checks.deployed import Deployed, ceiling_problems, database_role_problems, deployed, target_scope_problems
from infra.checks.entrypoints import defined_names, gcp_entry_point_problems, lambda_handler_problems
from infra.checks.gcp_permissions import function_permissions, gcp_permission_problems
from infra.checks.iam import (
    DELETE_ACTIONS,
    DESCRIBE_ACTIONS,
    LAMBDA_ENI_ACTIONS,
    SNAPSHOT_CREATE_ACTIONS,
    Grant,
    ec2_write_grants,
    if_branches,
    protect_deny_problems,
    role_statements,
    target_role_problems,
)
from infra.checks.intrinsics import Unresolved, parameter_values, policy_document, resolve, with_resolved_policies
from infra.checks.roles import sam_role_pattern_problems, terraform_role_pattern_problems
from infra.checks.sam import (
    cfn_lint,
    code_uris,
    deleter_policy_problems,
    function_by_handler,
    load_template,
    role_of,
    sam_handlers,
    sam_transform,
    visibility_problems,
)
from infra.checks.stack import (
    dead_letter_alarm_problems,
    dead_letter_policy_problems,
    queue_encryption_problems,
    queue_policy_problems,
    queue_wiring_problems,
    schedule_problems,
    stack_shape_problems,
    transform_problems,
)
from infra.checks.terraform import (
    Module,
    code_text,
    terraform_description_problems,
    terraform_iam_problems,
    terraform_literals,
    terraform_policy_documents,
    terraform_reference_problems,
)
from infra.checks.terraform_lp import (
    aws_least_privilege_problems,
    gcp_least_privilege_problems,
    validation_parity_problems,
)
from infra.checks.terraform_shape import aws_stack_problems, gcp_stack_problems

__all__ = [
    "AWS_HANDLERS", "DELETE_ACTIONS", "Deployed", "ceiling_problems", "database_role_problems", "deployed",
    "target_scope_problems", "aws_least_privilege_problems", "validation_parity_problems",
    "function_permissions", "gcp_least_privilege_problems", "gcp_permission_problems",
    "DESCRIBE_ACTIONS", "GCP_ENTRY_POINTS", "LAMBDA_ENI_ACTIONS", "PROTECT_KEY",
    "REPO", "SAM_QUEUES", "SAMPLE_PARAMETERS", "SAMPLE_PROTECT_KEYS", "TAG_KEY", "TARGET_ROLES", "TARGET_TEMPLATE",
    "SNAPSHOT_CREATE_ACTIONS",
    "TEMPLATE", "TERRAFORM_DIRS", "Grant", "Module", "Unresolved",
    "all_problems", "as_list", "aws_stack_problems", "cfn_lint", "code_text", "code_uris",
    "dead_letter_alarm_problems", "dead_letter_policy_problems", "defined_names", "deleter_policy_problems",
    "ec2_write_grants",
    "function_by_handler", "gcp_entry_point_problems", "gcp_stack_problems", "if_branches",
    "lambda_handler_problems", "load_template", "parameter_values", "policy_document", "protect_deny_problems",
    "queue_encryption_problems", "queue_policy_problems", "queue_wiring_problems", "resolve", "resources_of_type",
    "role_of", "role_statements", "sam_alarm_problems", "sam_handlers", "sam_role_pattern_problems", "sam_transform",
    "schedule_problems", "stack_shape_problems", "terraform_role_pattern_problems",
    "target_role_problems", "terraform_description_problems", "terraform_iam_problems", "terraform_literals",
    "terraform_aws_alarm_problems", "terraform_gcp_alarm_problems",
    "terraform_policy_documents", "terraform_reference_problems", "transform_problems", "unquote",
    "visibility_problems", "with_resolved_policies",
]


def all_problems(repo: Path = REPO) -> list[str]:
    """Every check against the repository; the handler checks need functions/."""
    target_path = repo / "infra" / "aws-target-account" / "template.yaml"
    problems = [f"template.yaml: {m}" for m in cfn_lint(repo / "template.yaml")]
    problems += [f"target template: {m}" for m in cfn_lint(target_path)]
    target = load_template(target_path)
    several_keys = {"ProtectTagKeys": ",".join(SAMPLE_PROTECT_KEYS)}
    problems += [f"target template: {p}" for p in target_role_problems(target)]
    problems += [f"target template ({several_keys['ProtectTagKeys']}): {p}"
                 for p in target_role_problems(target, several_keys)]
    sam = load_template(repo / "template.yaml")
    cfn = sam_transform(sam)
    problems += deleter_policy_problems(cfn) + visibility_problems(cfn) + stack_shape_problems(sam, cfn)
    problems += [f"ProtectTagKeys={several_keys['ProtectTagKeys']}: {p}"
                 for p in deleter_policy_problems(cfn, several_keys)]
    problems += lambda_handler_problems(repo, sam_handlers(cfn))
    problems += sam_role_pattern_problems(sam)
    problems += database_role_problems(sam) + target_scope_problems(sam) + ceiling_problems(sam)
    modules = {d.name: Module.load(d) for d in (repo / "infra" / "gcp", repo / "infra" / "aws")}
    for module in modules.values():
        problems += terraform_reference_problems(module) + terraform_description_problems(module)
    problems += terraform_iam_problems(modules["aws"]) + aws_stack_problems(modules["aws"])
    problems += terraform_role_pattern_problems(modules["aws"])
    problems += validation_parity_problems(sam, modules["aws"]) + aws_least_privilege_problems(modules["aws"])
    problems += gcp_stack_problems(modules["gcp"])
    problems += gcp_least_privilege_problems(modules["gcp"]) + gcp_permission_problems(modules["gcp"])
    problems += lambda_handler_problems(repo, terraform_literals(modules["aws"], "handler"))
    problems += gcp_entry_point_problems(repo, terraform_literals(modules["gcp"], "entry_point"))
    problems += sam_alarm_problems(cfn) + terraform_aws_alarm_problems(modules["aws"])
    problems += terraform_gcp_alarm_problems(modules["gcp"])
    return problems
