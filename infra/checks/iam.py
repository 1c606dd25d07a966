"""IAM statements: which EC2 writes a policy grants and what limits each."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infra.checks._common import TAG_KEY, TARGET_ROLES, as_list, resources_of_type
from infra.checks.intrinsics import parameter_values, policy_document

# The EC2 and ELBv2 writes the deleter needs (README, Permissions).
DELETE_ACTIONS = frozenset({
    "ec2:TerminateInstances", "ec2:DeleteVolume", "ec2:DeleteNetworkInterface",
    "ec2:DeleteSecurityGroup", "ec2:ReleaseAddress", "ec2:DetachNetworkInterface",
    "ec2:DisassociateAddress", "ec2:CancelSpotInstanceRequests", "ec2:DeleteSnapshot",
    "ec2:DeleteLaunchTemplate", "ec2:DeleteKeyPair", "ec2:DeletePlacementGroup",
    "elasticloadbalancing:DeleteLoadBalancer", "elasticloadbalancing:DeleteTargetGroup",
})
#: What the deleter writes to keep a data volume (``snapshot_before_delete``): a snapshot of
#: a ref-tagged volume that carries the ref itself, tagged only as it is created.
SNAPSHOT_CREATE_ACTIONS = frozenset({"ec2:CreateSnapshot", "ec2:CreateTags"})
# What Lambda itself does with a VPC function's execution role.
LAMBDA_ENI_ACTIONS = frozenset({
    "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses",
})
# The describes of the kinds we list (providers/aws/kinds.py), all on "*".
DESCRIBE_ACTIONS = frozenset({
    "ec2:DescribeInstances", "ec2:DescribeVolumes", "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups", "ec2:DescribeAddresses", "ec2:DescribeSpotInstanceRequests",
    "ec2:DescribeSnapshots", "ec2:DescribeLaunchTemplates", "ec2:DescribeKeyPairs", "ec2:DescribePlacementGroups",
    "elasticloadbalancing:DescribeLoadBalancers", "elasticloadbalancing:DescribeTargetGroups",
    "elasticloadbalancing:DescribeTags",
})
#: The tag on the snapshots the deleter takes: ec2:DeleteSnapshot needs it too (SAFETY.md rule 15),
#: its value a volume id (the one it was taken of; IAM cannot compare the two, the deleter does).
SNAPSHOT_SOURCE_KEY = "orphan-cleanup-source"
SNAPSHOT_SOURCE_VALUE = "vol-*"
#: What the deleter reads besides: termination protection (SAFETY.md rule 14), and what an ELBv2
#: delete would reach (listeners, their rules, registered targets, deletion protection: rule 15), and
#: the Auto Scaling groups that launch from a launch template or register in a target group (rule 21).
DELETER_READ_ACTIONS = frozenset({
    "ec2:DescribeInstanceAttribute", "elasticloadbalancing:DescribeListeners", "elasticloadbalancing:DescribeRules",
    "elasticloadbalancing:DescribeTargetHealth", "elasticloadbalancing:DescribeLoadBalancerAttributes",
    "autoscaling:DescribeAutoScalingGroups",
})
#: The services whose writes the checks judge (the deleter's deletes are EC2's and ELBv2's).
WRITE_SERVICES = ("ec2", "elasticloadbalancing")
READ_PREFIXES = ("Describe", "Get", "List", "Search")


def role_statements(cfn: dict, role_id: str, parameters: dict[str, str] | None = None) -> list[dict]:
    """Every statement that can apply to a role: inline policies (both branches
    of an ``Fn::If``; a document written as a JSON string is evaluated with the
    parameters' defaults and ``parameters``) and AWS::IAM::Policy/ManagedPolicy
    resources naming it. A managed policy ARN attached to the role becomes a
    pseudo statement that allows ``*``: it is not visible here, so it is treated
    as the worst case."""
    values = parameter_values(cfn, parameters)
    role = cfn["Resources"][role_id]["Properties"]
    statements: list[dict] = []
    for policy in role.get("Policies", []):
        for branch in if_branches(policy):
            statements += _statements_of(policy_document(branch.get("PolicyDocument", {}), values))
    for arn in role.get("ManagedPolicyArns", []) or []:
        statements.append({"Effect": "Allow", "Action": "*", "Resource": "*",
                           "Sid": f"managed policy {json.dumps(arn)}"})
    for res in cfn["Resources"].values():
        if isinstance(res, dict) and res.get("Type") in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            if {"Ref": role_id} in res["Properties"].get("Roles", []):
                statements += _statements_of(policy_document(res["Properties"]["PolicyDocument"], values))
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
    # "tag", "snapshot-create" (a SNAPSHOT_CREATE_ACTIONS under the ref tag of the volume or
    # of the request; CreateTags only with ec2:CreateAction CreateSnapshot), "lambda-managed",
    # or None (unconditioned)
    guard: str | None
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
            if action != "*" and service.lower() not in WRITE_SERVICES:
                continue
            if name.startswith(READ_PREFIXES) and "*" not in name:
                continue
            action_guard = guard
            if guard == "lambda-managed" and action not in LAMBDA_ENI_ACTIONS:
                action_guard = None
            if action in SNAPSHOT_CREATE_ACTIONS:
                # CreateTags under any other condition could re-tag a resource as ours.
                ok = guard in ("tag", "request-tag") and (
                    action != "ec2:CreateTags" or _creates_snapshot_only(st.get("Condition") or {})) and (
                    guard == "tag" or _source_tagged(st.get("Condition") or {}, "aws:RequestTag"))
                action_guard = "snapshot-create" if ok else None
            elif guard == "request-tag":
                action_guard = None  # a tag in the request limits nothing an existing resource has
            elif action in ("ec2:DeleteSnapshot", "ec2:*", "*") and not _source_tagged(st.get("Condition") or {}):
                action_guard = None  # a backup that copied the ref tag is not ours to delete
            grants.append(Grant(action, action_guard, sid))
    return grants


def _source_tagged(condition: dict, tag: str = "aws:ResourceTag") -> bool:
    """The condition requires the snapshot source tag, its value a volume id (``StringLike
    ... vol-*``): the tag's presence alone would admit any value."""
    values = [str(v) for v in as_list((condition.get("StringLike") or {}).get(f"{tag}/{SNAPSHOT_SOURCE_KEY}", []))]
    return values == [SNAPSHOT_SOURCE_VALUE]


def _creates_snapshot_only(condition: dict) -> bool:
    values = [str(v) for v in as_list((condition.get("StringEquals") or {}).get("ec2:CreateAction", []))]
    return values == ["CreateSnapshot"]


def _guard(condition: dict, tag_key: str) -> str | None:
    keys = {f"aws:ResourceTag/{tag_key}", f"ec2:ResourceTag/{tag_key}"}
    for operator, clauses in condition.items():
        if not isinstance(clauses, dict):
            continue  # an intrinsic (Fn::If) over the whole condition: no guard credited
        for key, value in clauses.items():
            values = [str(v) for v in as_list(value)]
            if key == f"aws:RequestTag/{tag_key}" and operator in ("StringLike", "StringEquals") and values \
                    and all(v and v.strip("*") for v in values):
                return "request-tag"
            if key in keys:
                if operator in ("StringLike", "StringEquals") and values and all(
                        v and v.strip("*") for v in values):
                    return "tag"
                if operator == "Null" and values == ["false"]:
                    return "tag"
            if key == "lambda:SourceFunctionArn" and operator == "Null" and values == ["true"]:
                return "lambda-managed"
    return None


def snapshot_create_problems(grants: Iterable[Grant], who: str) -> list[str]:
    """The deleter can take a ref-tagged snapshot of a volume (``snapshot_before_delete``)."""
    have = {g.action for g in grants if g.guard == "snapshot-create"}
    return [f"{who}: lacks {a} under the tag condition" for a in sorted(SNAPSHOT_CREATE_ACTIONS - have)]


def protect_deny_problems(statements: Iterable[dict], keys: Iterable[str], who: str) -> list[str]:
    """For every protect key, one Deny of all the delete actions on ``*`` while
    the resource carries that key (``Null: aws:ResourceTag/KEY = false``)."""
    problems = []
    denies = [s for s in statements if s.get("Effect") == "Deny"]
    for key in keys:
        wanted = {"Null": {f"aws:ResourceTag/{key}": ["false"]}}
        matching = [s for s in denies if _normalized(s.get("Condition") or {}) == wanted
                    and as_list(s.get("Resource")) == ["*"]]
        denied = {a for s in matching for a in as_list(s.get("Action", []))}
        if not matching:
            problems.append(f"{who}: no Deny of the deletes on resources tagged {key}")
        else:
            problems += [f"{who}: the Deny for {key} lacks {a}" for a in sorted(DELETE_ACTIONS - denied)]
    return problems


def _normalized(condition: dict) -> dict:
    return {op: {k: [str(v) for v in as_list(vals)] for k, vals in (clauses or {}).items()}
            for op, clauses in condition.items()}


def target_role_problems(template: dict, parameters: dict[str, str] | None = None) -> list[str]:
    """The target-account template: a list role that only describes and that
    only the lister role may assume; a delete role that only the deleter role
    may assume, with every EC2 write under the tag condition, all the delete
    actions and a protect Deny per key; an external id on both trusts; both
    ARNs as outputs."""
    problems: list[str] = []
    values = parameter_values(template, parameters)
    roles = resources_of_type(template, "AWS::IAM::Role")
    problems += [f"{r}: missing" for r in TARGET_ROLES if r not in roles]
    problems += [f"{r}: unexpected role (only {', '.join(TARGET_ROLES)})" for r in roles if r not in TARGET_ROLES]
    problems += [f"output {r}Arn: missing" for r in TARGET_ROLES if f"{r}Arn" not in template.get("Outputs", {})]
    tag_key = values.get("TagKey", TAG_KEY)
    for role_id, caller in TARGET_ROLES.items():
        if role_id not in roles:
            continue
        problems += _trust_problems(role_id, roles[role_id], caller)
        statements = role_statements(template, role_id, parameters)
        grants = ec2_write_grants(statements, tag_key)
        if role_id == "ListRole":
            problems += [f"ListRole: may {g.action} (statement {g.sid}); the list role only describes" for g in grants]
            allowed = {a for s in statements if s.get("Effect") == "Allow" for a in as_list(s.get("Action", []))}
            problems += [f"ListRole: allows {a}; the list role only describes what we list"
                         for a in sorted(allowed - DESCRIBE_ACTIONS, key=str)]
            problems += [f"ListRole: lacks {a}" for a in sorted(DESCRIBE_ACTIONS - allowed)]
            continue
        problems += [f"{role_id}: {g.action} (statement {g.sid}) is not limited to resources tagged "
                     f"{tag_key}" for g in grants if g.guard not in ("tag", "snapshot-create")]
        tagged = {g.action for g in grants if g.guard == "tag"}
        problems += snapshot_create_problems(grants, role_id)
        problems += [f"{role_id}: lacks {a} under the tag condition" for a in sorted(DELETE_ACTIONS - tagged)]
        allowed = {a for s in statements if s.get("Effect") == "Allow" for a in as_list(s.get("Action", []))}
        problems += [f"{role_id}: lacks {a}" for a in sorted(DELETER_READ_ACTIONS - allowed)]
        problems += instance_attribute_problems(statements, role_id)
        problems += protect_deny_problems(statements, values.get("ProtectTagKeys", []), role_id)
    return problems


def instance_attribute_problems(statements: Iterable[dict], who: str) -> list[str]:
    """``ec2:DescribeInstanceAttribute`` (termination protection) takes instance ARNs: a
    grant of it names instances only, never ``*``."""
    problems = []
    for st in statements:
        if st.get("Effect") != "Allow" or "ec2:DescribeInstanceAttribute" not in as_list(st.get("Action", [])):
            continue
        for r in as_list(st.get("Resource", [])):
            text = r.get("Fn::Sub") if isinstance(r, dict) else r
            if not (isinstance(text, str) and text.endswith(":instance/*")):
                problems.append(f"{who}: ec2:DescribeInstanceAttribute on {json.dumps(r)}; only instance ARNs")
    return problems


def _trust_problems(role_id: str, role: dict, caller_parameter: str) -> list[str]:
    problems = []
    trust = _statements_of(role["Properties"]["AssumeRolePolicyDocument"])
    for st in trust:
        principal = (st.get("Principal") or {}) if isinstance(st.get("Principal"), dict) else {"*": "*"}
        if set(principal) != {"AWS"} or as_list(principal["AWS"]) != [{"Ref": caller_parameter}]:
            problems.append(f"{role_id}: trusts {json.dumps(st.get('Principal'))}, not only {caller_parameter}")
        if "sts:ExternalId" not in (st.get("Condition") or {}).get("StringEquals", {}):
            problems.append(f"{role_id}: trust statement without an sts:ExternalId condition")
    return problems
