"""The role ARNs the stacks let the functions assume or admit: a fixed role name, with
``*`` only for the account (target roles), none at all (the redrive role); and the
optional organisation / account condition on ``sts:AssumeRole``. SAM's AllowedPattern and
Terraform's ``validation`` blocks are run against the same sample values."""

from __future__ import annotations

import re
from typing import Any

from infra.checks._common import unquote
from infra.checks.iam import if_branches, role_statements
from infra.checks.terraform import Module

# (value, accepted?) for the target role parameters: one stack, many target accounts, but
# never any role name (a role that trusts the tool account would be assumable).
TARGET_SAMPLES = (
    ("", True),
    ("arn:aws:iam::*:role/orphan-cleanup-list", True),
    ("arn:aws:iam::123456789012:role/orphan-cleanup-delete", True),
    ("arn:aws:iam::*:role/ops/orphan-cleanup-list", True),
    ("arn:aws-us-gov:iam::*:role/orphan-cleanup-list", True),
    ("arn:aws:iam::*:role/*", False),
    ("arn:aws:iam::*:role/orphan-cleanup-*", False),
    ("arn:aws:iam::123456789012:role/ops/*", False),
    ("arn:aws:iam::*:role/orphan-cleanup-lis?", False),
    ("arn:aws:iam::12345678901*:role/orphan-cleanup-list", False),
    ("arn:aws:iam::*:role/", False),
    ("*", False),
)
# The redrive role is exempt from the producer-only Deny: exactly one role.
REDRIVE_SAMPLES = (
    ("", True),
    ("arn:aws:iam::123456789012:role/ops-redrive", True),
    ("arn:aws:iam::*:role/ops-redrive", False),
    ("arn:aws:iam::123456789012:role/*", False),
    ("arn:aws:iam::123456789012:role/ops-?", False),
)
SAM_PARAMETERS = {"TargetListRoleArnPattern": TARGET_SAMPLES, "TargetDeleteRoleArnPattern": TARGET_SAMPLES,
                  "RedriveRoleArn": REDRIVE_SAMPLES}
TF_VARIABLES = {"target_list_role_arn_pattern": TARGET_SAMPLES, "target_delete_role_arn_pattern": TARGET_SAMPLES,
                "redrive_role_arn": REDRIVE_SAMPLES}
# role -> the parameter its sts:AssumeRole statement names
SAM_ASSUMERS = {"ListerRole": "TargetListRoleArnPattern", "DeleterRole": "TargetDeleteRoleArnPattern"}
SCOPE_KEYS = {"aws:ResourceOrgID": "TargetOrganizationId", "aws:ResourceAccount": "TargetAccountIds"}


def _sample_problems(who: str, accepts: Any, samples: tuple[tuple[str, bool], ...]) -> list[str]:
    problems = []
    for value, wanted in samples:
        if accepts(value) != wanted:
            problems.append(f"{who}: {'refuses' if wanted else 'accepts'} {value!r}")
    return problems


def sam_role_pattern_problems(sam: dict) -> list[str]:
    """template.yaml: each role parameter's AllowedPattern against the samples (CloudFormation
    matches the whole value), and every sts:AssumeRole statement of the functions' roles
    conditioned on TargetOrganizationId / TargetAccountIds when they are set."""
    problems: list[str] = []
    params = sam.get("Parameters", {})
    for name, samples in SAM_PARAMETERS.items():
        pattern = (params.get(name) or {}).get("AllowedPattern")
        if pattern is None:
            problems.append(f"{name}: no AllowedPattern")
            continue
        problems += _sample_problems(f"{name} AllowedPattern", lambda v, p=pattern: re.fullmatch(p, v) is not None,
                                     samples)
    for parameter in SCOPE_KEYS.values():
        if parameter not in params:
            problems.append(f"{parameter}: no such parameter")
    for role, parameter in SAM_ASSUMERS.items():
        assumes = [s for s in role_statements(sam, role) if "sts:AssumeRole" in str(s.get("Action"))]
        # the parameter, or a text that is no ARN, which IAM refuses (a * account without a
        # scope: deployed.target_scope_problems)
        branches = [b for st in assumes for b in if_branches(st.get("Resource"))]
        if len(assumes) != 1 or {"Ref": parameter} not in branches or not all(
                b == {"Ref": parameter} or (isinstance(b, str) and not b.startswith("arn:")) for b in branches):
            problems.append(f"{role}: sts:AssumeRole on {[s.get('Resource') for s in assumes]!r}, expected {parameter}")
        for st in assumes:
            problems += [f"{role}: sts:AssumeRole {p}" for p in _scope_condition_problems(st.get("Condition"))]
    return problems


def _scope_condition_problems(condition: Any) -> list[str]:
    """The condition is ``If HasTargetScope`` over StringEquals of each scope key, each one
    present only when its parameter is set (else a missing key, never an empty value)."""
    branches = if_branches(condition) if condition is not None else []
    equals = [b.get("StringEquals") for b in branches if isinstance(b, dict)]
    if len(equals) != 1 or not isinstance(equals[0], dict):
        return ["has no aws:ResourceOrgID / aws:ResourceAccount condition"]
    problems = []
    for key, parameter in SCOPE_KEYS.items():
        values = [v for v in if_branches(equals[0].get(key)) if v is not None]
        if values != [{"Ref": parameter}]:
            problems.append(f"condition {key} is {equals[0].get(key)!r}, expected {parameter} when set")
    return problems


_REGEX = re.compile(r'regex\("((?:[^"\\]|\\.)*)"')


def terraform_role_pattern_problems(module: Module) -> list[str]:
    """infra/aws: each role variable has a ``validation`` whose ``regex`` (null allowed)
    gives the samples the same answers as SAM; the organisation and account variables
    exist and reach the assume policy."""
    problems: list[str] = []
    variables = {unquote(name): body for name, body in module.blocks("variable")}
    for name, samples in TF_VARIABLES.items():
        body = variables.get(name)
        conditions = [v.get("condition", "") for v in (body or {}).get("validation", [])]
        found = [_REGEX.search(str(c)) for c in conditions]
        patterns = [m.group(1).replace("\\\\", "\\") for m in found if m]
        if body is None or len(patterns) != 1:
            problems.append(f"variable {name}: no validation with one regex")
            continue
        problems += _sample_problems(f"variable {name} validation",
                                     lambda v, p=patterns[0]: v == "" or re.search(p, v) is not None, samples)
    for name in ("target_organization_id", "target_account_ids"):
        if name not in variables:
            problems.append(f"variable {name}: missing")
    assume = [body for t, n, body in module.labelled("data") if (t, n) == ("aws_iam_policy_document", "assume_target")]
    variables_used = {unquote(content.get("variable", ""))
                      for body in assume for st in body.get("statement", []) for dyn in st.get("dynamic", [])
                      for label, block in dyn.items() if unquote(label) == "condition"
                      for content in block.get("content", [])}
    for key in SCOPE_KEYS:
        if key not in variables_used:
            problems.append(f"aws_iam_policy_document.assume_target: no {key} condition")
    return problems
