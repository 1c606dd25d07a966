data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

data "aws_region" "current" {}

locals {
  lambda_zip = coalesce(var.lambda_zip, "${path.module}/../../build/aws/lambda.zip")
  in_vpc     = length(var.subnet_ids) > 0
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  # Handlers per README, Deploy: functions/aws/<step>.py:handler.
  functions = {
    lister = {
      handler     = "functions.aws.lister.handler"
      timeout     = 300
      description = "orphan-cleanup lister: the tick ({} from EventBridge Scheduler) queues the due listings; each job from the jobs queue runs STEP 1-2"
    }
    classifier = {
      handler     = "functions.aws.classifier.handler"
      timeout     = 120
      description = "orphan-cleanup classifier (STEP 3-6), fed by the listing queue"
    }
    deleter = {
      handler     = "functions.aws.deleter.handler"
      timeout     = 180
      description = "orphan-cleanup deleter, fed by the delete queue; one group per invocation"
    }
  }

  # ORPHAN_CLEANUP_PROTECT_TAG_KEY, the stack's own protect key, is one the deleter's IAM
  # Deny covers (infra/checks).
  environment = merge(
    {
      ORPHAN_CLEANUP_MODE             = var.mode
      ORPHAN_CLEANUP_MAX_MODE         = var.max_mode
      ORPHAN_CLEANUP_PROTECT_TAG_KEY  = var.protect_tag_keys[0]
      ORPHAN_CLEANUP_MARGIN_SECONDS   = tostring(var.margin_seconds)
      ORPHAN_CLEANUP_INTERVAL_SECONDS = tostring(var.interval_seconds)
      ORPHAN_CLEANUP_MAX_DELETES      = tostring(var.max_deletes)
      ORPHAN_CLEANUP_MAX_DELETE_SHARE = tostring(var.max_delete_share)
      JOBS_QUEUE_URL                  = aws_sqs_queue.main["jobs"].url
      LISTING_QUEUE_URL               = aws_sqs_queue.main["listing"].url
      DELETE_QUEUE_URL                = aws_sqs_queue.main["delete"].url
      POWERTOOLS_SERVICE_NAME         = "orphan-cleanup"
      POWERTOOLS_METRICS_NAMESPACE    = "OrphanCleanup"
    },
    var.confirm_seconds == null ? {} : { ORPHAN_CLEANUP_CONFIRM_SECONDS = tostring(var.confirm_seconds) },
    var.sentry_dsn == "" ? {} : { SENTRY_DSN = var.sentry_dsn },
    local.iam_auth ? { DATABASE_IAM_AUTH = "true" } : {},
    local.digest_environment,
  )
  iam_auth        = var.database_iam_resource_id != null
  shared_database = var.database_roles == "shared"
  # Each function's own secret (its own database role); the shared one only by choice
  # (docs/DATABASE.md, "One role per function"). The preconditions of runtime refuse a
  # missing one.
  database_secret = { for k in keys(local.functions) : k => local.shared_database ? var.database_url_secret_arn : lookup(var.function_database_url_secret_arns, k, null) }
  # With RDS IAM authentication, the one database user each function may connect as.
  database_user = { for k in keys(local.functions) : k => local.shared_database ? var.database_iam_user : var.database_iam_users[k] }
}

# This deployment's own id (a UUID, made at the first apply, kept in the state): in the log
# groups' names with the tool, so that neither this stack applied again after a destroy (its
# groups outlive it) nor a SAM stack of the same name collides with them (docs/DEPLOY.md,
# "Redeploys").
resource "terraform_data" "deployment" {}

resource "aws_cloudwatch_log_group" "fn" {
  for_each = local.functions

  name              = "/orphan-cleanup/tf/${var.name_prefix}/${terraform_data.deployment.id}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.logs_kms_key_arn
  # Kept by `terraform destroy`: the record of every verdict and delete outlives the stack,
  # for log_retention_days (docs/DEPLOY.md, "Logs").
  skip_destroy = true
}

resource "aws_lambda_function" "fn" {
  #checkov:skip=CKV_AWS_115:No reserved concurrency: it fails to deploy in accounts with a low concurrency quota; every SQS-driven invocation (the lister's jobs included) is capped by scaling_config.maximum_concurrency.
  #checkov:skip=CKV_AWS_116:The classifier and deleter are SQS-driven (their queues have DLQs); the lister, the only async-invoked function (the tick), has a dead_letter_config.
  #checkov:skip=CKV_AWS_117:VPC attachment is optional (subnet_ids); only needed when the ledger database is private.
  #checkov:skip=CKV_AWS_173:No secret in the environment: the database URL stays in Secrets Manager (only its ARN is here); the Sentry DSN is a client key.
  #checkov:skip=CKV_AWS_272:Code signing is optional: set code_signing_config_arn (AWS Signer); checkov cannot see a configuration given as a variable.
  for_each = local.functions

  function_name    = "${var.name_prefix}-${each.key}"
  description      = each.value.description
  filename         = local.lambda_zip
  source_code_hash = filebase64sha256(local.lambda_zip)
  handler          = each.value.handler
  runtime          = var.runtime
  architectures    = ["arm64"]
  memory_size      = 512
  timeout          = each.value.timeout
  role             = aws_iam_role.fn[each.key].arn
  # With an enforcing policy, Lambda refuses an artifact no allowed profile signed.
  code_signing_config_arn = var.code_signing_config_arn

  environment {
    variables = merge(local.environment, { DATABASE_URL_SECRET_ARN = local.database_secret[each.key] },
    local.iam_auth ? { DATABASE_USER = local.database_user[each.key] } : {})
  }

  tracing_config {
    mode = "Active"
  }

  logging_config {
    log_format = "Text"
    log_group  = aws_cloudwatch_log_group.fn[each.key].name
  }

  dynamic "vpc_config" {
    for_each = local.in_vpc ? [true] : []
    content {
      subnet_ids         = var.subnet_ids
      security_group_ids = var.security_group_ids
    }
  }

  # Ticks (async lister invokes) that failed after Lambda's async retries.
  dynamic "dead_letter_config" {
    for_each = each.key == "lister" ? [true] : []
    content {
      target_arn = aws_sqs_queue.lister_dlq.arn
    }
  }

  depends_on = [
    aws_iam_role_policy.runtime,
    aws_iam_role_policy.step,
    aws_iam_role_policy.vpc_access,
    aws_iam_role_policy.queue_key,
  ]

  lifecycle {
    # Under a report ceiling nothing is deleted (docs/SAFETY.md rule 8): a delete stack says so twice.
    precondition {
      condition     = var.mode != "delete" || var.max_mode == "delete"
      error_message = "mode = \"delete\" needs max_mode = \"delete\": under a report ceiling nothing is deleted (docs/DEPLOY.md, \"Turn on deletion\")."
    }
  }
}

resource "aws_lambda_function_event_invoke_config" "lister" {
  function_name                = aws_lambda_function.fn["lister"].function_name
  maximum_retry_attempts       = 1
  maximum_event_age_in_seconds = 900
}
