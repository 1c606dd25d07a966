"""template.yaml and the target-account template, offline: cfn-lint, the real
SAM translator, and the safety properties of the IAM policies and queues."""

from __future__ import annotations

import copy
import json
import re

import pytest

from infra import checks, package

SEVERAL_KEYS = {"ProtectTagKeys": ",".join(checks.SAMPLE_PROTECT_KEYS)}


@pytest.fixture(scope="module")
def sam() -> dict:
    return checks.load_template(checks.TEMPLATE)


@pytest.fixture(scope="module")
def cfn(sam) -> dict:
    return checks.sam_transform(sam)


@pytest.fixture(scope="module")
def target() -> dict:
    return checks.load_template(checks.TARGET_TEMPLATE)


def _statement(template: dict, role: str, sid: str) -> dict:
    """A statement of a role's inline policies, by Sid (documents written as
    JSON strings must have been resolved with checks.with_resolved_policies)."""
    for policy in template["Resources"][role]["Properties"]["Policies"]:
        for branch in checks.if_branches(policy):
            for st in branch["PolicyDocument"].get("Statement", []):
                if st.get("Sid") == sid:
                    return st
    raise KeyError(sid)


def _denies(statements: list[dict]) -> list[dict]:
    return [s for s in statements if s["Effect"] == "Deny"]


# ------------------------------------------------------------------ validity


def test_cfn_lint_is_clean_on_both_templates():
    assert checks.cfn_lint(checks.TEMPLATE) == []
    assert checks.cfn_lint(checks.TARGET_TEMPLATE) == []


def test_sam_transform_yields_the_pipeline(cfn):
    types = {k: v["Type"] for k, v in cfn["Resources"].items()}
    functions = {k for k, t in types.items() if t == "AWS::Lambda::Function"}
    assert functions == {"ListerFunction", "ClassifierFunction", "DeleterFunction"}
    queues = {k for k, t in types.items() if t == "AWS::SQS::Queue"}
    assert queues == {"JobsQueue", "JobsDLQ", "ListingQueue", "ListingDLQ", "DeleteQueue", "DeleteDLQ", "ListerDLQ"}
    for fn in functions:
        props = cfn["Resources"][fn]["Properties"]
        own = fn.removesuffix("Function")
        # The bundle's wheels and bytecode are built for this interpreter (infra/package.py).
        assert props["Runtime"] == "python3.11" == "python{}.{}".format(*package.LAMBDA_PYTHON)
        assert props["Architectures"] == ["arm64"]
        env = props["Environment"]["Variables"]
        # its own database role's secret, the shared one only by choice (docs/DATABASE.md)
        assert env["DATABASE_URL_SECRET_ARN"] == {"Fn::If": ["SharedDatabaseRole", {"Ref": "DatabaseUrlSecretArn"},
                                                             {"Ref": f"{own}DatabaseUrlSecretArn"}]}
        assert "DATABASE_URL" not in env
        assert env["POWERTOOLS_SERVICE_NAME"] == "orphan-cleanup"
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "OrphanCleanup"
        assert env["JOBS_QUEUE_URL"] == {"Ref": "JobsQueue"}
        assert {"LISTING_QUEUE_URL", "DELETE_QUEUE_URL", "ORPHAN_CLEANUP_MODE"} <= set(env)


def test_the_stack_shape_checks_pass(sam, cfn):
    assert checks.stack_shape_problems(sam, cfn) == []


def test_no_language_extensions_and_no_foreach(sam):
    assert sam["Transform"] == "AWS::Serverless-2016-10-31"
    assert "BackendIds" not in sam["Parameters"]
    broken = copy.deepcopy(sam)
    broken["Transform"] = ["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"]
    broken["Resources"]["Fn::ForEach::BackendSchedules"] = ["Id", ["a"], {"Schedule&{Id}": {}}]
    broken["Globals"]["Function"]["CodeUri"] = "build/aws/lambda.zip"
    assert checks.transform_problems(broken) == [
        "Transform is ['AWS::LanguageExtensions', 'AWS::Serverless-2016-10-31'], expected only "
        "AWS::Serverless-2016-10-31",
        "/Resources/Fn::ForEach::BackendSchedules: Fn::ForEach (one schedule per stack, no per-backend resources)",
        "Globals.Function.CodeUri: put CodeUri on each function (sam build leaves Globals as is)"]


def test_exactly_one_schedule_ticks_the_lister_with_an_empty_object(cfn):
    schedules = checks.resources_of_type(cfn, "AWS::Scheduler::Schedule")
    assert list(schedules) == ["TickSchedule"]
    props = schedules["TickSchedule"]["Properties"]
    assert props["ScheduleExpression"] == {"Ref": "ScheduleExpression"}
    assert props["Target"]["Arn"] == {"Fn::GetAtt": ["ListerFunction", "Arn"]}
    assert json.loads(props["Target"]["Input"]) == {}
    assert checks.resources_of_type(cfn, "AWS::Events::Rule") == {}
    assert checks.schedule_problems(cfn) == []


def test_a_second_schedule_or_a_backend_in_the_input_is_caught(cfn):
    two = copy.deepcopy(cfn)
    two["Resources"]["ScheduleAwsProd"] = copy.deepcopy(two["Resources"]["TickSchedule"])
    assert checks.schedule_problems(two) == [
        "2 schedules (ScheduleAwsProd, TickSchedule); expected one tick"]
    per_backend = copy.deepcopy(cfn)
    per_backend["Resources"]["TickSchedule"]["Properties"]["Target"]["Input"] = '{"backend": "aws-prod"}'
    assert checks.schedule_problems(per_backend) == [
        """TickSchedule: input '{"backend": "aws-prod"}', expected {} (the tick)"""]


