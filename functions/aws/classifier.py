"""Classifier Lambda: SQS batches of ListingBatch messages, partial batch failures."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.typing import LambdaContext

from orphan_cleanup.cycle.python_gc import gc_paused
from orphan_cleanup.entrypoints import aws

logger, metrics = aws.logger, aws.metrics
processor = BatchProcessor(event_type=EventType.SQS, model=aws.ListingBatchRecord)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@gc_paused  # the batches' decode and classification (orphan_cleanup.cycle.python_gc)
def handler(event: dict, context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=aws.classify_record,
                                    processor=processor, context=context)
