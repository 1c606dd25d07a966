"""template.yaml's shape (ARCHITECTURE.md): one tick schedule, the jobs queue
wired to the lister, queue policies that admit only each queue's producer,
encryption at rest, an alarm on every dead-letter queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from infra.checks._common import AWS_HANDLERS, SAM_QUEUES, as_list, resources_of_type
from infra.checks.iam import if_branches, role_statements
from infra.checks.sam import function_by_handler

CONSUME_ACTIONS = frozenset({"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                             "sqs:GetQueueAttributes"})
QUEUE_ENV = {"JobsQueue": "JOBS_QUEUE_URL", "ListingQueue": "LISTING_QUEUE_URL", "DeleteQueue": "DELETE_QUEUE_URL"}
SAM_TRANSFORM = "AWS::Serverless-2016-10-31"


def transform_problems(sam: dict) -> list[str]:
    """The untransformed template: the SAM transform alone (no
    AWS::LanguageExtensions), no Fn::ForEach anywhere, CodeUri per function."""
    problems = []
    transforms = as_list(sam.get("Transform", []))
    if transforms != [SAM_TRANSFORM]:
        problems.append(f"Transform is {transforms!r}, expected only {SAM_TRANSFORM}")
    problems += [f"{path}: Fn::ForEach (one schedule per stack, no per-backend resources)"
                 for path in _keys_starting(sam, "Fn::ForEach")]
    if "CodeUri" in (sam.get("Globals") or {}).get("Function", {}):
        # sam build rewrites a function's relative zip path for .aws-sam/build/,
        # not a Globals one: sam deploy after sam build would miss the zip.
        problems.append("Globals.Function.CodeUri: put CodeUri on each function (sam build leaves Globals as is)")
    return problems


def _keys_starting(node: Any, prefix: str, path: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            here = f"{path}/{k}"
            if isinstance(k, str) and k.startswith(prefix):
                yield here
            yield from _keys_starting(v, prefix, here)
    elif isinstance(node, list):
        for i, x in enumerate(node):
            yield from _keys_starting(x, prefix, f"{path}/{i}")


def _lister_id(cfn: dict) -> str:
    return function_by_handler(cfn, AWS_HANDLERS["lister"])[0]


def schedule_problems(cfn: dict) -> list[str]:
    """Exactly one schedule in the stack, invoking the lister with ``{}``."""
    schedules = {**resources_of_type(cfn, "AWS::Scheduler::Schedule"), **resources_of_type(cfn, "AWS::Events::Rule")}
    if len(schedules) != 1:
        return [f"{len(schedules)} schedules ({', '.join(sorted(schedules)) or 'none'}); expected one tick"]
    (sid, schedule), = schedules.items()
    props = schedule["Properties"]
    targets = as_list(props.get("Target") or props.get("Targets"))
    problems = []
    for target in targets:
        if target.get("Arn") != {"Fn::GetAtt": [_lister_id(cfn), "Arn"]}:
            problems.append(f"{sid}: target {target.get('Arn')!r} is not the lister")
        raw = target.get("Input")
        try:
            payload = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            payload = raw
        if payload != {}:
            problems.append(f"{sid}: input {raw!r}, expected {{}} (the tick)")
    return problems


def _mappings_from(cfn: dict, queue_id: str) -> list[dict]:
    return [m["Properties"] for m in resources_of_type(cfn, "AWS::Lambda::EventSourceMapping").values()
            if m["Properties"].get("EventSourceArn") == {"Fn::GetAtt": [queue_id, "Arn"]}]


def _allowed(statements: list[dict], action: str, resource: Any) -> bool:
    return any(s.get("Effect") == "Allow" and action in as_list(s.get("Action", []))
               and resource in as_list(s.get("Resource")) for s in statements)


def queue_wiring_problems(cfn: dict) -> list[str]:
    """Each work queue: its URL in every function's environment, one event
    source to its consumer (the jobs queue: one job at a time, capped by
    ListerMaxConcurrency), the consumer's role may consume it, its producer's
    role may send to it and no other role may."""
    problems: list[str] = []
    functions = resources_of_type(cfn, "AWS::Lambda::Function")
    roles = list(resources_of_type(cfn, "AWS::IAM::Role"))
    statements = {r: role_statements(cfn, r) for r in roles}
    for queue, wiring in SAM_QUEUES.items():
        arn = {"Fn::GetAtt": [queue, "Arn"]}
        for fid, fn in functions.items():
            env = fn["Properties"].get("Environment", {}).get("Variables", {})
            if env.get(QUEUE_ENV[queue]) != {"Ref": queue}:
                problems.append(f"{fid}: {QUEUE_ENV[queue]} is {env.get(QUEUE_ENV[queue])!r}, not Ref {queue}")
        mappings = _mappings_from(cfn, queue)
        if [m["FunctionName"] for m in mappings] != [{"Ref": wiring["consumer"]}]:
            problems.append(f"{queue}: consumed by {[m['FunctionName'] for m in mappings]!r}, "
                            f"expected only {wiring['consumer']}")
        if queue == "JobsQueue":
            for m in mappings:
                if m.get("BatchSize") != 1:
                    problems.append(f"JobsQueue: BatchSize {m.get('BatchSize')!r}, expected 1 (one listing each)")
                if (m.get("ScalingConfig") or {}).get("MaximumConcurrency") != {"Ref": "ListerMaxConcurrency"}:
                    problems.append("JobsQueue: MaximumConcurrency is not ListerMaxConcurrency")
        consumer_role = functions[wiring["consumer"]]["Properties"]["Role"]["Fn::GetAtt"][0]
        problems += [f"{consumer_role}: lacks {a} on {queue}" for a in sorted(CONSUME_ACTIONS)
                     if not _allowed(statements[consumer_role], a, arn)]
        senders = {r for r in roles if _allowed(statements[r], "sqs:SendMessage", arn)}
        if senders != {wiring["producer"]}:
            problems.append(f"{queue}: roles that may send {sorted(senders)}, expected only {wiring['producer']}")
    return problems


def queue_policy_problems(cfn: dict) -> list[str]:
    """Every queue has exactly one queue policy, which denies plain HTTP; a
    work queue's policy also denies SendMessage to every principal but its
    producer's role (and the optional RedriveRoleArn)."""
    problems: list[str] = []
    policies = resources_of_type(cfn, "AWS::SQS::QueuePolicy")
    for queue in resources_of_type(cfn, "AWS::SQS::Queue"):
        arn = {"Fn::GetAtt": [queue, "Arn"]}
        mine = [p["Properties"] for p in policies.values() if {"Ref": queue} in p["Properties"].get("Queues", [])]
        if len(mine) != 1:
            problems.append(f"{queue}: {len(mine)} queue policies (a queue keeps only one)")
            continue
        statements = [b for s in as_list(mine[0]["PolicyDocument"].get("Statement", [])) for b in if_branches(s)]
        denies = [s for s in statements if s.get("Effect") == "Deny" and s.get("Principal") in ("*", {"AWS": "*"})
                  and arn in as_list(s.get("Resource"))]
        if not any("sqs:*" in as_list(s.get("Action")) and s.get("Condition") == {
                "Bool": {"aws:SecureTransport": "false"}} for s in denies):
            problems.append(f"{queue}: no Deny of sqs:* without TLS")
        if queue in SAM_QUEUES:
            producer = {"Fn::GetAtt": [SAM_QUEUES[queue]["producer"], "Arn"]}
            if not any(_only_principal(s, producer) for s in denies
                       if {"sqs:SendMessage", "sqs:*"} & set(as_list(s.get("Action")))):
                problems.append(f"{queue}: no Deny of sqs:SendMessage for principals other than "
                                f"{SAM_QUEUES[queue]['producer']}")
    return problems