def test_the_lister_consumes_the_jobs_queue_one_job_at_a_time(cfn):
    mappings = checks.resources_of_type(cfn, "AWS::Lambda::EventSourceMapping")
    by_function = {m["Properties"]["FunctionName"]["Ref"]: m["Properties"] for m in mappings.values()}
    assert set(by_function) == {"ListerFunction", "ClassifierFunction", "DeleterFunction"}
    jobs = by_function["ListerFunction"]
    assert jobs["EventSourceArn"] == {"Fn::GetAtt": ["JobsQueue", "Arn"]}
    assert jobs["BatchSize"] == 1
    assert jobs["ScalingConfig"]["MaximumConcurrency"] == {"Ref": "ListerMaxConcurrency"}
    assert cfn["Parameters"]["ListerMaxConcurrency"]["Default"] == 5
    assert cfn["Parameters"]["ListerMaxConcurrency"]["MinValue"] == 2
    for props in by_function.values():
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert by_function["DeleterFunction"]["ScalingConfig"]["MaximumConcurrency"] == {"Ref": "DeleterMaxConcurrency"}
    assert by_function["DeleterFunction"]["EventSourceArn"] == {"Fn::GetAtt": ["DeleteQueue", "Arn"]}
    assert by_function["ClassifierFunction"]["EventSourceArn"] == {"Fn::GetAtt": ["ListingQueue", "Arn"]}
    assert checks.queue_wiring_problems(cfn) == []


def test_jobs_queue_wiring_breaks_are_caught(sam):
    no_consume = checks.with_resolved_policies(sam)
    for policy in no_consume["Resources"]["ListerRole"]["Properties"]["Policies"]:
        if isinstance(policy, dict) and policy.get("PolicyName") == "list":
            policy["PolicyDocument"]["Statement"] = [s for s in policy["PolicyDocument"]["Statement"]
                                                     if s["Sid"] != "ConsumeListingJobs"]
    problems = checks.queue_wiring_problems(checks.sam_transform(no_consume))
    assert "ListerRole: lacks sqs:ReceiveMessage on JobsQueue" in problems
    extra_sender = checks.with_resolved_policies(sam)
    extra_sender["Resources"]["DeleterRole"]["Properties"]["Policies"].append({
        "PolicyName": "oops", "PolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": {"Fn::GetAtt": ["JobsQueue", "Arn"]}}]}})
    assert checks.queue_wiring_problems(checks.sam_transform(extra_sender)) == [
        "JobsQueue: roles that may send ['DeleterRole', 'ListerRole'], expected only ListerRole"]


def test_queues_have_dlq_redrive_and_visibility_at_least_six_timeouts(cfn):
    assert checks.visibility_problems(cfn) == []
    for queue, dlq in (("JobsQueue", "JobsDLQ"), ("ListingQueue", "ListingDLQ"), ("DeleteQueue", "DeleteDLQ")):
        redrive = cfn["Resources"][queue]["Properties"]["RedrivePolicy"]
        assert redrive["deadLetterTargetArn"] == {"Fn::GetAtt": [dlq, "Arn"]}
        assert 1 < redrive["maxReceiveCount"] <= 10
    jobs = cfn["Resources"]["JobsQueue"]["Properties"]
    assert jobs["VisibilityTimeout"] >= 6 * cfn["Resources"]["ListerFunction"]["Properties"]["Timeout"] == 1800
    assert jobs["RedrivePolicy"]["maxReceiveCount"] == 3


def test_visibility_check_catches_a_short_timeout(cfn):
    broken = copy.deepcopy(cfn)
    broken["Resources"]["JobsQueue"]["Properties"]["VisibilityTimeout"] = 900
    assert checks.visibility_problems(broken) == [
        "JobsQueue: visibility 900s < 6 x ListerFunction timeout 300s + window 0s"]


