# One schedule per stack, the tick: {} to the lister, which selects the due
# backends in the ledger and queues one listing job per listing (a backend
# added to the ledger needs no apply).
resource "aws_scheduler_schedule" "tick" {
  #checkov:skip=CKV_AWS_297:The schedule holds only the input {}, nothing sensitive; EventBridge Scheduler encrypts it at rest with an AWS owned key.
  name                = "${var.name_prefix}-tick"
  description         = "orphan-cleanup tick: the lister queues a listing job per due backend"
  schedule_expression = var.schedule_expression

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = aws_lambda_function.fn["lister"].arn
    role_arn = aws_iam_role.scheduler.arn
    input    = jsonencode({})

    retry_policy {
      maximum_retry_attempts       = 2
      maximum_event_age_in_seconds = 300
    }
  }
}

data "aws_iam_policy_document" "scheduler_trust" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["scheduler.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

data "aws_iam_policy_document" "scheduler" {
  statement {
    sid       = "InvokeLister"
    actions   = ["lambda:InvokeFunction"]
    resources = [aws_lambda_function.fn["lister"].arn, "${aws_lambda_function.fn["lister"].arn}:*"]
  }
}

resource "aws_iam_role" "scheduler" {
  name               = "${var.name_prefix}-scheduler"
  description        = "EventBridge Scheduler invoking the orphan-cleanup lister."
  assume_role_policy = data.aws_iam_policy_document.scheduler_trust.json
}

resource "aws_iam_role_policy" "scheduler" {
  name   = "invoke-lister"
  role   = aws_iam_role.scheduler.id
  policy = data.aws_iam_policy_document.scheduler.json
}
