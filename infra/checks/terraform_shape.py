"""The Terraform stacks' shape, read with python-hcl2 (ARCHITECTURE.md): one
tick schedule posting ``{}``, the jobs queue/topic wired to the lister, a
protect Deny per configured key, sends and publishes only by the producer."""

from __future__ import annotations

from typing import Any

from infra.checks._common import unquote
from infra.checks.iam import DELETE_ACTIONS
from infra.checks.terraform import Module, terraform_policy_documents

# infra/aws local.queues / infra/gcp local.push: work queue or topic -> (consumer, producer)
AWS_QUEUES = {"jobs": ("lister", "lister"), "listing": ("classifier", "lister"), "delete": ("deleter", "classifier")}
GCP_TOPICS = {"jobs": ("lister", "lister"), "listing": ("classifier", "lister"), "delete": ("deleter", "classifier")}


def _local(module: Module, name: str) -> Any:
    for parsed in module.files.values():
        for block in parsed.get("locals", []):
            if name in block:
                return block[name]
    return None


def _resources(module: Module, type_: str) -> dict[str, dict]:
    return {n: body for t, n, body in module.labelled("resource") if t == type_}


def _one_schedule(stack: str, module: Module, type_: str, others: tuple[str, ...]) -> tuple[list[str], dict | None]:
    schedules = {f"{type_}.{n}": b for n, b in _resources(module, type_).items()}
    for other in others:
        schedules |= {f"{other}.{n}": b for n, b in _resources(module, other).items()}
    if len(schedules) != 1:
        return [f"{stack}: {len(schedules)} schedules ({', '.join(sorted(schedules)) or 'none'}); "
                f"expected one tick"], None
    (name, body), = schedules.items()
    problems = [f"{stack}: {name} is repeated ({k}); expected one tick"
                for k in ("for_each", "count") if k in body]
    return problems, body


def aws_stack_problems(module: Module) -> list[str]:
    problems: list[str] = []
    declared = {n for n, _ in module.blocks("variable")}
    problems += [f"aws: variable {v} (per-backend scheduling) is back" for v in ("backends",) if v in declared]
    found, schedule = _one_schedule("aws", module, "aws_scheduler_schedule", ("aws_cloudwatch_event_rule",))
    problems += found
    if schedule is not None:
        target = (schedule.get("target") or [{}])[0]
        if target.get("arn") != '${aws_lambda_function.fn["lister"].arn}':
            problems.append(f"aws: the schedule targets {target.get('arn')!r}, not the lister")
        if target.get("input") not in ("${jsonencode({})}", '"{}"'):
            problems.append(f"aws: the schedule's input is {target.get('input')!r}, expected {{}} (the tick)")
    queues = _local(module, "queues") or {}
    for queue, (consumer, producer) in AWS_QUEUES.items():
        q = queues.get(queue, {})
        if (unquote(str(q.get("consumer"))), unquote(str(q.get("producer")))) != (consumer, producer):
            problems.append(f"aws: local.queues.{queue} is not consumed by {consumer} and produced by {producer}")
    jobs = queues.get("jobs", {})
    if jobs.get("batch_size") != 1 or jobs.get("max_concurrency") != "${var.lister_max_concurrency}":
        problems.append("aws: the jobs queue must feed the lister one job at a time, capped by lister_max_concurrency")
    if 'JOBS_QUEUE_URL = aws_sqs_queue.main["jobs"].url' not in str(_local(module, "environment")):
        problems.append("aws: the functions' environment lacks JOBS_QUEUE_URL")
    esm = _resources(module, "aws_lambda_event_source_mapping")
    if [b.get("for_each") for b in esm.values()] != ["${local.queues}"]:
        problems.append("aws: one event source mapping per entry of local.queues expected")
    documents = terraform_policy_documents(module)
    problems += _aws_protect_problems(documents.get("deleter", []))
    problems += _aws_queue_policy_problems(module, documents.get("queue", []))
    return problems


def _aws_protect_problems(statements: list[dict]) -> list[str]:
    for st in statements:
        if st.get("Effect") == "Deny" and st.get("ForEach") == "${var.protect_tag_keys}" and \
                st.get("Condition") == {"Null": {"aws:ResourceTag/${statement.value}": ["false"]}} and \
                st.get("Resource") == ["*"]:
            missing = DELETE_ACTIONS - set(st["Action"])
            return [f"aws: the protect Deny lacks {a}" for a in sorted(missing)]
    return ["aws: the deleter has no Deny of the deletes per entry of var.protect_tag_keys"]


