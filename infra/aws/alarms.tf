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

# Knowing it works (README): a backend that has gone too long without a clean cycle, and a
# tick that stopped (no lister invocation: missing data is breaching).
locals {
  stale_alarm_seconds = var.stale_alarm_intervals * var.interval_seconds
  # A CloudWatch period is a multiple of 60 s; three of them fit in a day.
  tick_alarm_period = min(28800, max(60, floor(var.interval_seconds / 60) * 60))
}

resource "aws_cloudwatch_metric_alarm" "stalest_backend" {
  alarm_name          = "${var.name_prefix}-stalest-backend"
  alarm_description   = "A backend has gone ${var.stale_alarm_intervals} intervals without a clean cycle (always unsettled, failing, or never run): orphan-cleanup status names it (README, Knowing it works)."
  namespace           = "OrphanCleanup"
  metric_name         = "StalestBackendSeconds"
  dimensions          = { service = "orphan-cleanup" }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  threshold           = local.stale_alarm_seconds
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching" # no data at all is the stopped tick's alarm
  alarm_actions       = local.alarm_actions
}

resource "aws_cloudwatch_metric_alarm" "tick_stopped" {
  alarm_name          = "${var.name_prefix}-tick-stopped"
  alarm_description   = "The lister was not invoked for three intervals: the schedule or the function stopped, and nothing is cleaned (README, Knowing it works)."
  namespace           = "AWS/Lambda"
  metric_name         = "Invocations"
  dimensions          = { FunctionName = aws_lambda_function.fn["lister"].function_name }
  statistic           = "Sum"
  period              = local.tick_alarm_period
  evaluation_periods  = 3
  datapoints_to_alarm = 3
  threshold           = 1
  comparison_operator = "LessThanThreshold"
  treat_missing_data  = "breaching"
  alarm_actions       = local.alarm_actions
}
