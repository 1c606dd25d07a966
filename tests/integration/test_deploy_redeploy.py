"""Redeploys (docs/DEPLOY.md, "Logs" and "Redeploys"), against a moto server: the log groups
outlive their stack (`DeletionPolicy: Retain`, Terraform's `skip_destroy`), so a stack of the
same name deployed again, or the same name moved from SAM to Terraform, must not create a log
group that already exists (`ResourceAlreadyExistsException`).

The SAM stack is template.yaml's three log groups as they are (moto stops short of executing
the whole stack's change set: tests/integration/test_deploy_tools.py), created and deleted with
CloudFormation; Terraform applies infra/aws's log groups (`-target`) with the default
name_prefix, which is also the SAM stack's name. Skips without terraform and its provider
mirror, as test_deploy_tools.py does.
"""

from __future__ import annotations

import json

import boto3

from infra import checks
from tests.integration.test_deploy_tools import OWN_SECRETS_VAR, _run, _terraform_work

STACK = "orphan-cleanup"  # infra/aws's default name_prefix
GROUPS = ("ListerLogGroup", "ClassifierLogGroup", "DeleterLogGroup")


def _sam_log_groups() -> str:
    """template.yaml's log groups (and what their properties refer to), as a template."""
    sam = checks.load_template()
    return json.dumps({
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": {p: sam["Parameters"][p] for p in ("LogRetentionDays", "LogsKmsKeyArn")},
        "Conditions": {"HasLogsKey": sam["Conditions"]["HasLogsKey"]},
        "Resources": {name: sam["Resources"][name] for name in GROUPS},
    })


def _groups(logs) -> set[str]:
    return {g["logGroupName"] for g in logs.describe_log_groups(logGroupNamePrefix="/orphan-cleanup/")["logGroups"]}


def _create_and_delete(cfn, template: str) -> None:
    cfn.create_stack(StackName=STACK, TemplateBody=template)
    assert cfn.describe_stacks(StackName=STACK)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    cfn.delete_stack(StackName=STACK)


def test_a_stack_redeployed_under_the_same_name_and_then_terraform_make_new_log_groups(tmp_path, moto_reset):
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset, region_name="us-east-1")
    logs = boto3.client("logs", endpoint_url=moto_reset, region_name="us-east-1")
    template = _sam_log_groups()
    # given a SAM stack, deleted: its log groups stay, with their logs
    _create_and_delete(cfn, template)
    first = _groups(logs)
    assert len(first) == 3
    # when the same stack name is deployed again: new groups beside the kept ones
    _create_and_delete(cfn, template)
    second = _groups(logs)
    assert len(second) == 6 and first < second
    # and when the same name moves to Terraform (its default name_prefix): the plan creates
    # three log groups, and applying them does not collide with the six kept
    terraform, work, env = _terraform_work(tmp_path, moto_reset)
    (tmp_path / "build" / "aws").mkdir(parents=True)
    (tmp_path / "build" / "aws" / "lambda.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    target = ["-target=aws_cloudwatch_log_group.fn", "-input=false", "-no-color", OWN_SECRETS_VAR]
    plan = _run([terraform, "plan", "-out", "tf.plan", *target], work, env, timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    shown = json.loads(_run([terraform, "show", "-json", "tf.plan"], work, env).stdout)
    planned = [c for c in shown["resource_changes"] if c["type"] == "aws_cloudwatch_log_group"]
    assert [c["change"]["actions"] for c in planned] == [["create"]] * 3
    apply = _run([terraform, "apply", "-input=false", "-no-color", "tf.plan"], work, env, timeout=180)
    assert apply.returncode == 0, apply.stdout[-3000:] + apply.stderr
    third = _groups(logs)
    assert len(third) == 9 and second < third
    # and when the Terraform stack is destroyed (its groups stay; its deployment id goes) and
    # applied again
    destroy = _run([terraform, "destroy", "-auto-approve", "-target=terraform_data.deployment", *target], work, env,
                   timeout=180)
    assert destroy.returncode == 0, destroy.stdout[-3000:] + destroy.stderr
    assert _groups(logs) == third
    again = _run([terraform, "apply", "-auto-approve", *target], work, env, timeout=180)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    fourth = _groups(logs)
    assert len(fourth) == 12 and third < fourth
    # which stack wrote which group shows in its name: the tool, then the stack's name
    assert all(g.startswith(f"/orphan-cleanup/sam/{STACK}/") for g in second)
    assert all(g.startswith(f"/orphan-cleanup/tf/{STACK}/") for g in fourth - second)
