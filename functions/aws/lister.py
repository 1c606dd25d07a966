"""Lister Lambda: the schedule's tick (``{}``), a listing job from the jobs queue
(SQS records, partial batch failures), or a manual ``{"backend": ID[, "mode": M]}``."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.typing import LambdaContext

from orphan_cleanup.entrypoints import aws

logger, metrics = aws.logger, aws.metrics
processor = BatchProcessor(event_type=EventType.SQS, model=aws.ListingJobRecord)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict, context: LambdaContext) -> dict:
    if aws.is_sqs_event(event):
        return dict(process_partial_response(event=event, record_handler=aws.job_record,
                                             processor=processor, context=context))
    return aws.run_lister(event)
