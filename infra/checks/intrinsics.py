"""Just enough CloudFormation intrinsics to read a policy document written as a
JSON string (``Fn::Sub`` / ``Fn::Join`` over parameters), the way the
templates write the deleter's delete policy."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from infra.checks._common import as_list, resources_of_type

# What the pseudo parameters stand for in the checks (any account, us-east-1).
PSEUDO = {"AWS::Partition": "aws", "AWS::AccountId": "123456789012", "AWS::Region": "us-east-1",
          "AWS::StackName": "orphan-cleanup", "AWS::URLSuffix": "amazonaws.com"}
_SUB = re.compile(r"\$\{(!?)([^}]*)\}")


class Unresolved(ValueError):
    """An intrinsic this evaluator does not know (GetAtt, If, ...) stood where a
    string had to be."""


def parameter_values(template: dict, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each parameter's value: ``overrides``, else its Default; list types
    (CommaDelimitedList, List<...>) become lists, as CloudFormation does."""
    values: dict[str, Any] = {}
    for name, spec in template.get("Parameters", {}).items():
        raw = (overrides or {}).get(name, spec.get("Default"))
        if raw is None:
            continue
        if str(spec.get("Type", "")).startswith(("CommaDelimitedList", "List<")):
            values[name] = [v.strip() for v in raw.split(",")] if isinstance(raw, str) else list(raw)
        else:
            values[name] = str(raw)
    return values


def resolve(node: Any, values: dict[str, Any]) -> Any:
    """``node`` with Ref (parameters, pseudo parameters), Fn::Sub and Fn::Join
    evaluated; raises Unresolved where another intrinsic blocks a string."""
    if isinstance(node, list):
        return [resolve(x, values) for x in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Ref"}:
        name = node["Ref"]
        if name in values:
            return values[name]
        if name in PSEUDO:
            return PSEUDO[name]
        raise Unresolved(f"Ref {name}")
    if set(node) == {"Fn::Sub"}:
        return _sub(node["Fn::Sub"], values)
    if set(node) == {"Fn::Join"}:
        delimiter, items = node["Fn::Join"]
        parts = resolve(items, values)
        if not isinstance(parts, list):
            raise Unresolved(f"Fn::Join over {items!r}")
        flat = [p for part in parts for p in as_list(part)]
        if not all(isinstance(p, str) for p in flat):
            raise Unresolved(f"Fn::Join item in {items!r}")
        return delimiter.join(flat)
    if len(node) == 1 and next(iter(node)).startswith("Fn::"):
        raise Unresolved(next(iter(node)))
    return {k: resolve(v, values) for k, v in node.items()}


def _sub(arg: Any, values: dict[str, Any]) -> str:
    text, local = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
    scope = {**values, **{k: resolve(v, values) for k, v in local.items()}}

    def one(m: re.Match) -> str:
        if m.group(1):  # ${!Literal} stays ${Literal}
            return "${" + m.group(2) + "}"
        name = m.group(2)
        value = scope.get(name, PSEUDO.get(name))
        if not isinstance(value, str):
            raise Unresolved(f"${{{name}}} in Fn::Sub")
        return value

    return _SUB.sub(one, text)


def policy_document(node: Any, values: dict[str, Any]) -> dict:
    """A policy document as IAM reads it: an object stays as is, a string
    (from Fn::Sub / Fn::Join) is evaluated and parsed as JSON."""
    if isinstance(node, dict) and ("Statement" in node or "Version" in node):
        return node
    text = resolve(node, values)
    if not isinstance(text, str):
        raise Unresolved(f"policy document {node!r}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"policy document is not valid JSON ({e}): {text[:200]}") from e


def with_resolved_policies(template: dict, overrides: dict[str, Any] | None = None) -> dict:
    """A copy of ``template`` whose role policy documents written as strings are
    parsed objects (evaluated with the parameters' defaults and ``overrides``),
    so a test can edit one statement."""
    out = copy.deepcopy(template)
    values = parameter_values(out, overrides)
    for role in resources_of_type(out, "AWS::IAM::Role").values():
        for policy in role["Properties"].get("Policies", []):
            for branch in _branches(policy):
                branch["PolicyDocument"] = policy_document(branch["PolicyDocument"], values)
    return out


def _branches(node: Any) -> list[dict]:
    if isinstance(node, dict) and "Fn::If" in node:
        _, yes, no = node["Fn::If"]
        return _branches(yes) + _branches(no)
    return [node] if isinstance(node, dict) and "PolicyDocument" in node else []
