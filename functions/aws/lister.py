"""Lister Lambda: scheduled `{"backend": ID}` (or a manual invoke with "mode")."""

from aws_lambda_powertools.utilities.typing import LambdaContext

from orphan_cleanup.entrypoints import aws

logger, metrics = aws.logger, aws.metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict, context: LambdaContext) -> dict:
    return aws.run_lister(event)
