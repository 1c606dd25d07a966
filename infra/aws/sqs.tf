locals {
  # Each work queue feeds one function and is fed by one role (ARCHITECTURE.md:
  # tick -> jobs -> lister -> listing -> classifier -> delete -> deleter);
  # visibility is 6 x the consumer's timeout, as AWS advises for SQS event sources.
  queues = {
    jobs = {
      consumer          = "lister"
      producer          = "lister"
      batch_size        = 1
      max_concurrency   = var.lister_max_concurrency
      max_receive_count = 3
      # A day-old job is stale anyway: the next tick queues a fresh one.
      retention_seconds = 86400
    }
    listing = {
      consumer          = "classifier"
      producer          = "lister"
      batch_size        = 5
      max_concurrency   = var.classifier_max_concurrency
      max_receive_count = 5
      retention_seconds = 345600
    }
    delete = {
      consumer          = "deleter"
      producer          = "classifier"
      batch_size        = 1
      max_concurrency   = var.deleter_max_concurrency
      max_receive_count = 5
      retention_seconds = 345600
    }
  }
  # SSE-SQS unless a customer key is given (the two settings exclude each other).
  queue_sse_managed = var.queue_kms_key_arn == null ? true : null
}

resource "aws_sqs_queue" "dlq" {
  for_each = local.queues

  name                      = "${var.name_prefix}-${each.key}-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = local.queue_sse_managed
  kms_master_key_id         = var.queue_kms_key_arn
}

resource "aws_sqs_queue" "main" {
  for_each = local.queues

  name                       = "${var.name_prefix}-${each.key}"
  visibility_timeout_seconds = 6 * local.functions[each.value.consumer].timeout
  message_retention_seconds  = each.value.retention_seconds
  sqs_managed_sse_enabled    = local.queue_sse_managed
  kms_master_key_id          = var.queue_kms_key_arn
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq[each.key].arn
    maxReceiveCount     = each.value.max_receive_count
  })
}

resource "aws_sqs_queue" "lister_dlq" {
  name                      = "${var.name_prefix}-lister-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = local.queue_sse_managed
  kms_master_key_id         = var.queue_kms_key_arn
}

locals {
  all_queues = merge(
    { for k, q in aws_sqs_queue.main : k => q },
    { for k, q in aws_sqs_queue.dlq : "${k}-dlq" => q },
    { "lister-dlq" = aws_sqs_queue.lister_dlq },
  )
}

# One policy per queue: no plain HTTP; on a work queue, SendMessage only from
# its producer's role (and redrive_role_arn), whatever IAM policies say.
data "aws_iam_policy_document" "queue" {
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

  dynamic "statement" {
    for_each = contains(keys(local.queues), each.key) ? [local.queues[each.key].producer] : []
    content {
      sid       = "OnlyTheProducerSends"
      effect    = "Deny"
      actions   = ["sqs:SendMessage"]
      resources = [each.value.arn]

      principals {
        type        = "*"
        identifiers = ["*"]
      }

      condition {
        test     = "ArnNotLike"
        variable = "aws:PrincipalArn"
        values   = concat([aws_iam_role.fn[statement.value].arn], var.redrive_role_arn == null ? [] : [var.redrive_role_arn])
      }
    }
  }

  # A dead letter is redriven to its work queue as it is: nobody may inject one. SQS moves
  # failed messages into the redrive DLQs itself (no principal ARN: the Null condition
  # leaves it alone); Lambda sends the lister's failed async invokes with the lister's role.
  dynamic "statement" {
    for_each = contains(keys(local.queues), each.key) || each.key == "lister-dlq" ? [] : [each.key]
    content {
      sid       = "NobodySendsDeadLetters"
      effect    = "Deny"
      actions   = ["sqs:SendMessage"]
      resources = [each.value.arn]

      principals {
        type        = "*"
        identifiers = ["*"]
      }

      condition {
        test     = "Null"
        variable = "aws:PrincipalArn"
        values   = ["false"]
      }
    }
  }

  dynamic "statement" {
    for_each = each.key == "lister-dlq" ? ["lister"] : []
    content {
      sid       = "OnlyTheListerSendsItsDeadLetters"
      effect    = "Deny"
      actions   = ["sqs:SendMessage"]
      resources = [each.value.arn]

      principals {
        type        = "*"
        identifiers = ["*"]
      }

      condition {
        test     = "Null"
        variable = "aws:PrincipalArn"
        values   = ["false"]
      }

      condition {
        test     = "ArnNotLike"
        variable = "aws:PrincipalArn"
        values   = [aws_iam_role.fn[statement.value].arn]
      }
    }
  }
}

resource "aws_sqs_queue_policy" "queue" {
  for_each = local.all_queues

  queue_url = each.value.url
  policy    = data.aws_iam_policy_document.queue[each.key].json
}

resource "aws_lambda_event_source_mapping" "queue" {
  for_each = local.queues

  event_source_arn        = aws_sqs_queue.main[each.key].arn
  function_name           = aws_lambda_function.fn[each.value.consumer].arn
  batch_size              = each.value.batch_size
  function_response_types = ["ReportBatchItemFailures"]

  # Bounds concurrent work (EC2 API rate limits, database connections) without
  # the throttling that reserved concurrency causes on SQS sources.
  scaling_config {
    maximum_concurrency = each.value.max_concurrency
  }
}

# The queue policies were called "tls" before the producer-only statement.
moved {
  from = aws_sqs_queue_policy.tls
  to   = aws_sqs_queue_policy.queue
}