def _aws_queue_policy_problems(module: Module, statements: list[dict]) -> list[str]:
    problems = []
    if not any(st.get("Effect") == "Deny" and st.get("Action") == ["sqs:*"]
               and st["Condition"].get("Bool") == {"aws:SecureTransport": ["false"]} for st in statements):
        problems.append("aws: the queue policy does not deny plain HTTP")
    sends = [st for st in statements if st.get("Effect") == "Deny" and st.get("Action") == ["sqs:SendMessage"]]
    if not any("aws_iam_role.fn[statement.value].arn" in str(st["Condition"].get("ArnNotLike", {}).get(
            "aws:PrincipalArn")) and "local.queues[each.key].producer" in str(st.get("ForEach")) for st in sends):
        problems.append("aws: no queue policy Deny of sqs:SendMessage for principals other than the producer")
    dead = {st["Sid"]: st for st in sends if st["Condition"].get("Null") == {"aws:PrincipalArn": ["false"]}}
    lister = dead.get("OnlyTheListerSendsItsDeadLetters", {}).get("Condition", {}).get("ArnNotLike", {})
    if "NobodySendsDeadLetters" not in dead or "NobodySendsDeadLetters" in dead and \
            dead["NobodySendsDeadLetters"]["Condition"].keys() != {"Null"}:
        problems.append("aws: no queue policy Deny of sqs:SendMessage on the redrive DLQs for every principal")
    if "aws_iam_role.fn[statement.value].arn" not in str(lister.get("aws:PrincipalArn")):
        problems.append("aws: no queue policy Deny of sqs:SendMessage on the lister DLQ for principals but the lister")
    policies = _resources(module, "aws_sqs_queue_policy")
    if [(b.get("for_each"), b.get("policy")) for b in policies.values()] != [
            ("${local.all_queues}", "${data.aws_iam_policy_document.queue[each.key].json}")]:
        problems.append("aws: every queue needs its one policy from data.aws_iam_policy_document.queue")
    return problems


def gcp_stack_problems(module: Module) -> list[str]:
    problems: list[str] = []
    declared = {n for n, _ in module.blocks("variable")}
    problems += [f"gcp: variable {v} (per-backend scheduling) is back" for v in ("backends",) if v in declared]
    found, job = _one_schedule("gcp", module, "google_cloud_scheduler_job", ())
    problems += found
    if job is not None:
        target = (job.get("http_target") or [{}])[0]
        if target.get("body") != "${base64encode(jsonencode({}))}":
            problems.append(f"gcp: the scheduler job posts {target.get('body')!r}, expected {{}} (the tick)")
        if 'google_cloudfunctions2_function.fn["lister"]' not in str(target.get("uri")):
            problems.append("gcp: the scheduler job does not call the lister")
    if "JOBS_TOPIC = google_pubsub_topic.jobs.id" not in str(_local(module, "environment")):
        problems.append("gcp: the functions' environment lacks JOBS_TOPIC")
    push = _local(module, "push") or {}
    for topic, (consumer, _) in GCP_TOPICS.items():
        entry = push.get(topic, {})
        if entry.get("topic") != f"${{google_pubsub_topic.{topic}}}" or unquote(str(entry.get("function"))) != consumer:
            problems.append(f"gcp: local.push.{topic} does not deliver topic {topic} to {consumer}")
    if unquote(str(push.get("jobs", {}).get("invoker"))) != "${google_service_account.jobs_push}":
        problems.append("gcp: listing jobs are not pushed with the dedicated jobs_push account")
    invokers = [b for b in _resources(module, "google_cloud_run_v2_service_iam_member").values()
                if "google_service_account.jobs_push" in str(b.get("member"))]
    if len(invokers) != 1 or invokers[0].get("name") != \
            '${google_cloudfunctions2_function.fn["lister"].service_config[0].service}' or "for_each" in invokers[0]:
        problems.append("gcp: jobs_push must be run.invoker on the lister's service only")
    functions = _local(module, "functions") or {}
    timeout = int(functions.get("lister", {}).get("timeout", 0))
    for name, sub in _resources(module, "google_pubsub_subscription").items():
        if name == "push" and int(sub.get("ack_deadline_seconds", 10)) < timeout:
            problems.append(f"gcp: push ack deadline {sub.get('ack_deadline_seconds')} s < the lister's {timeout} s")
    problems += _gcp_publisher_problems(module)
    return problems


def _gcp_publisher_problems(module: Module) -> list[str]:
    """Only the producer's service account publishes to a work topic; nothing
    grants pubsub.publisher project-wide."""
    problems = []
    bindings = _resources(module, "google_pubsub_topic_iam_member")
    for topic, (_, producer) in GCP_TOPICS.items():
        members = [b.get("member") for b in bindings.values()
                   if b.get("topic") == f"${{google_pubsub_topic.{topic}.name}}" and "publisher" in str(b.get("role"))]
        if members != [f'${{google_service_account.fn["{producer}"].member}}']:
            problems.append(f"gcp: publishers of topic {topic} are {members!r}, expected only the {producer}'s account")
    for t in ("google_pubsub_topic_iam_binding", "google_pubsub_topic_iam_policy"):
        problems += [f"gcp: {t}.{n} (authoritative topic IAM) is not allowed" for n in _resources(module, t)]
    for n, b in _resources(module, "google_project_iam_member").items():
        if "pubsub" in str(b.get("role")):
            problems.append(f"gcp: google_project_iam_member.{n} grants {b.get('role')} project-wide")
    return problems
