# One schedule per backend: {"backend": "<id>"} to the lister.
resource "aws_scheduler_schedule" "backend" {
  #checkov:skip=CKV_AWS_297:The schedule holds only {"backend": "<id>"}, nothing sensitive; EventBridge Scheduler encrypts it at rest with an AWS owned key.
  for_each = var.backends

  name                = "${var.name_prefix}-${each.key}"
  description         = "orphan-cleanup lister run for backend ${each.key}"
  schedule_expression = coalesce(each.value.schedule_expression, var.schedule_expression)

  flexible_time_window {
    mode = "OFF"
  }

  target {
    arn      = aws_lambda_function.fn["lister"].arn
    role_arn = aws_iam_role.scheduler.arn
    input    = jsonencode({ backend = each.key })

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
