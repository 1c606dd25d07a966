locals {
  # Each queue feeds one function; visibility is 6 x its timeout, as AWS
  # advises for SQS event sources.
  queues = {
    listing = {
      consumer        = "classifier"
      batch_size      = 5
      max_concurrency = var.classifier_max_concurrency
    }
    delete = {
      consumer        = "deleter"
      batch_size      = 1
      max_concurrency = var.deleter_max_concurrency
    }
  }
}

resource "aws_sqs_queue" "dlq" {
  for_each = local.queues

  name                      = "${var.name_prefix}-${each.key}-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
}

resource "aws_sqs_queue" "main" {
  for_each = local.queues

  name                       = "${var.name_prefix}-${each.key}"
  visibility_timeout_seconds = 6 * local.functions[each.value.consumer].timeout
  message_retention_seconds  = 345600
  sqs_managed_sse_enabled    = true
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq[each.key].arn
    maxReceiveCount     = 5
  })
}

resource "aws_sqs_queue" "lister_dlq" {
  name                      = "${var.name_prefix}-lister-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
}

locals {
  all_queues = merge(
    { for k, q in aws_sqs_queue.main : k => q },
    { for k, q in aws_sqs_queue.dlq : "${k}-dlq" => q },
    { "lister-dlq" = aws_sqs_queue.lister_dlq },
  )
}

data "aws_iam_policy_document" "queue_tls" {
  for_each = local.all_queues

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [each.value.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "tls" {
  for_each = local.all_queues

  queue_url = each.value.url
  policy    = data.aws_iam_policy_document.queue_tls[each.key].json
}

resource "aws_lambda_event_source_mapping" "queue" {
  for_each = local.queues

  event_source_arn        = aws_sqs_queue.main[each.key].arn
  function_name           = aws_lambda_function.fn[each.value.consumer].arn
  batch_size              = each.value.batch_size
  function_response_types = ["ReportBatchItemFailures"]

  # Bounds concurrent work (EC2 API rate limits for the deleter) without the
  # throttling that reserved concurrency causes on SQS sources.
  scaling_config {
    maximum_concurrency = each.value.max_concurrency
  }
}
