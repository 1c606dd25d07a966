"""Deleter Lambda: SQS batches of DeleteRequest messages, partial batch failures.

A record fails (and is redelivered later) when its ref's delete gate is held."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.typing import LambdaContext

from orphan_cleanup.entrypoints import aws

logger, metrics = aws.logger, aws.metrics
processor = BatchProcessor(event_type=EventType.SQS, model=aws.DeleteRequestRecord)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict, context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=aws.delete_record,
                                    processor=processor, context=context)
