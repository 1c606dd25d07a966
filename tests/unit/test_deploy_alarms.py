"""Both AWS stacks (SAM and infra/aws) and infra/gcp alarm on the tick's
StalestBackendSeconds (six intervals by default) and on a tick that stopped (three
intervals without a lister invocation, missing data breaching); a stack that loses either
is caught."""

from __future__ import annotations

import copy

import pytest

from infra import checks
from infra.checks.terraform import Module

TF_DIRS = {d.name: d for d in checks.TERRAFORM_DIRS}


@pytest.fixture(scope="module")
def cfn() -> dict:
    return checks.sam_transform(checks.load_template(checks.TEMPLATE))


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return {name: Module.load(path) for name, path in TF_DIRS.items()}


def test_every_stack_alarms_on_staleness_and_a_stopped_tick(cfn, modules):
    assert checks.sam_alarm_problems(cfn) == []
    assert checks.terraform_aws_alarm_problems(modules["aws"]) == []
    assert checks.terraform_gcp_alarm_problems(modules["gcp"]) == []
    stale = cfn["Resources"]["StalestBackendAlarm"]["Properties"]
    assert (stale["Namespace"], stale["MetricName"], stale["Threshold"]) == (
        "OrphanCleanup", "StalestBackendSeconds", {"Ref": "StaleAlarmSeconds"})
    assert cfn["Parameters"]["StaleAlarmSeconds"]["Default"] == 6 * cfn["Parameters"]["IntervalSeconds"]["Default"]


@pytest.mark.parametrize("break_it, problem", [
    (lambda r: r.pop("StalestBackendAlarm"), "no alarm on OrphanCleanup StalestBackendSeconds"),
    (lambda r: r.pop("TickStoppedAlarm"), "no alarm on the lister's Invocations"),
    (lambda r: r["TickStoppedAlarm"]["Properties"].update(TreatMissingData="notBreaching"), "missing data breaching"),
    (lambda r: r["StalestBackendAlarm"]["Properties"].update(Threshold=60), "six default intervals"),
], ids=["no staleness alarm", "no tick alarm", "missing data not breaching", "threshold"])
def test_a_sam_stack_without_them_is_caught(cfn, break_it, problem):
    broken = copy.deepcopy(cfn)
    break_it(broken["Resources"])
    assert any(problem.replace("six", "6") in p or problem in p for p in checks.sam_alarm_problems(broken)), \
        checks.sam_alarm_problems(broken)


def test_terraform_stacks_without_them_are_caught(modules):
    aws = {name: text for name, text in ((p.name, p.read_text()) for p in TF_DIRS["aws"].glob("*.tf"))}
    aws["alarms.tf"] = aws["alarms.tf"].replace("StalestBackendSeconds", "SomethingElse")
    assert "aws: no alarm on OrphanCleanup StalestBackendSeconds" in checks.terraform_aws_alarm_problems(
        Module.from_text(aws))
    gcp = {name: text for name, text in ((p.name, p.read_text()) for p in TF_DIRS["gcp"].glob("*.tf"))}
    gcp["monitoring.tf"] = gcp["monitoring.tf"].replace("condition_absent", "condition_threshold")
    assert "gcp: no alert policy on a stopped tick (an absent tick count)" in checks.terraform_gcp_alarm_problems(
        Module.from_text(gcp))


def test_the_stack_creates_the_digest_topic_and_the_functions_may_publish_to_it_only(cfn):
    assert cfn["Resources"]["DigestTopic"]["Type"] == "AWS::SNS::Topic"
    subscriptions = {n: r for n, r in cfn["Resources"].items() if r["Type"] == "AWS::SNS::Subscription"}
    assert {n: (r["Condition"], r["Properties"]["Protocol"]) for n, r in subscriptions.items()} == {
        "DigestEmailSubscription": ("HasDigestEmail", "email"), "DigestQueueSubscription": ("HasDigestQueue", "sqs")}
    for role in ("ListerRole", "ClassifierRole", "DeleterRole"):
        publish = [s for s in checks.role_statements(cfn, role) if "sns:Publish" in checks.as_list(s["Action"])]
        assert [s["Resource"] for s in publish] == [{"Ref": "DigestTopic"}], role
    env = next(iter(checks.resources_of_type(cfn, "AWS::Lambda::Function").values()))["Properties"]["Environment"]
    assert env["Variables"]["NOTIFY_TOPIC_ARN"] == {"Ref": "DigestTopic"}
