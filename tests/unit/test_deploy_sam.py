"""template.yaml and the target-account template, offline: cfn-lint, the real
SAM translator, and the safety properties of the IAM policies and queues."""

from __future__ import annotations

import copy
import json

import pytest

from infra import checks


@pytest.fixture(scope="module")
def sam() -> dict:
    return checks.load_template(checks.TEMPLATE)


@pytest.fixture(scope="module")
def cfn(sam) -> dict:
    return checks.sam_transform(sam)


def _statement(template: dict, role: str, sid: str) -> dict:
    for policy in template["Resources"][role]["Properties"]["Policies"]:
        for branch in checks.if_branches(policy):
            for st in branch["PolicyDocument"]["Statement"]:
                if st.get("Sid") == sid:
                    return st
    raise KeyError(sid)


# ------------------------------------------------------------------ validity


def test_cfn_lint_is_clean_on_both_templates():
    assert checks.cfn_lint(checks.TEMPLATE) == []
    assert checks.cfn_lint(checks.TARGET_TEMPLATE) == []


def test_sam_transform_yields_the_pipeline(cfn):
    types = {k: v["Type"] for k, v in cfn["Resources"].items()}
    functions = {k for k, t in types.items() if t == "AWS::Lambda::Function"}
    assert functions == {"ListerFunction", "ClassifierFunction", "DeleterFunction"}
    queues = {k for k, t in types.items() if t == "AWS::SQS::Queue"}
    assert {"ListingQueue", "ListingDLQ", "DeleteQueue", "DeleteDLQ"} <= queues
    for fn in functions:
        props = cfn["Resources"][fn]["Properties"]
        assert props["Runtime"] in ("python3.12", "python3.13")
        assert props["Architectures"] == ["arm64"]
        env = props["Environment"]["Variables"]
        assert env["DATABASE_URL_SECRET_ARN"] == {"Ref": "DatabaseUrlSecretArn"}
        assert "DATABASE_URL" not in env
        assert env["POWERTOOLS_SERVICE_NAME"] == "orphan-cleanup"
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "OrphanCleanup"
        assert {"LISTING_QUEUE_URL", "DELETE_QUEUE_URL", "ORPHAN_CLEANUP_MODE"} <= set(env)


def test_event_sources_report_batch_item_failures_and_bound_the_deleter(cfn):
    mappings = checks.resources_of_type(cfn, "AWS::Lambda::EventSourceMapping")
    by_function = {m["Properties"]["FunctionName"]["Ref"]: m["Properties"] for m in mappings.values()}
    assert set(by_function) == {"ClassifierFunction", "DeleterFunction"}
    for props in by_function.values():
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert by_function["DeleterFunction"]["ScalingConfig"]["MaximumConcurrency"] == {"Ref": "DeleterMaxConcurrency"}
    assert by_function["DeleterFunction"]["EventSourceArn"] == {"Fn::GetAtt": ["DeleteQueue", "Arn"]}
    assert by_function["ClassifierFunction"]["EventSourceArn"] == {"Fn::GetAtt": ["ListingQueue", "Arn"]}


def test_queues_have_dlq_redrive_and_visibility_at_least_six_timeouts(cfn):
    assert checks.visibility_problems(cfn) == []
    for queue, dlq in (("ListingQueue", "ListingDLQ"), ("DeleteQueue", "DeleteDLQ")):
        redrive = cfn["Resources"][queue]["Properties"]["RedrivePolicy"]
        assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": [dlq, "Arn"]}
        assert 1 < redrive["maxReceiveCount"] <= 10


def test_visibility_check_catches_a_short_timeout(cfn):
    broken = copy.deepcopy(cfn)
    broken["Resources"]["DeleteQueue"]["Properties"]["VisibilityTimeout"] = 300
    assert any("DeleteQueue: visibility 300s" in p for p in checks.visibility_problems(broken))