def _only_principal(statement: dict, producer: dict) -> bool:
    condition = statement.get("Condition") or {}
    clauses = [c for op, c in condition.items() if op in ("ArnNotEquals", "ArnNotLike", "StringNotEquals")]
    if len(condition) != 1 or len(clauses) != 1 or set(clauses[0]) != {"aws:PrincipalArn"}:
        return False
    value = clauses[0]["aws:PrincipalArn"]
    branches = value["Fn::If"][1:] if isinstance(value, dict) and "Fn::If" in value else [value]
    allowed_extra = {json.dumps({"Ref": "RedriveRoleArn"})}
    return all(producer in as_list(b) and {json.dumps(x) for x in as_list(b) if x != producer} <= allowed_extra
               for b in branches)


def queue_encryption_problems(cfn: dict) -> list[str]:
    """SSE on every queue (SQS-managed, or the QueueKmsKeyArn key); with a key,
    each producer role may GenerateDataKey and each consumer role Decrypt."""
    problems = []
    for queue, q in resources_of_type(cfn, "AWS::SQS::Queue").items():
        props = q["Properties"]
        managed = props.get("SqsManagedSseEnabled")
        sse = managed is True or (isinstance(managed, dict) and True in managed.get("Fn::If", []))
        if not (sse or props.get("KmsMasterKeyId")):
            problems.append(f"{queue}: not encrypted at rest")
    if "QueueKmsKeyArn" in cfn.get("Parameters", {}):
        key = {"Ref": "QueueKmsKeyArn"}
        functions = resources_of_type(cfn, "AWS::Lambda::Function")
        for queue, wiring in SAM_QUEUES.items():
            consumer_role = functions[wiring["consumer"]]["Properties"]["Role"]["Fn::GetAtt"][0]
            for role, action in ((wiring["producer"], "kms:GenerateDataKey"), (consumer_role, "kms:Decrypt")):
                if not _allowed(role_statements(cfn, role), action, key):
                    problems.append(f"{role}: lacks {action} on QueueKmsKeyArn ({queue})")
    return problems


