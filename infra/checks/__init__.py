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

from infra.checks._common import (AWS_HANDLERS, GCP_ENTRY_POINTS, PROTECT_KEY, REPO, SAMPLE_PARAMETERS,
                                  TAG_KEY, TARGET_TEMPLATE, TEMPLATE, TERRAFORM_DIRS, as_list,
                                  resources_of_type, unquote)
from infra.checks.entrypoints import defined_names, gcp_entry_point_problems, lambda_handler_problems
from infra.checks.iam import (DELETE_ACTIONS, LAMBDA_ENI_ACTIONS, Grant, ec2_write_grants, if_branches,
                              role_statements, target_role_problems)
from infra.checks.sam import (cfn_lint, code_uris, deleter_policy_problems, expand_foreach, function_by_handler,
                              load_template, role_of, sam_handlers, sam_transform, visibility_problems)
from infra.checks.terraform import (Module, code_text, terraform_description_problems, terraform_iam_problems,
                                    terraform_literals, terraform_policy_documents, terraform_reference_problems)

__all__ = [
    "AWS_HANDLERS", "DELETE_ACTIONS", "GCP_ENTRY_POINTS", "LAMBDA_ENI_ACTIONS", "PROTECT_KEY", "REPO",
    "SAMPLE_PARAMETERS", "TAG_KEY", "TARGET_TEMPLATE", "TEMPLATE", "TERRAFORM_DIRS", "Grant", "Module",
    "all_problems", "as_list", "cfn_lint", "code_text", "code_uris", "defined_names", "deleter_policy_problems",
    "ec2_write_grants", "expand_foreach", "function_by_handler", "gcp_entry_point_problems", "if_branches",
    "lambda_handler_problems", "load_template", "resources_of_type", "role_of", "role_statements",
    "sam_handlers", "sam_transform", "target_role_problems", "terraform_description_problems",
    "terraform_iam_problems", "terraform_literals", "terraform_policy_documents",
    "terraform_reference_problems", "unquote", "visibility_problems",
]


def all_problems(repo: Path = REPO) -> list[str]:
    """Every check against the repository; the handler checks need functions/."""
    target = repo / "infra" / "aws-target-account" / "template.yaml"
    problems = [f"template.yaml: {m}" for m in cfn_lint(repo / "template.yaml")]
    problems += [f"target template: {m}" for m in cfn_lint(target)]
    problems += target_role_problems(load_template(target))
    cfn = sam_transform(load_template(repo / "template.yaml"))
    problems += deleter_policy_problems(cfn) + visibility_problems(cfn)
    problems += lambda_handler_problems(repo, sam_handlers(cfn))
    modules = {d.name: Module.load(d) for d in (repo / "infra" / "gcp", repo / "infra" / "aws")}
    for module in modules.values():
        problems += terraform_reference_problems(module) + terraform_description_problems(module)
    problems += terraform_iam_problems(modules["aws"])
    problems += lambda_handler_problems(repo, terraform_literals(modules["aws"], "handler"))
    problems += gcp_entry_point_problems(repo, terraform_literals(modules["gcp"], "entry_point"))
    return problems
