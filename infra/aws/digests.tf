# Each eventful cycle's C6 digest (README, "Knowing it works"): JSON messages on an SNS
# topic (type, backend and outcome attributes, for subscription filter policies), an
# optional email or SQS subscription, and an optional Slack webhook the functions post to.

resource "aws_sns_topic" "digests" {
  name              = "${var.name_prefix}-digests"
  display_name      = "orphan-cleanup digests"
  kms_master_key_id = "alias/aws/sns"
}

resource "aws_sns_topic_subscription" "digest_email" {
  count = var.digest_email == null ? 0 : 1

  topic_arn = aws_sns_topic.digests.arn
  protocol  = "email"
  endpoint  = var.digest_email
}

resource "aws_sns_topic_subscription" "digest_queue" {
  count = var.digest_queue_arn == null ? 0 : 1

  topic_arn            = aws_sns_topic.digests.arn
  protocol             = "sqs"
  endpoint             = var.digest_queue_arn
  raw_message_delivery = true
}

data "aws_iam_policy_document" "digests" {
  statement {
    sid       = "PublishDigests"
    actions   = ["sns:Publish"]
    resources = [aws_sns_topic.digests.arn]
  }
}

resource "aws_iam_role_policy" "digests" {
  for_each = local.functions

  name   = "digests"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.digests.json
}

data "aws_iam_policy_document" "slack_webhook" {
  count = var.slack_webhook_secret_arn == null ? 0 : 1

  statement {
    sid       = "ReadSlackWebhook"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.slack_webhook_secret_arn]
  }
}

resource "aws_iam_role_policy" "slack_webhook" {
  for_each = var.slack_webhook_secret_arn == null ? {} : local.functions

  name   = "slack-webhook"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.slack_webhook[0].json
}

locals {
  digest_environment = merge(
    { NOTIFY_TOPIC_ARN = aws_sns_topic.digests.arn },
    var.slack_webhook_secret_arn == null ? {} : { SLACK_WEBHOOK_SECRET_ARN = var.slack_webhook_secret_arn },
  )
}