def test_alarms_watch_every_dlq_and_function_errors(cfn):
    alarms = checks.resources_of_type(cfn, "AWS::CloudWatch::Alarm").values()
    dlq_alarms = {a["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0] for a in alarms
                  if a["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"}
    assert dlq_alarms == {"JobsDLQ", "ListingDLQ", "DeleteDLQ", "ListerDLQ"}
    error_alarms = {a["Properties"]["Dimensions"][0]["Value"]["Ref"] for a in alarms
                    if a["Properties"]["MetricName"] == "Errors"}
    assert error_alarms == {"ListerFunction", "ClassifierFunction", "DeleterFunction"}
    for a in alarms:  # the staleness and stopped-tick alarms: tests/unit/test_deploy_alarms.py
        if a["Properties"]["MetricName"] in ("ApproximateNumberOfMessagesVisible", "Errors"):
            assert a["Properties"]["ComparisonOperator"] == "GreaterThanThreshold"
            assert a["Properties"]["Threshold"] == 0
    broken = copy.deepcopy(cfn)
    del broken["Resources"]["JobsDLQAlarm"]
    assert checks.dead_letter_alarm_problems(broken) == ["JobsDLQ: no alarm on its depth"]


def test_outputs_name_queues_and_functions(sam):
    assert {"JobsQueueUrl", "JobsDLQUrl", "ListingQueueUrl", "DeleteQueueUrl", "ListerFunctionName",
            "ClassifierFunctionName", "DeleterFunctionName", "TickScheduleName", "ListerRoleArn",
            "DeleterRoleArn"} <= set(sam["Outputs"])
    # C5: a manual run is still {"backend": "ID"} to the lister.
    assert '{"backend":"ID"}' in sam["Outputs"]["ListerFunctionName"]["Description"]


def test_sentry_dsn_is_noecho_and_optional_vpc_is_conditional(sam):
    assert sam["Parameters"]["SentryDsn"]["NoEcho"] is True
    assert sam["Globals"]["Function"]["VpcConfig"]["Fn::If"][0] == "HasVpc"


# -------------------------------------------------------------- queue access


def test_only_each_queues_producer_may_send_and_tls_is_required(cfn):
    assert checks.queue_policy_problems(cfn) == []
    policies = checks.resources_of_type(cfn, "AWS::SQS::QueuePolicy")
    listing = next(p["Properties"] for p in policies.values() if p["Properties"]["Queues"] == [{"Ref": "ListingQueue"}])
    only = next(s for s in listing["PolicyDocument"]["Statement"] if s["Sid"] == "OnlyTheProducerSends")
    assert only["Effect"] == "Deny" and only["Principal"] == "*" and only["Action"] == "sqs:SendMessage"
    assert only["Condition"]["ArnNotLike"]["aws:PrincipalArn"] == {"Fn::If": [
        "HasRedriveRole", [{"Fn::GetAtt": ["ListerRole", "Arn"]}, {"Ref": "RedriveRoleArn"}],
        [{"Fn::GetAtt": ["ListerRole", "Arn"]}]]}


def test_a_queue_policy_admitting_another_sender_or_dropping_tls_is_caught(cfn):
    policies = checks.resources_of_type(cfn, "AWS::SQS::QueuePolicy")
    delete_id = next(k for k, p in policies.items() if p["Properties"]["Queues"] == [{"Ref": "DeleteQueue"}])
    jobs_id = next(k for k, p in policies.items() if p["Properties"]["Queues"] == [{"Ref": "JobsQueue"}])
    broken = copy.deepcopy(cfn)
    only = next(s for s in broken["Resources"][delete_id]["Properties"]["PolicyDocument"]["Statement"]
                if s["Sid"] == "OnlyTheProducerSends")
    only["Condition"]["ArnNotLike"]["aws:PrincipalArn"] = [{"Fn::GetAtt": ["ClassifierRole", "Arn"]},
                                                           {"Fn::GetAtt": ["DeleterRole", "Arn"]}]
    statements = broken["Resources"][jobs_id]["Properties"]["PolicyDocument"]["Statement"]
    statements[:] = [s for s in statements if s["Sid"] != "DenyInsecureTransport"]
    assert checks.queue_policy_problems(broken) == [
        "JobsQueue: no Deny of sqs:* without TLS",
        "DeleteQueue: no Deny of sqs:SendMessage for principals other than ClassifierRole"]


def test_queues_are_encrypted_with_sqs_keys_or_the_given_kms_key(sam, cfn):
    for q in checks.resources_of_type(cfn, "AWS::SQS::Queue").values():
        props = q["Properties"]
        assert props["SqsManagedSseEnabled"] == {"Fn::If": ["HasQueueKey", {"Ref": "AWS::NoValue"}, True]}
        assert props["KmsMasterKeyId"] == {"Fn::If": ["HasQueueKey", {"Ref": "QueueKmsKeyArn"},
                                                      {"Ref": "AWS::NoValue"}]}
    assert sam["Parameters"]["QueueKmsKeyArn"]["Default"] == ""
    assert checks.queue_encryption_problems(cfn) == []
    lister_key = _statement(sam, "ListerRole", "EncryptAndDecryptQueueMessages")
    assert set(lister_key["Action"]) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert lister_key["Condition"] == {
        "StringEquals": {"kms:ViaService": {"Fn::Sub": "sqs.${AWS::Region}.amazonaws.com"}}}
    assert _statement(sam, "DeleterRole", "DecryptQueueMessages")["Action"] == "kms:Decrypt"
    broken = copy.deepcopy(cfn)
    policies = broken["Resources"]["ClassifierRole"]["Properties"]["Policies"]
    policies[:] = [p for p in policies if "HasQueueKey" not in json.dumps(p)]
    assert checks.queue_encryption_problems(broken) == [
        "ClassifierRole: lacks kms:Decrypt on QueueKmsKeyArn (ListingQueue)",
        "ClassifierRole: lacks kms:GenerateDataKey on QueueKmsKeyArn (DeleteQueue)"]


# ------------------------------------------------------------ least privilege


def test_deleter_writes_only_ref_tagged_resources_and_others_write_nothing(cfn):
    assert checks.deleter_policy_problems(cfn) == []
    deleter_grants = checks.ec2_write_grants(checks.role_statements(cfn, "DeleterRole"))
    assert {g.action for g in deleter_grants if g.guard == "tag"} == checks.DELETE_ACTIONS


def test_the_delete_policy_string_is_valid_json_with_unique_sids(sam):
    for keys in ("orphan-cleanup-protect", "a,b:c,d/e@f"):
        values = checks.parameter_values(sam, {"ProtectTagKeys": keys})
        branch = next(p for p in sam["Resources"]["DeleterRole"]["Properties"]["Policies"]
                      if isinstance(p, dict) and p.get("PolicyName") == "delete")
        document = checks.policy_document(branch["PolicyDocument"], values)
        assert document["Version"] == "2012-10-17"
        sids = [s["Sid"] for s in document["Statement"] if "Sid" in s]
        assert len(sids) == len(set(sids))  # IAM refuses repeated Sids
        assert len(_denies(document["Statement"])) == len(keys.split(","))


def test_every_configured_protect_key_gets_its_own_deny(cfn):
    keys = ["orphan-cleanup-protect", "platform-keep", "team:hold"]
    statements = checks.role_statements(cfn, "DeleterRole", {"ProtectTagKeys": ",".join(keys)})
    denies = _denies(statements)
    assert [d["Condition"] for d in denies] == [{"Null": {f"aws:ResourceTag/{k}": "false"}} for k in keys]
    for d in denies:
        assert set(d["Action"]) == checks.DELETE_ACTIONS and d["Resource"] == "*"
    assert checks.protect_deny_problems(statements, keys, "deleter") == []
    assert checks.protect_deny_problems(statements, [*keys, "other"], "deleter") == [
        "deleter: no Deny of the deletes on resources tagged other"]
    assert checks.deleter_policy_problems(cfn, SEVERAL_KEYS) == []


def test_the_tag_key_parameter_reaches_the_allow_condition(cfn):
    statements = checks.role_statements(cfn, "DeleterRole", {"TagKey": "platform_ref"})
    allow = next(s for s in statements if s.get("Sid") == "DeleteOnlyRefTaggedResources")
    assert allow["Condition"] == {"StringLike": {"aws:ResourceTag/platform_ref": "????????????"}}
    assert checks.deleter_policy_problems(cfn, {"TagKey": "platform_ref"}) == []
    grants = checks.ec2_write_grants(statements, "provider_ref")
    # Read with the default key, the deletes are unguarded: the condition names platform_ref.
    assert {g.guard for g in grants if g.sid == "DeleteOnlyRefTaggedResources"} == {None}


def test_removing_the_tag_condition_from_the_deleter_is_caught(sam):
    broken = checks.with_resolved_policies(sam)
    del _statement(broken, "DeleterRole", "DeleteOnlyRefTaggedResources")["Condition"]
    problems = checks.deleter_policy_problems(checks.sam_transform(broken))
    unlimited = [p for p in problems if "is not limited to resources tagged provider_ref" in p]
    # every delete of that statement: DeleteSnapshot has a statement of its own (below)
    assert len(unlimited) == len(checks.DELETE_ACTIONS - {"ec2:DeleteSnapshot"})


@pytest.mark.parametrize("condition", [
    {"StringLike": {"aws:ResourceTag/orphan-cleanup-source": "vol-*"}},  # no ref tag
    {"StringLike": {"aws:ResourceTag/provider_ref": "????????????"}},  # no source tag
    # the source tag's presence alone: any value, a backup or a copy that carries it (SAFETY.md rule 15)
    {"StringLike": {"aws:ResourceTag/provider_ref": "????????????"},
     "Null": {"aws:ResourceTag/orphan-cleanup-source": "false"}},
    {"StringLike": {"aws:ResourceTag/provider_ref": "????????????", "aws:ResourceTag/orphan-cleanup-source": "*"}},
])
def test_deleting_snapshots_without_the_ref_or_the_source_volume_is_caught(sam, condition):
    # the deleter may delete only the snapshots it took itself, their source tag a volume id
    broken = checks.with_resolved_policies(sam)
    _statement(broken, "DeleterRole", "DeleteOnlySnapshotsTheDeleterTook")["Condition"] = condition
    problems = checks.deleter_policy_problems(checks.sam_transform(broken))
    assert any("ec2:DeleteSnapshot (statement DeleteOnlySnapshotsTheDeleterTook) is not limited" in p
               for p in problems), problems


def test_snapshots_are_created_with_their_source_volume_tag(sam):
    # the source tag is set as the snapshot is created, a volume id (SAFETY.md rule 15)
    for sid in ("SnapshotsCarryTheRef", "TagSnapshotsAsTheyAreCreated"):
        broken = checks.with_resolved_policies(sam)
        del _statement(broken, "DeleterRole", sid)["Condition"]["StringLike"]["aws:RequestTag/orphan-cleanup-source"]
        problems = checks.deleter_policy_problems(checks.sam_transform(broken))
        assert any(f"(statement {sid}) is not limited" in p for p in problems), (sid, problems)


@pytest.mark.parametrize(("sid", "drop", "action"), [
    ("TagSnapshotsAsTheyAreCreated", "StringEquals", "ec2:CreateTags"),  # could re-tag anything as ours
    ("TagSnapshotsAsTheyAreCreated", "StringLike", "ec2:CreateTags"),
    ("SnapshotsCarryTheRef", "StringLike", "ec2:CreateSnapshot"),
])
def test_snapshot_writes_without_their_conditions_are_caught(sam, sid, drop, action):
    broken = checks.with_resolved_policies(sam)
    del _statement(broken, "DeleterRole", sid)["Condition"][drop]
    problems = checks.deleter_policy_problems(checks.sam_transform(broken))
    assert f"deleter: {action} (statement {sid}) is not limited to resources tagged provider_ref" in problems


def test_dropping_a_protect_deny_is_caught(sam):
    broken = checks.with_resolved_policies(sam)
    for policy in broken["Resources"]["DeleterRole"]["Properties"]["Policies"]:
        if isinstance(policy, dict) and policy.get("PolicyName") == "delete":
            policy["PolicyDocument"]["Statement"] = [s for s in policy["PolicyDocument"]["Statement"]
                                                     if s["Effect"] != "Deny"]
    assert checks.deleter_policy_problems(checks.sam_transform(broken)) == [
        "deleter: no Deny of the deletes on resources tagged orphan-cleanup-protect"]


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
        broken = checks.with_resolved_policies(sam)
        _statement(broken, "DeleterRole", "DeleteOnlyRefTaggedResources")["Condition"] = condition
        assert checks.deleter_policy_problems(checks.sam_transform(broken)), condition


def test_a_missing_delete_action_and_a_managed_policy_are_caught(sam):
    broken = checks.with_resolved_policies(sam)
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
    broken = checks.with_resolved_policies(sam)
    _statement(broken, "ListerRole", "LambdaManagedInterfacesOnly")["Action"].append("ec2:TerminateInstances")
    assert checks.deleter_policy_problems(checks.sam_transform(broken)) == [
        "lister: ec2:TerminateInstances (statement LambdaManagedInterfacesOnly) is not limited to "
        "resources tagged provider_ref"]


def test_roles_read_only_the_database_secret_and_their_own_queues(cfn):
    for role in ("ListerRole", "ClassifierRole", "DeleterRole"):
        statements = checks.role_statements(cfn, role)
        secret = [s for s in statements if "secretsmanager:GetSecretValue" in checks.as_list(s["Action"])]
        # the ledger's URL (the function's own, the shared one only by choice), and the Slack
        # webhook's (only with SlackWebhookSecretArn: an !If policy)
        own = role.removesuffix("Role")
        assert [s["Resource"] for s in secret] == [{"Fn::If": ["SharedDatabaseRole", {"Ref": "DatabaseUrlSecretArn"},
                                                              {"Ref": f"{own}DatabaseUrlSecretArn"}]},
                                                  {"Ref": "SlackWebhookSecretArn"}]
        assert not any("secretsmanager:*" in checks.as_list(s["Action"]) for s in statements)
    sends = {role: {s["Resource"]["Fn::GetAtt"][0] for s in checks.role_statements(cfn, role)
                    if checks.as_list(s["Action"]) == ["sqs:SendMessage"]}
             for role in ("ListerRole", "ClassifierRole", "DeleterRole")}
    assert sends == {"ListerRole": {"JobsQueue", "ListingQueue", "ListerDLQ"}, "ClassifierRole": {"DeleteQueue"},
                     "DeleterRole": set()}


def test_the_lister_assumes_only_list_roles_and_the_deleter_only_delete_roles(cfn):
    assumed = {role: [s["Resource"] for s in checks.role_statements(cfn, role)
                      if "sts:AssumeRole" in checks.as_list(s["Action"])]
               for role in ("ListerRole", "ClassifierRole", "DeleterRole")}
    assert {r: [b for st in a for b in checks.if_branches(st) if isinstance(b, dict)] for r, a in assumed.items()} == {
        "ListerRole": [{"Ref": "TargetListRoleArnPattern"}], "ClassifierRole": [],
        "DeleterRole": [{"Ref": "TargetDeleteRoleArnPattern"}]}
    assert "TargetRoleArnPattern" not in cfn["Parameters"]


# ------------------------------------------------------------ target account


def test_target_account_has_a_list_role_and_a_delete_role(target):
    assert checks.target_role_problems(target) == []
    assert checks.target_role_problems(target, SEVERAL_KEYS) == []
    roles = checks.resources_of_type(target, "AWS::IAM::Role")
    assert set(roles) == {"ListRole", "DeleteRole"}
    trust = {r: roles[r]["Properties"]["AssumeRolePolicyDocument"]["Statement"] for r in roles}
    assert [s["Principal"] for s in trust["ListRole"]] == [{"AWS": {"Ref": "ListerRoleArn"}}]
    assert [s["Principal"] for s in trust["DeleteRole"]] == [{"AWS": {"Ref": "DeleterRoleArn"}}]
    listing = checks.role_statements(target, "ListRole")
    assert {a for s in listing for a in checks.as_list(s["Action"])} == checks.DESCRIBE_ACTIONS
    assert set(target["Outputs"]) == {"ListRoleArn", "DeleteRoleArn"}


def test_target_role_mistakes_are_caught(target):
    broken = checks.with_resolved_policies(target)
    broken["Resources"]["ListRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][0]["Action"].append(
        "ec2:TerminateInstances")
    _statement(broken, "DeleteRole", "DeleteOnlyRefTaggedResources").pop("Condition")
    delete_trust = broken["Resources"]["DeleteRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]
    delete_trust["Principal"] = {"AWS": [{"Ref": "DeleterRoleArn"}, {"Ref": "ListerRoleArn"}]}
    del delete_trust["Condition"]
    problems = checks.target_role_problems(broken)
    assert "ListRole: may ec2:TerminateInstances (statement DescribeTaggedResources); the list role only describes" \
        in problems
    assert 'DeleteRole: trusts {"AWS": [{"Ref": "DeleterRoleArn"}, {"Ref": "ListerRoleArn"}]}, not only ' \
        'DeleterRoleArn' in problems
    assert "DeleteRole: trust statement without an sts:ExternalId condition" in problems
    assert any("ec2:TerminateInstances (statement DeleteOnlyRefTaggedResources) is not limited" in p for p in problems)


def test_target_delete_role_denies_every_configured_protect_key(target):
    keys = ["orphan-cleanup-protect", "platform-keep"]
    denies = _denies(checks.role_statements(target, "DeleteRole", {"ProtectTagKeys": ",".join(keys)}))
    assert [d["Condition"] for d in denies] == [{"Null": {f"aws:ResourceTag/{k}": "false"}} for k in keys]
    assert checks.role_statements(target, "ListRole") and not _denies(checks.role_statements(target, "ListRole"))


def test_sam_deleter_and_target_delete_role_grant_identical_delete_statements(sam, target):
    for parameters in (None, SEVERAL_KEYS, {"TagKey": "ref", "ProtectTagKeys": "x,y,z"}):
        ours = checks.with_resolved_policies(sam, parameters)["Resources"]["DeleterRole"]
        theirs = checks.with_resolved_policies(target, parameters)["Resources"]["DeleteRole"]
        delete = [next(p for p in r["Properties"]["Policies"] if p.get("PolicyName") == "delete")
                  for r in (ours, theirs)]
        assert delete[0]["PolicyDocument"] == delete[1]["PolicyDocument"]


# ---------------------------------------------------------------- intrinsics


def test_the_intrinsics_evaluator_handles_what_the_templates_use():
    values = {"Keys": ["a", "b"], "Name": "x"}
    assert checks.resolve({"Fn::Sub": "${Name}-${AWS::Partition}-${!Literal}"}, values) == "x-aws-${Literal}"
    assert checks.resolve({"Fn::Sub": ["[${J}]", {"J": {"Fn::Join": ["|", {"Ref": "Keys"}]}}]}, values) == "[a|b]"
    with pytest.raises(checks.Unresolved):
        checks.resolve({"Fn::Sub": "${Role.Arn}"}, values)
    with pytest.raises(checks.Unresolved):
        checks.resolve({"Fn::Join": [",", [{"Fn::GetAtt": ["Q", "Arn"]}]]}, values)


# --------------------------------------------------------------------- docs


def test_docs_cover_parameters_and_every_delete_action(sam, target):
    readme = (checks.REPO / "infra" / "README.md").read_text()
    for name in list(sam["Parameters"]) + list(sam["Outputs"]):
        assert f"| `{name}` |" in readme, f"{name} is not in infra/README.md"
    for name in list(target["Parameters"]) + list(target["Outputs"]):
        assert f"`{name}`" in readme, f"target {name} is not in infra/README.md"
    deploy = (checks.REPO / "docs" / "DEPLOY.md").read_text()
    for action in checks.DELETE_ACTIONS:
        assert action in deploy
    for text in ("aws lambda invoke", "sam validate --lint", "sam build", "sam deploy --guided", "terraform apply",
                 "role_arn", "delete_role_arn", "ProtectTagKeys", "QueueKmsKeyArn", "pubsub_kms_key_name",
                 "DATABASE.md", "python3 -m venv"):
        assert text in deploy, text
    for gone in ("BackendIds", "LanguageExtensions", "TargetRoleArnPattern", "CAPABILITY_AUTO_EXPAND"):
        assert gone not in deploy, gone


# ------------------------------------------------------------ managed databases


def test_the_secret_arn_accepts_the_secrets_rds_manages(sam):
    pattern = re.compile(sam["Parameters"]["DatabaseUrlSecretArn"]["AllowedPattern"])
    for arn in ("arn:aws:secretsmanager:us-east-1:123456789012:secret:"
                "rds!db-3c1f8c6e-0b2d-4f5a-9e8b-1a2b3c4d5e6f-AbCdEf",
                "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rds!cluster-0a1b2c3d-AbCdEf",
                "arn:aws:secretsmanager:us-east-1:123456789012:secret:orphan-cleanup/database-url-AbCdEf"):
        assert pattern.fullmatch(arn), arn
    assert not pattern.fullmatch("arn:aws:secretsmanager:us-east-1:123456789012:secret:*")


def test_iam_auth_grants_rds_db_connect_for_the_functions_own_user_and_sets_the_variables(sam, cfn):
    for role in ("ListerRole", "ClassifierRole", "DeleterRole"):
        st = _statement(sam, role, "ConnectAsItsOwnDatabaseUser")
        assert st["Action"] == "rds-db:connect"
        granting = [p for p in cfn["Resources"][role]["Properties"]["Policies"] if "rds-db:connect" in json.dumps(p)]
        assert [p["Fn::If"][0] for p in granting] == ["HasDatabaseIamAuth"]  # only when enabled
    env = sam["Globals"]["Function"]["Environment"]["Variables"]
    assert env["DATABASE_IAM_AUTH"] == {"Fn::If": ["HasDatabaseIamAuth", "true", {"Ref": "AWS::NoValue"}]}
    # what each deployment gets: its own user (or the shared one by choice), as its DATABASE_USER too
    assert checks.database_role_problems(sam) == []
    view = checks.deployed(sam, {**checks.SAMPLE_PARAMETERS, "DatabaseIamResourceId": "db-ABC123"})
    for fn in ("lister", "classifier", "deleter"):
        (connect,) = [s for s in view.statements[fn] if s["Action"] == "rds-db:connect"]
        assert connect["Resource"] == f"arn:aws:rds-db:us-east-1:123456789012:dbuser:db-ABC123/orphan_cleanup_{fn}"
        assert view.environment[fn]["DATABASE_USER"] == f"orphan_cleanup_{fn}"


# ------------------------------------------------------------ one role per function


def test_each_function_reads_its_own_secret_by_default_and_a_missing_one_is_refused(sam):
    # docs/DATABASE.md, "One role per function": the default deploys no shared secret
    refused = checks.deployed(sam, {}).refused
    assert refused and "ListerDatabaseUrlSecretArn" in refused[0]
    view = checks.deployed(sam, checks.SAMPLE_PARAMETERS)
    assert view.refused == []
    for fn in ("lister", "classifier", "deleter"):
        own = checks.SAMPLE_PARAMETERS[f"{fn.title()}DatabaseUrlSecretArn"]
        assert view.environment[fn]["DATABASE_URL_SECRET_ARN"] == own
        reads = [s["Resource"] for s in view.statements[fn] if s["Action"] == "secretsmanager:GetSecretValue"]
        assert reads == [own]
    shared = checks.deployed(sam, {"DatabaseRoles": "shared"})
    assert shared.refused == ["DatabaseRoles=shared needs DatabaseUrlSecretArn."]


@pytest.mark.parametrize("mutate, problem", [
    # the old fallback: an empty own secret silently read the shared one
    (lambda t: t["Rules"].pop("PerFunctionDatabaseRolesNeedTheirSecrets"),
     "database roles: the default parameters deploy without each function's own secret"),
    (lambda t: t["Resources"]["DeleterFunction"]["Properties"]["Environment"]["Variables"].update(
        DATABASE_URL_SECRET_ARN={"Ref": "DatabaseUrlSecretArn"}),
     "deleter (per-function): DATABASE_URL_SECRET_ARN is '', expected "
     "arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-deleter-AbCdEf"),
    # one database user for all three functions
    (lambda t: t["Resources"]["DeleterFunction"]["Properties"]["Environment"]["Variables"].pop("DATABASE_USER"),
     "deleter (per-function, IAM auth): DATABASE_IAM_AUTH / DATABASE_USER are 'true' / None, "
     "expected true / orphan_cleanup_deleter"),
])
def test_a_shared_database_role_by_default_is_caught(sam, mutate, problem):
    broken = copy.deepcopy(sam)
    mutate(broken)
    assert problem in checks.database_role_problems(broken)


def test_a_connect_as_another_functions_user_is_caught(sam):
    broken = copy.deepcopy(sam)
    _statement(broken, "DeleterRole", "ConnectAsItsOwnDatabaseUser")["Resource"] = {
        "Fn::Sub": "arn:${AWS::Partition}:rds-db:${AWS::Region}:${AWS::AccountId}:dbuser:${DatabaseIamResourceId}/*"}
    assert ("deleter (per-function, IAM auth): rds-db:connect on ['arn:aws:rds-db:us-east-1:123456789012:dbuser:"
            "db-ABCDEFGHIJKL0123456789/*'], expected only arn:aws:rds-db:us-east-1:123456789012:dbuser:"
            "db-ABCDEFGHIJKL0123456789/orphan_cleanup_deleter") in checks.database_role_problems(broken)


# ------------------------------------------------------------------- ceilings


def test_every_function_gets_the_stacks_max_mode_and_a_protect_key_the_deny_covers(sam):
    # docs/SAFETY.md rules 8 and 16: the ceilings a ledger row cannot loosen
    assert checks.ceiling_problems(sam) == []
    view = checks.deployed(sam, {**checks.SAMPLE_PARAMETERS, "ProtectTagKeys": "platform-keep,other"})
    for fn in ("lister", "classifier", "deleter"):
        assert view.environment[fn]["ORPHAN_CLEANUP_MAX_MODE"] == "report"
        assert view.environment[fn]["ORPHAN_CLEANUP_PROTECT_TAG_KEY"] == "platform-keep"
    broken = copy.deepcopy(sam)
    broken["Globals"]["Function"]["Environment"]["Variables"]["ORPHAN_CLEANUP_PROTECT_TAG_KEY"] = "not-denied"
    assert ("lister: ORPHAN_CLEANUP_PROTECT_TAG_KEY 'not-denied' is not a key the deleter's Deny covers "
            "(['orphan-cleanup-protect'])") in checks.ceiling_problems(broken)
    del broken["Globals"]["Function"]["Environment"]["Variables"]["ORPHAN_CLEANUP_MAX_MODE"]
    assert "deleter: ORPHAN_CLEANUP_MAX_MODE is None with the defaults" in checks.ceiling_problems(broken)


def test_a_delete_mode_under_a_report_ceiling_is_refused_at_deploy(sam):
    # docs/SAFETY.md rule 8: Mode=delete with MaxMode at its default (report) would report only
    rule = sam["Rules"]["DeleteModeNeedsADeleteCeiling"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "Mode"}, "delete"]}
    assert [a["Assert"] for a in rule["Assertions"]] == [{"Fn::Equals": [{"Ref": "MaxMode"}, "delete"]}]
    assert sam["Parameters"]["MaxMode"]["Default"] == "report"


# ------------------------------------------------------------------ role patterns


def test_role_parameters_refuse_wildcard_role_names_and_assume_role_is_scoped(sam):
    assert checks.sam_role_pattern_problems(sam) == []
    params = sam["Parameters"]
    assert params["TargetOrganizationId"]["Default"] == "" and params["TargetAccountIds"]["Default"] == ""


@pytest.mark.parametrize("parameter, pattern, problem", [
    ("TargetListRoleArnPattern", "^$|^arn:aws[a-z-]*:iam::([0-9]{12}|\\*):role/[A-Za-z0-9+=,.@_/*-]+$",
     "TargetListRoleArnPattern AllowedPattern: accepts 'arn:aws:iam::*:role/*'"),
    ("TargetDeleteRoleArnPattern", "^$|^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$",
     "TargetDeleteRoleArnPattern AllowedPattern: refuses 'arn:aws:iam::*:role/orphan-cleanup-list'"),
])
def test_a_loosened_role_pattern_is_caught(sam, parameter, pattern, problem):
    broken = copy.deepcopy(sam)
    broken["Parameters"][parameter]["AllowedPattern"] = pattern
    assert problem in checks.sam_role_pattern_problems(broken)


def test_a_redrive_role_with_a_wildcard_is_caught(sam):
    broken = copy.deepcopy(sam)
    broken["Parameters"]["RedriveRoleArn"]["AllowedPattern"] = \
        "^$|^arn:aws[a-z-]*:iam::([0-9]{12}|\\*):role/[A-Za-z0-9+=,.@_/*-]+$"
    problems = checks.sam_role_pattern_problems(broken)
    assert "RedriveRoleArn AllowedPattern: accepts 'arn:aws:iam::123456789012:role/*'" in problems


def test_a_wildcard_account_needs_the_organisation_or_the_accounts(sam):
    assert checks.target_scope_problems(sam) == []
    view = checks.deployed(sam, {**checks.SAMPLE_PARAMETERS,
                                 "TargetDeleteRoleArnPattern": "arn:aws:iam::*:role/orphan-cleanup-delete"})
    (assume,) = [s for s in view.statements["deleter"] if s["Action"] == "sts:AssumeRole"]
    # no ARN: IAM refuses the policy, and the deploy stops with this text
    assert assume["Resource"] == ("TargetDeleteRoleArnPattern names every account (*): set TargetOrganizationId "
                                  "or TargetAccountIds")
    broken = copy.deepcopy(sam)
    for role, parameter in (("ListerRole", "TargetListRoleArnPattern"), ("DeleterRole", "TargetDeleteRoleArnPattern")):
        sid = "AssumeTargetListRole" if role == "ListerRole" else "AssumeTargetDeleteRole"
        _statement(broken, role, sid)["Resource"] = {"Ref": parameter}
    problems = checks.target_scope_problems(broken)
    assert ("deleter: TargetDeleteRoleArnPattern=arn:aws:iam::*:role/orphan-cleanup-deleter with no scope is "
            "accepted (['arn:aws:iam::*:role/orphan-cleanup-deleter'])") in problems
    assert len(problems) == 2


def test_an_assume_role_without_the_scope_condition_is_caught(sam):
    broken = copy.deepcopy(sam)
    for policy in broken["Resources"]["DeleterRole"]["Properties"]["Policies"]:
        for branch in checks.if_branches(policy):
            for st in branch["PolicyDocument"].get("Statement", []):
                if st.get("Sid") == "AssumeTargetDeleteRole":
                    del st["Condition"]
    assert checks.sam_role_pattern_problems(broken) == [
        "DeleterRole: sts:AssumeRole has no aws:ResourceOrgID / aws:ResourceAccount condition"]


def test_the_scope_condition_resolves_to_the_organisation_and_the_accounts(sam):
    # what IAM receives once CloudFormation resolved the conditions: both keys when both are set
    statement = _statement(sam, "ListerRole", "AssumeTargetListRole")
    (scope, _absent) = statement["Condition"]["Fn::If"][1:]
    assert statement["Condition"]["Fn::If"][0] == "HasTargetScope"
    assert scope["StringEquals"] == {
        "aws:ResourceOrgID": {"Fn::If": ["HasTargetOrganization", {"Ref": "TargetOrganizationId"},
                                         {"Ref": "AWS::NoValue"}]},
        "aws:ResourceAccount": {"Fn::If": ["HasTargetAccounts", {"Ref": "TargetAccountIds"},
                                           {"Ref": "AWS::NoValue"}]}}
    assert sam["Conditions"]["HasTargetScope"] == {"Fn::Or": [{"Condition": "HasTargetOrganization"},
                                                              {"Condition": "HasTargetAccounts"}]}


# ------------------------------------------------------------------ smaller gaps


def test_nobody_but_a_dlqs_producer_sends_to_it_and_a_dropped_deny_is_caught(sam, cfn):
    assert checks.dead_letter_policy_problems(cfn) == []
    broken = copy.deepcopy(sam)
    statements = broken["Resources"]["DeadLetterQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    broken["Resources"]["DeadLetterQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"] = [
        s for s in statements if s["Sid"] != "OnlyTheListerSendsItsDeadLetters"]
    assert checks.dead_letter_policy_problems(checks.sam_transform(broken)) == [
        "ListerDLQ: no Deny of sqs:SendMessage for principals other than ListerRole"]


def test_log_groups_outlive_the_stack_with_their_retention(sam):
    groups = checks.resources_of_type(sam, "AWS::Logs::LogGroup")
    assert set(groups) == {"ListerLogGroup", "ClassifierLogGroup", "DeleterLogGroup"}
    for group in groups.values():
        assert (group["DeletionPolicy"], group["UpdateReplacePolicy"]) == ("Retain", "Retain")
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_termination_protection_is_read_on_instance_arns_only(sam, cfn, target):
    statement = _statement(sam, "DeleterRole", "ReadTerminationProtection")
    assert statement["Action"] == "ec2:DescribeInstanceAttribute"
    assert statement["Resource"] == {"Fn::Sub": "arn:${AWS::Partition}:ec2:*:${AWS::AccountId}:instance/*"}
    assert not any("ec2:DescribeInstanceAttribute" in checks.as_list(s["Action"]) and s["Resource"] == "*"
                   for s in checks.role_statements(cfn, "DeleterRole"))
    assert _statement(target, "DeleteRole", "ReadTerminationProtection")["Resource"] == statement["Resource"]
    broken = copy.deepcopy(sam)
    _statement(broken, "DeleterRole", "ReadTerminationProtection")["Resource"] = "*"
    assert checks.deleter_policy_problems(checks.sam_transform(broken)) == [
        'deleter: ec2:DescribeInstanceAttribute on "*"; only instance ARNs']


def test_an_optional_code_signing_config_reaches_every_function(cfn):
    for fn in ("ListerFunction", "ClassifierFunction", "DeleterFunction"):
        assert cfn["Resources"][fn]["Properties"]["CodeSigningConfigArn"] == {
            "Fn::If": ["HasCodeSigning", {"Ref": "CodeSigningConfigArn"}, {"Ref": "AWS::NoValue"}]}
    assert cfn["Parameters"]["CodeSigningConfigArn"]["Default"] == ""