def test_one_schedule_per_backend_invokes_the_lister_with_its_id(sam):
    cfn = checks.sam_transform(sam, {**checks.SAMPLE_PARAMETERS, "BackendIds": "aws-prod,aws-dev,aws_eu"})
    schedules = checks.resources_of_type(cfn, "AWS::Scheduler::Schedule")
    inputs = {}
    for s in schedules.values():
        target = s["Properties"]["Target"]
        assert target["Arn"] == {"Fn::GetAtt": ["ListerFunction", "Arn"]}
        inputs[s["Properties"]["Description"]["Fn::Sub"]] = json.loads(target["Input"]["Fn::Sub"])
    assert sorted(p["backend"] for p in inputs.values()) == ["aws-dev", "aws-prod", "aws_eu"]
    # &{BackendId} keeps only letters and digits in the logical id.
    assert set(schedules) == {"Scheduleawsprod", "Scheduleawsdev", "Scheduleawseu"}


def test_alarms_watch_every_dlq_and_function_errors(cfn):
    alarms = checks.resources_of_type(cfn, "AWS::CloudWatch::Alarm").values()
    dlq_alarms = {a["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0] for a in alarms
                  if a["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"}
    assert {"ListingDLQ", "DeleteDLQ", "ListerDLQ"} <= dlq_alarms
    error_alarms = {a["Properties"]["Dimensions"][0]["Value"]["Ref"] for a in alarms
                    if a["Properties"]["MetricName"] == "Errors"}
    assert error_alarms == {"ListerFunction", "ClassifierFunction", "DeleterFunction"}
    for a in alarms:
        assert a["Properties"]["ComparisonOperator"] == "GreaterThanThreshold"
        assert a["Properties"]["Threshold"] == 0


def test_outputs_name_queues_and_functions(sam):
    assert {"ListingQueueUrl", "DeleteQueueUrl", "ListerFunctionName", "ClassifierFunctionName",
            "DeleterFunctionName"} <= set(sam["Outputs"])


def test_sentry_dsn_is_noecho_and_optional_vpc_is_conditional(sam):
    assert sam["Parameters"]["SentryDsn"]["NoEcho"] is True
    assert sam["Globals"]["Function"]["VpcConfig"]["Fn::If"][0] == "HasVpc"


# ------------------------------------------------------------ least privilege


def test_deleter_writes_only_ref_tagged_resources_and_others_write_nothing(cfn):
    assert checks.deleter_policy_problems(cfn) == []
    deleter_grants = checks.ec2_write_grants(checks.role_statements(cfn, "DeleterRole"))
    assert {g.action for g in deleter_grants if g.guard == "tag"} == checks.DELETE_ACTIONS


def test_removing_the_tag_condition_from_the_deleter_is_caught(sam):
    broken = copy.deepcopy(sam)
    del _statement(broken, "DeleterRole", "DeleteOnlyRefTaggedResources")["Condition"]
    problems = checks.deleter_policy_problems(checks.sam_transform(broken))
    assert len([p for p in problems if "is not limited to resources tagged provider_ref" in p]) == 7


def test_one_extra_unconditioned_delete_action_is_caught(sam):
    broken = copy.deepcopy(sam)
    deleter = broken["Resources"]["DeleterRole"]["Properties"]["Policies"]
    deleter.append({"PolicyName": "oops", "PolicyDocument": {"Version": "2012-10-17", "Statement": [
        {"Sid": "Oops", "Effect": "Allow", "Action": "ec2:DeleteVolume", "Resource": "*"}]}})
    assert checks.deleter_policy_problems(checks.sam_transform(broken)) == [
        "deleter: ec2:DeleteVolume (statement Oops) is not limited to resources tagged provider_ref"]


def test_a_condition_that_is_not_a_guard_is_caught(sam):
    for condition in ({"StringLikeIfExists": {"aws:ResourceTag/provider_ref": "????????????"}},
                      {"StringLike": {"aws:ResourceTag/provider_ref": "*"}},
                      {"StringLike": {"aws:ResourceTag/other_tag": "????????????"}}):
        broken = copy.deepcopy(sam)
        _statement(broken, "DeleterRole", "DeleteOnlyRefTaggedResources")["Condition"] = condition
        assert checks.deleter_policy_problems(checks.sam_transform(broken)), condition


def test_a_missing_delete_action_and_a_managed_policy_are_caught(sam):
    broken = copy.deepcopy(sam)
    st = _statement(broken, "DeleterRole", "DeleteOnlyRefTaggedResources")
    st["Action"] = [a for a in st["Action"] if a != "ec2:ReleaseAddress"]
    broken["Resources"]["ListerRole"]["Properties"]["ManagedPolicyArns"] = [
        "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"]
    problems = checks.deleter_policy_problems(checks.sam_transform(broken))
    assert "deleter: lacks ec2:ReleaseAddress under the tag condition" in problems
    assert any(p.startswith("lister: * (statement managed policy") for p in problems)


def test_lambda_vpc_interface_grant_cannot_be_used_by_function_code(sam):
    st = _statement(sam, "DeleterRole", "LambdaManagedInterfacesOnly")
    assert st["Condition"] == {"Null": {"lambda:SourceFunctionArn": "true"}}
    broken = copy.deepcopy(sam)
    _statement(broken, "ListerRole", "LambdaManagedInterfacesOnly")["Action"].append("ec2:TerminateInstances")
    assert checks.deleter_policy_problems(checks.sam_transform(broken)) == [
        "lister: ec2:TerminateInstances (statement LambdaManagedInterfacesOnly) is not limited to "
        "resources tagged provider_ref"]


def test_protected_resources_are_denied_explicitly(sam):
    st = _statement(sam, "DeleterRole", "NeverTouchProtectedResources")
    assert st["Effect"] == "Deny"
    assert set(st["Action"]) == checks.DELETE_ACTIONS
    assert st["Condition"] == {"Null": {"aws:ResourceTag/orphan-cleanup-protect": "false"}}


def test_roles_read_only_the_database_secret_and_their_own_queues(cfn):
    for role in ("ListerRole", "ClassifierRole", "DeleterRole"):
        statements = checks.role_statements(cfn, role)
        secret = [s for s in statements if "secretsmanager:GetSecretValue" in checks.as_list(s["Action"])]
        assert [s["Resource"] for s in secret] == [{"Ref": "DatabaseUrlSecretArn"}]
        assert not any("secretsmanager:*" in checks.as_list(s["Action"]) for s in statements)
    sends = {role: {s["Resource"]["Fn::GetAtt"][0] for s in checks.role_statements(cfn, role)
                    if checks.as_list(s["Action"]) == ["sqs:SendMessage"]}
             for role in ("ListerRole", "ClassifierRole", "DeleterRole")}
    assert sends == {"ListerRole": {"ListingQueue", "ListerDLQ"}, "ClassifierRole": {"DeleteQueue"},
                     "DeleterRole": set()}


def test_cross_account_assume_role_only_for_lister_and_deleter(cfn):
    assumers = {role for role in ("ListerRole", "ClassifierRole", "DeleterRole")
                if any("sts:AssumeRole" in checks.as_list(s["Action"]) for s in checks.role_statements(cfn, role))}
    assert assumers == {"ListerRole", "DeleterRole"}


def test_target_account_role_has_the_same_conditioned_policy():
    target = checks.load_template(checks.TARGET_TEMPLATE)
    assert checks.target_role_problems(target) == []
    broken = copy.deepcopy(target)
    _statement(broken, "TargetRole", "DeleteOnlyRefTaggedResources").pop("Condition")
    del broken["Resources"]["TargetRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Condition"]
    problems = checks.target_role_problems(broken)
    assert "TargetRole: trust statement without an sts:ExternalId condition" in problems
    assert any("ec2:TerminateInstances (statement DeleteOnlyRefTaggedResources) is not limited" in p for p in problems)


def test_sam_deleter_and_target_role_grant_identical_delete_statements(sam):
    target = checks.load_template(checks.TARGET_TEMPLATE)
    for sid in ("DeleteOnlyRefTaggedResources", "NeverTouchProtectedResources"):
        assert _statement(sam, "DeleterRole", sid) == _statement(target, "TargetRole", sid)


def test_docs_cover_parameters_and_every_delete_action(sam):
    readme = (checks.REPO / "infra" / "README.md").read_text()
    for name in list(sam["Parameters"]) + list(sam["Outputs"]):
        assert f"| `{name}` |" in readme, f"{name} is not in infra/README.md"
    deploy = (checks.REPO / "docs" / "DEPLOY.md").read_text()
    for action in checks.DELETE_ACTIONS:
        assert action in deploy
    assert "aws lambda invoke" in deploy and "sam deploy --guided" in deploy and "terraform apply" in deploy
