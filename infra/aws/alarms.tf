locals {
  alarm_actions = var.alarm_topic_arn == null ? [] : [var.alarm_topic_arn]
  dead_letter_queues = {
    jobs    = aws_sqs_queue.dlq["jobs"].name
    listing = aws_sqs_queue.dlq["listing"].name
    delete  = aws_sqs_queue.dlq["delete"].name
    lister  = aws_sqs_queue.lister_dlq.name
  }
}

resource "aws_cloudwatch_metric_alarm" "dead_letters" {
  for_each = local.dead_letter_queues

  alarm_name          = "${var.name_prefix}-${each.key}-dead-letters"
  alarm_description   = "Messages in ${each.value}: work that failed after retries (inspect, then redrive; docs/DEPLOY.md)."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = each.value }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
}

resource "aws_cloudwatch_metric_alarm" "errors" {
  for_each = aws_lambda_function.fn

  alarm_name          = "${var.name_prefix}-${each.key}-errors"
  alarm_description   = "${each.value.function_name} raised errors."
  namespace           = "AWS/Lambda"
  metric_name         = "Errors"
  dimensions          = { FunctionName = each.value.function_name }
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
}
