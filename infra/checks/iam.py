"""IAM statements: which EC2 writes a policy grants and what limits each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from infra.checks._common import TAG_KEY, as_list, resources_of_type

# The EC2 writes the deleter needs (DESIGN: AWS resource kinds).
DELETE_ACTIONS = frozenset({
    "ec2:TerminateInstances", "ec2:DeleteVolume", "ec2:DeleteNetworkInterface",
    "ec2:DeleteSecurityGroup", "ec2:ReleaseAddress", "ec2:DetachNetworkInterface",
    "ec2:DisassociateAddress",
})
# What Lambda itself does with a VPC function's execution role.
LAMBDA_ENI_ACTIONS = frozenset({
    "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
})
READ_PREFIXES = ("Describe", "Get", "List", "Search")


def role_statements(cfn: dict, role_id: str) -> list[dict]:
    """Every statement that can apply to a role: inline policies (both branches
    of an ``Fn::If``) and AWS::IAM::Policy/ManagedPolicy resources naming it.
    A managed policy ARN attached to the role becomes a pseudo statement that
    allows ``*``: it is not visible here, so it is treated as the worst case."""
    role = cfn["Resources"][role_id]["Properties"]
    statements: list[dict] = []
    for policy in role.get("Policies", []):
        for branch in if_branches(policy):
            statements += _statements_of(branch.get("PolicyDocument", {}))
    for arn in role.get("ManagedPolicyArns", []) or []:
        statements.append({"Effect": "Allow", "Action": "*", "Resource": "*",
                           "Sid": f"managed policy {json.dumps(arn)}"})
    for res in cfn["Resources"].values():
        if isinstance(res, dict) and res.get("Type") in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            if {"Ref": role_id} in res["Properties"].get("Roles", []):
                statements += _statements_of(res["Properties"]["PolicyDocument"])
    return statements


def if_branches(node: Any) -> list[dict]:
    if isinstance(node, dict) and "Fn::If" in node:
        _, yes, no = node["Fn::If"]
        return if_branches(yes) + if_branches(no)
    if node == {"Ref": "AWS::NoValue"}:
        return []
    return [node]


def _statements_of(document: dict) -> list[dict]:
    statements = document.get("Statement", [])
    statements = statements if isinstance(statements, list) else [statements]
    return [b for s in statements for b in if_branches(s)]


@dataclass(frozen=True)
class Grant:
    action: str
    guard: str | None  # "tag", "lambda-managed", or None (unconditioned)
    sid: str


def ec2_write_grants(statements: Iterable[dict], tag_key: str = TAG_KEY) -> list[Grant]:
    """The EC2 (or wildcard) non-read actions that Allow statements grant, with
    the guard that limits each: the ref tag, or "only Lambda's own VPC
    interface management". Deny statements only narrow and are ignored."""
    grants: list[Grant] = []
    for st in statements:
        if st.get("Effect") != "Allow":
            continue
        sid = str(st.get("Sid", "?"))
        if "NotAction" in st:
            grants.append(Grant("NotAction", None, sid))
            continue
        guard = _guard(st.get("Condition") or {}, tag_key)
        for action in as_list(st.get("Action", [])):
            if not isinstance(action, str):
                grants.append(Grant(json.dumps(action), None, sid))
                continue
            service, _, name = action.partition(":")
            if action != "*" and service.lower() != "ec2":
                continue
            if name.startswith(READ_PREFIXES) and "*" not in name:
                continue
            action_guard = guard
            if guard == "lambda-managed" and action not in LAMBDA_ENI_ACTIONS:
                action_guard = None
            grants.append(Grant(action, action_guard, sid))
    return grants


def _guard(condition: dict, tag_key: str) -> str | None:
    keys = {f"aws:ResourceTag/{tag_key}", f"ec2:ResourceTag/{tag_key}"}
    for operator, clauses in condition.items():
        for key, value in (clauses or {}).items():
            values = [str(v) for v in as_list(value)]
            if key in keys:
                if operator in ("StringLike", "StringEquals") and values and all(
                        v and v.strip("*") for v in values):
                    return "tag"
                if operator == "Null" and values == ["false"]:
                    return "tag"
            if key == "lambda:SourceFunctionArn" and operator == "Null" and values == ["true"]:
                return "lambda-managed"
    return None


def target_role_problems(template: dict) -> list[str]:
    """The target-account role: EC2 writes only under the tag condition, all of
    the deleter's delete actions present, and an ExternalId on the trust."""
    problems: list[str] = []
    roles = resources_of_type({"Resources": template["Resources"]}, "AWS::IAM::Role")
    for role_id in roles:
        grants = ec2_write_grants(role_statements(template, role_id))
        problems += [f"{role_id}: {g.action} (statement {g.sid}) is not limited to resources tagged "
                     f"{TAG_KEY}" for g in grants if g.guard != "tag"]
        tagged = {g.action for g in grants if g.guard == "tag"}
        problems += [f"{role_id}: lacks {a} under the tag condition" for a in sorted(DELETE_ACTIONS - tagged)]
        trust = _statements_of(roles[role_id]["Properties"]["AssumeRolePolicyDocument"])
        for st in trust:
            if "sts:ExternalId" not in (st.get("Condition") or {}).get("StringEquals", {}):
                problems.append(f"{role_id}: trust statement without an sts:ExternalId condition")
    return problems
