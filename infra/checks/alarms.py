"""Knowing it works (README): every stack alarms when a backend has gone too long without a
clean cycle (the tick's ``StalestBackendSeconds``, six intervals by default) and when the
tick stopped (no lister invocation for three intervals, missing data breaching)."""

from __future__ import annotations

from typing import Any

from infra.checks._common import resources_of_type, unquote
from infra.checks.terraform import Module

STALE_INTERVALS = 6
TICK_PERIODS = 3


def _param_default(cfn: dict, value: Any) -> Any:
    if isinstance(value, dict) and "Ref" in value:
        return cfn.get("Parameters", {}).get(value["Ref"], {}).get("Default")
    return value


def sam_alarm_problems(cfn: dict) -> list[str]:
    """SAM: an alarm on OrphanCleanup/StalestBackendSeconds whose default threshold is six
    default intervals, and one on the lister's Invocations over three periods, missing
    data breaching."""
    problems = []
    alarms = [a["Properties"] for a in resources_of_type(cfn, "AWS::CloudWatch::Alarm").values()]
    interval = cfn.get("Parameters", {}).get("IntervalSeconds", {}).get("Default")
    stale = [p for p in alarms if p.get("MetricName") == "StalestBackendSeconds"]
    if len(stale) != 1 or stale[0].get("Namespace") != "OrphanCleanup":
        problems.append("template.yaml: no alarm on OrphanCleanup StalestBackendSeconds")
    elif interval is None or float(_param_default(cfn, stale[0].get("Threshold"))) != STALE_INTERVALS * float(interval):
        problems.append(f"template.yaml: the StalestBackendSeconds alarm's default threshold is not {STALE_INTERVALS}"
                        " default intervals")
    tick = [p for p in alarms if p.get("Namespace") == "AWS/Lambda" and p.get("MetricName") == "Invocations"]
    if len(tick) != 1:
        problems.append("template.yaml: no alarm on the lister's Invocations (a stopped tick)")
        return problems
    t = tick[0]
    if [d.get("Value") for d in t.get("Dimensions", [])] != [{"Ref": "ListerFunction"}]:
        problems.append("template.yaml: the Invocations alarm does not watch the lister")
    if (t.get("TreatMissingData"), t.get("EvaluationPeriods"), t.get("ComparisonOperator")) != (
            "breaching", TICK_PERIODS, "LessThanThreshold"):
        problems.append("template.yaml: the stopped-tick alarm must fire after three periods without an invocation,"
                        " missing data breaching")
    return problems


def _variable_default(module: Module, name: str) -> Any:
    return next((body.get("default") for n, body in module.blocks("variable") if n == name), None)


def terraform_aws_alarm_problems(module: Module) -> list[str]:
    """infra/aws: the same two alarms (the threshold six intervals by default)."""
    problems = []
    alarms = {n: b for t, n, b in module.labelled("resource") if t == "aws_cloudwatch_metric_alarm"}
    stale = [b for b in alarms.values() if unquote(str(b.get("metric_name"))) == "StalestBackendSeconds"]
    if len(stale) != 1 or unquote(str(stale[0].get("namespace"))) != "OrphanCleanup":
        problems.append("aws: no alarm on OrphanCleanup StalestBackendSeconds")
    elif _variable_default(module, "stale_alarm_intervals") != STALE_INTERVALS:
        problems.append(f"aws: stale_alarm_intervals does not default to {STALE_INTERVALS}")
    tick = [b for b in alarms.values() if unquote(str(b.get("metric_name"))) == "Invocations"]
    if len(tick) != 1 or "lister" not in str(tick[0].get("dimensions")):
        problems.append("aws: no alarm on the lister's Invocations (a stopped tick)")
    elif (unquote(str(tick[0].get("treat_missing_data"))), tick[0].get("evaluation_periods")) != (
            "breaching", TICK_PERIODS):
        problems.append("aws: the stopped-tick alarm must fire after three periods, missing data breaching")
    return problems


def terraform_gcp_alarm_problems(module: Module) -> list[str]:
    """infra/gcp: a log-based metric of the tick's stalest_backend_seconds with an alert
    policy on it, and an absence policy on the ticks' log-based count."""
    problems = []
    metrics = {n: b for t, n, b in module.labelled("resource") if t == "google_logging_metric"}
    policies = [b for t, _, b in module.labelled("resource") if t == "google_monitoring_alert_policy"]
    stale = [n for n, b in metrics.items() if "stalest_backend_seconds" in str(b.get("value_extractor"))]
    if not stale:
        problems.append("gcp: no log-based metric of the tick's stalest_backend_seconds")
    elif not any(f"google_logging_metric.{stale[0]}.name" in str(p) and "condition_threshold" in str(p)
                 for p in policies):
        problems.append("gcp: no alert policy on the stalest_backend_seconds metric")
    counts = [n for n, b in metrics.items() if n not in stale]
    if not any(f"google_logging_metric.{n}.name" in str(p) and "condition_absent" in str(p)
               for n in counts for p in policies):
        problems.append("gcp: no alert policy on a stopped tick (an absent tick count)")
    if _variable_default(module, "stale_alarm_intervals") != STALE_INTERVALS:
        problems.append(f"gcp: stale_alarm_intervals does not default to {STALE_INTERVALS}")
    return problems
