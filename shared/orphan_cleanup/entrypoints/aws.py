"""AWS Lambda wiring: SQS queues, Powertools logger/metrics, Sentry's Lambda integration."""

from __future__ import annotations

import functools
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.parser.models import SqsRecordModel
from pydantic import Json

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.messages import DeleteRequest, ListerEvent, ListingBatch, ListingJob
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.entrypoints import common
from orphan_cleanup.queues.sqs import SqsQueue

NAMESPACE, SERVICE = "OrphanCleanup", "orphan-cleanup"
logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)


def backend_metric(name: str, value: float, backend: str) -> None:
    """A count with the dimensions ``service`` and ``Backend``, flushed at once as its own
    EMF document (the invocation's ``metrics`` carry ``service`` only: one batch may hold
    several backends' records)."""
    with single_metric(name=name, unit=MetricUnit.Count, value=value, namespace=NAMESPACE,
                       default_dimensions={"service": SERVICE}) as metric:
        metric.add_dimension(name="Backend", value=backend)


class ListingBatchRecord(SqsRecordModel):
    body: Json[ListingBatch]  # type: ignore[assignment]


class DeleteRequestRecord(SqsRecordModel):
    body: Json[DeleteRequest]  # type: ignore[assignment]


class ListingJobRecord(SqsRecordModel):
    body: Json[ListingJob]  # type: ignore[assignment]


def is_sqs_event(event: Any) -> bool:
    """An SQS event-source invocation (the lister's jobs queue), not a direct invoke."""
    return isinstance(event, dict) and isinstance(event.get("Records"), list)


def _sqs_queues(settings: Settings) -> tuple[SqsQueue, SqsQueue, SqsQueue | None]:
    import boto3

    if not settings.listing_queue_url or not settings.delete_queue_url:
        raise ConfigError("LISTING_QUEUE_URL and DELETE_QUEUE_URL must be set")
    sqs = boto3.client("sqs", endpoint_url=settings.aws_endpoint_url)
    jobs = SqsQueue(sqs, settings.jobs_queue_url) if settings.jobs_queue_url else None
    return SqsQueue(sqs, settings.listing_queue_url), SqsQueue(sqs, settings.delete_queue_url), jobs


@functools.cache  # one instance per process: it is part of the pipeline cache key
def _integrations() -> tuple[Any, ...]:
    try:
        from sentry_sdk.integrations.aws_lambda import AwsLambdaIntegration
    except ImportError:  # sentry is an optional extra
        return ()
    return (AwsLambdaIntegration(),)


def pipeline() -> Pipeline:
    return common.pipeline(_sqs_queues, _integrations(), logger, backend_metric)


def run_lister(event: Any) -> dict[str, Any]:
    """``{}`` is the tick; otherwise validate ``{"backend": ID[, "mode": M]}`` and run
    STEP 1-2 for that backend. Bad input is an error result."""
    from pydantic import ValidationError

    if event == {}:
        return run_tick()
    try:
        request = ListerEvent.model_validate(event)
    except ValidationError as e:
        logger.error("malformed lister event", extra={"errors": e.errors(include_url=False)})
        return {"ok": False, "error": f"malformed event: {e.errors()[0]['msg']}"}
    logger.append_keys(backend=request.backend)
    try:
        summary = pipeline().run_lister(request.backend, mode=request.mode, manual=request.mode is not None)
    except ConfigError as e:
        logger.error(str(e))
        return {"ok": False, "error": str(e)}
    if summary.cycle_id:
        logger.append_keys(cycle_id=summary.cycle_id)
        metrics.add_metric(name="CyclesStarted", unit=MetricUnit.Count, value=1)
        metrics.add_metric(name="BatchesPublished", unit=MetricUnit.Count, value=summary.batches or 0)
    logger.info("lister done", extra={"summary": summary.model_dump()})
    return {"ok": True, **summary.model_dump()}


def run_tick() -> dict[str, Any]:
    """The schedule's tick: queue one listing job per group of due backends."""
    try:
        result = pipeline().run_tick()
    except ConfigError as e:
        logger.error(str(e))
        return {"ok": False, "error": str(e)}
    metrics.add_metric(name="ListingJobsQueued", unit=MetricUnit.Count, value=len(result.jobs))
    # The alarm on it: template.yaml / infra/aws (no backend enrolled yet: 0, nothing is stale).
    metrics.add_metric(name="StalestBackendSeconds", unit=MetricUnit.Seconds,
                       value=result.stalest_backend_seconds or 0)
    logger.info("tick done", extra={"summary": result.model_dump()})
    return {"ok": True, **result.model_dump()}


def job_record(record: ListingJobRecord) -> None:
    """One listing job from the jobs queue; an error fails the record (redelivered)."""
    result = pipeline().run_job(record.body)
    started = sum(1 for r in result.results if r.started)
    metrics.add_metric(name="CyclesStarted", unit=MetricUnit.Count, value=started)
    logger.info("listing job done", extra={"summary": result.model_dump()})


def classify_record(record: ListingBatchRecord) -> None:
    batch = record.body
    logger.append_keys(cycle_id=batch.cycle_id, backend=batch.backend)
    result = pipeline().handle_batch(batch)
    metrics.add_metric(name="GroupsListed", unit=MetricUnit.Count, value=len(batch.groups))
    for verdict, n in result.verdicts.items():
        metrics.add_metric(name=f"Groups_{verdict}", unit=MetricUnit.Count, value=n)


def delete_record(record: DeleteRequestRecord) -> None:
    request = record.body
    logger.append_keys(cycle_id=request.cycle_id, backend=request.backend)
    p = pipeline()
    status = p.handle_delete(request)  # a request naming another backend than its cycle's raised
    metrics.add_metric(name=f"Delete_{status}", unit=MetricUnit.Count, value=1)
    p.reporter.count(f"Delete_{status}", 1, request.backend)
