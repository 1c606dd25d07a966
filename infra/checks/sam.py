"""template.yaml: load, lint, SAM-transform, and check the functions' IAM and queues."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from infra.checks._common import AWS_HANDLERS, SAMPLE_PARAMETERS, TAG_KEY, TEMPLATE, as_list, resources_of_type
from infra.checks.iam import (
    DELETE_ACTIONS,
    ec2_write_grants,
    instance_attribute_problems,
    protect_deny_problems,
    role_statements,
    snapshot_create_problems,
)
from infra.checks.intrinsics import parameter_values


def load_template(path: Path = TEMPLATE) -> dict:
    """The template as plain JSON-like data (short-form intrinsics expanded);
    a fresh copy each call, safe to mutate."""
    return json.loads(_decoded(Path(path), Path(path).stat().st_mtime_ns))


@lru_cache(maxsize=8)
def _decoded(path: Path, mtime_ns: int) -> str:
    from cfnlint.decode import decode

    template, matches = decode(str(path))
    if matches:
        raise ValueError(f"{path}: {[str(m) for m in matches]}")
    return json.dumps(template)


def cfn_lint(path: Path) -> list[str]:
    """cfn-lint findings (errors and warnings) for one template file."""
    from cfnlint.api import lint_file

    return [f"{m.rule.id} {m.filename}:{m.linenumber} {m.message}" for m in lint_file(Path(path))
            if m.rule.severity in ("error", "warning")]


def code_uris(template: dict) -> set[str]:
    """Local CodeUri values (Globals and functions) that ``sam deploy`` uploads."""
    uris = {template.get("Globals", {}).get("Function", {}).get("CodeUri")}
    uris |= {r["Properties"].get("CodeUri") for r in _resources(template)
             if r.get("Type") == "AWS::Serverless::Function"}
    return {u for u in uris if isinstance(u, str) and not u.startswith("s3://")}


def _as_packaged(template: dict) -> dict:
    """What ``sam package`` does to local CodeUris: upload, point at S3."""
    out = copy.deepcopy(template)
    fn_globals = out.get("Globals", {}).get("Function", {})
    if isinstance(fn_globals.get("CodeUri"), str) and not fn_globals["CodeUri"].startswith("s3://"):
        fn_globals["CodeUri"] = f"s3://sam-artifacts/{fn_globals['CodeUri']}"
    for res in _resources(out):
        props = res.get("Properties", {})
        if res.get("Type") == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str) \
                and not props["CodeUri"].startswith("s3://"):
            props["CodeUri"] = f"s3://sam-artifacts/{props['CodeUri']}"
    return out


@lru_cache(maxsize=1)
def _session() -> Any:
    import boto3

    # Only the region is read (for AWS::Region / AWS::Partition); no credentials.
    return boto3.Session(region_name="us-east-1")


class _NoManagedPolicies:
    def load(self) -> dict[str, str]:
        return {}


def sam_transform(template: dict, parameters: dict[str, str] | None = None) -> dict:
    """The real SAM translator, offline, on the template as ``sam package``
    leaves it (local CodeUris pointing at S3)."""
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    params = dict(SAMPLE_PARAMETERS if parameters is None else parameters)
    translator = Translator(None, Parser(), boto_session=_session())
    return translator.translate(_as_packaged(template), parameter_values=params, passthrough_metadata=True,
                                get_managed_policy_map=_NoManagedPolicies().load)


def function_by_handler(cfn: dict, handler: str) -> tuple[str, dict]:
    for logical_id, res in resources_of_type(cfn, "AWS::Lambda::Function").items():
        if res["Properties"].get("Handler") == handler:
            return logical_id, res
    raise KeyError(f"no function with handler {handler}")


def role_of(function: dict) -> str:
    role = function["Properties"]["Role"]
    if isinstance(role, dict) and "Fn::GetAtt" in role:
        return role["Fn::GetAtt"][0]
    raise ValueError(f"function role is not a role of this stack: {role!r}")


def deleter_policy_problems(cfn: dict, parameters: dict[str, str] | None = None) -> list[str]:
    """The deleter may write EC2 only under the ref-tag condition (the TagKey
    parameter), must hold every delete action it needs and a protect Deny for
    each of ProtectTagKeys; the lister and classifier write nothing."""
    problems: list[str] = []
    values = parameter_values(cfn, parameters)
    tag_key = values.get("TagKey", TAG_KEY)
    for name, handler in AWS_HANDLERS.items():
        try:
            _, fn = function_by_handler(cfn, handler)
        except KeyError as e:
            problems.append(str(e))
            continue
        statements = role_statements(cfn, role_of(fn), parameters)
        grants = ec2_write_grants(statements, tag_key)
        for g in grants:
            if g.guard is None:
                problems.append(f"{name}: {g.action} (statement {g.sid}) is not limited to "
                                f"resources tagged {tag_key}")
            elif name != "deleter" and g.guard in ("tag", "snapshot-create"):
                problems.append(f"{name}: may {g.action} (statement {g.sid}); only the deleter deletes")
        if name == "deleter":
            tagged = {g.action for g in grants if g.guard == "tag"}
            for missing in sorted(DELETE_ACTIONS - tagged):
                problems.append(f"deleter: lacks {missing} under the tag condition")
            problems += snapshot_create_problems(grants, "deleter")
            problems += protect_deny_problems(statements, values.get("ProtectTagKeys", []), "deleter")
            problems += instance_attribute_problems(statements, "deleter")
            if not any("ec2:DescribeInstanceAttribute" in as_list(st.get("Action", [])) for st in statements):
                problems.append("deleter: lacks ec2:DescribeInstanceAttribute")
    return problems


def visibility_problems(cfn: dict, factor: int = 6) -> list[str]:
    """Every SQS event source: queue visibility >= factor x function timeout
    (+ batching window), partial batch responses on, a DLQ redrive in place."""
    problems: list[str] = []
    queues = resources_of_type(cfn, "AWS::SQS::Queue")
    functions = resources_of_type(cfn, "AWS::Lambda::Function")
    mappings = resources_of_type(cfn, "AWS::Lambda::EventSourceMapping")
    if not mappings:
        problems.append("no SQS event source mapping")
    for mid, m in mappings.items():
        p = m["Properties"]
        queue_id = p["EventSourceArn"]["Fn::GetAtt"][0]
        fn_id = p["FunctionName"]["Ref"]
        timeout = int(functions[fn_id]["Properties"].get("Timeout", 3))
        window = int(p.get("MaximumBatchingWindowInSeconds", 0))
        q = queues[queue_id]["Properties"]
        visibility = int(q.get("VisibilityTimeout", 30))
        if visibility < factor * timeout + window:
            problems.append(f"{queue_id}: visibility {visibility}s < {factor} x {fn_id} "
                            f"timeout {timeout}s + window {window}s")
        if p.get("FunctionResponseTypes") != ["ReportBatchItemFailures"]:
            problems.append(f"{mid}: FunctionResponseTypes is not [ReportBatchItemFailures]")
        redrive = q.get("RedrivePolicy") or {}
        if not redrive.get("deadLetterTargetArn") or not redrive.get("maxReceiveCount"):
            problems.append(f"{queue_id}: no DLQ redrive policy")
    return problems


def sam_handlers(cfn_or_sam: dict) -> list[str]:
    return [r["Properties"]["Handler"] for r in _resources(cfn_or_sam)
            if r.get("Type") in ("AWS::Serverless::Function", "AWS::Lambda::Function")]


def _resources(template: dict) -> list[dict]:
    """Resource bodies (anything else under Resources, e.g. an ``Fn::ForEach``
    entry, is not a resource and stack_shape_problems reports it)."""
    return [r for r in template["Resources"].values() if isinstance(r, dict)]