def dead_letter_alarm_problems(cfn: dict) -> list[str]:
    """An alarm on the depth of every dead-letter queue (redrive targets and the
    lister's async DLQ)."""
    dlqs = set()
    for q in resources_of_type(cfn, "AWS::SQS::Queue").values():
        target = (q["Properties"].get("RedrivePolicy") or {}).get("deadLetterTargetArn")
        if isinstance(target, dict) and "Fn::GetAtt" in target:
            dlqs.add(target["Fn::GetAtt"][0])
    for fn in resources_of_type(cfn, "AWS::Lambda::Function").values():
        target = (fn["Properties"].get("DeadLetterConfig") or {}).get("TargetArn")
        if isinstance(target, dict) and "Fn::GetAtt" in target:
            dlqs.add(target["Fn::GetAtt"][0])
    watched = set()
    for alarm in resources_of_type(cfn, "AWS::CloudWatch::Alarm").values():
        p = alarm["Properties"]
        if p.get("MetricName") == "ApproximateNumberOfMessagesVisible":
            for d in p.get("Dimensions", []):
                if isinstance(d.get("Value"), dict) and "Fn::GetAtt" in d["Value"]:
                    watched.add(d["Value"]["Fn::GetAtt"][0])
    return [f"{q}: no alarm on its depth" for q in sorted(dlqs - watched)]


# Each dead-letter queue and the role that alone may send to it (None: no principal; SQS
# moves failed messages there itself, and a redrive forwards what it holds as it is).
DEAD_LETTER_SENDERS = {"JobsDLQ": None, "ListingDLQ": None, "DeleteDLQ": None, "ListerDLQ": "ListerRole"}


def dead_letter_policy_problems(cfn: dict) -> list[str]:
    """A Deny of sqs:SendMessage on every dead-letter queue for every principal carrying
    an ARN (``Null aws:PrincipalArn false``), but the ListerDLQ's producer, the lister."""
    problems = []
    statements = [b for p in resources_of_type(cfn, "AWS::SQS::QueuePolicy").values()
                  for s in as_list(p["Properties"]["PolicyDocument"].get("Statement", [])) for b in if_branches(s)]
    for queue, sender in DEAD_LETTER_SENDERS.items():
        arn = {"Fn::GetAtt": [queue, "Arn"]}
        wanted = {"Null": {"aws:PrincipalArn": "false"}}
        if sender is not None:
            wanted["ArnNotLike"] = {"aws:PrincipalArn": [{"Fn::GetAtt": [sender, "Arn"]}]}
        if not any(s.get("Effect") == "Deny" and s.get("Principal") in ("*", {"AWS": "*"})
                   and "sqs:SendMessage" in as_list(s.get("Action")) and arn in as_list(s.get("Resource"))
                   and s.get("Condition") == wanted for s in statements):
            problems.append(f"{queue}: no Deny of sqs:SendMessage for "
                            + (f"principals other than {sender}" if sender else "every principal"))
    return problems


def stack_shape_problems(sam: dict, cfn: dict) -> list[str]:
    return (transform_problems(sam) + schedule_problems(cfn) + queue_wiring_problems(cfn)
            + queue_policy_problems(cfn) + dead_letter_policy_problems(cfn) + queue_encryption_problems(cfn)
            + dead_letter_alarm_problems(cfn))
