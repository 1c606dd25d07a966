variable "name_prefix" {
  description = "Prefix of every resource name (functions, queues, roles, log groups, schedules)."
  type        = string
  default     = "orphan-cleanup"

  validation {
    condition     = can(regex("^[A-Za-z][A-Za-z0-9-]{2,30}$", var.name_prefix))
    error_message = "name_prefix: 3-31 characters, letters, digits and dashes."
  }
}

variable "tags" {
  description = "Tags added to every resource (provider default_tags)."
  type        = map(string)
  default     = {}
}

variable "lambda_zip" {
  description = "Path of the Lambda artifact built by `python infra/package.py`; null means build/aws/lambda.zip at the repository root."
  type        = string
  default     = null
}

variable "runtime" {
  description = "Lambda Python runtime; keep it at the CPython version infra/package.py builds the artifact's arm64 wheels for (3.11)."
  type        = string
  default     = "python3.11"
}

variable "database_roles" {
  description = "per-function (the default): each function logs in as its own database role (docs/DATABASE.md, \"One role per function\") and reads only its own secret, function_database_url_secret_arns (all three keys required); with RDS IAM authentication each connects as its own user (database_iam_users). shared: all three read database_url_secret_arn (the runtime role) and connect as database_iam_user, the explicit, wider choice."
  type        = string
  default     = "per-function"

  validation {
    condition     = contains(["per-function", "shared"], var.database_roles)
    error_message = "database_roles must be per-function or shared."
  }
}

variable "function_database_url_secret_arns" {
  description = "One secret per function, each holding the URL of that function's own database role (docs/DATABASE.md, \"One role per function\"): keys lister, classifier, deleter, all three required with database_roles = \"per-function\"; a function's role may read only its own."
  type        = map(string)
  default     = {}

  validation {
    condition = alltrue([for k, v in var.function_database_url_secret_arns : contains(["lister", "classifier", "deleter"], k)
    && can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@!-]+$", v))])
    error_message = "function_database_url_secret_arns: keys lister, classifier, deleter; values full Secrets Manager secret ARNs."
  }
}

variable "database_url_secret_arn" {
  description = "With database_roles = \"shared\" (required then, unused otherwise): the one secret of the three functions, whose SecretString is the runtime role's postgresql:// URL, or the JSON secret RDS rotates (rds!db-... ARNs too); the functions read it at cold start and after a refused password (DATABASE_URL_SECRET_ARN)."
  type        = string
  default     = null

  validation {
    condition     = var.database_url_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@!-]+$", var.database_url_secret_arn))
    error_message = "database_url_secret_arn must be a full Secrets Manager secret ARN."
  }
}

variable "database_secret_kms_key_arn" {
  description = "Customer-managed KMS key ARN encrypting the database secrets; null when they use aws/secretsmanager."
  type        = string
  default     = null

  validation {
    condition     = var.database_secret_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-f0-9-]+$", var.database_secret_kms_key_arn))
    error_message = "database_secret_kms_key_arn must be a KMS key ARN."
  }
}

variable "database_iam_resource_id" {
  description = "RDS IAM database authentication: the DB instance's DbiResourceId (db-...) or the Aurora cluster's resource id (cluster-...). Set: each function's role may rds-db:connect as its own database user only (database_iam_users; database_iam_user with database_roles = \"shared\"), and the functions get DATABASE_IAM_AUTH=true and DATABASE_USER (that user); the URL in the secret then names no password. null: password login."
  type        = string
  default     = null

  validation {
    condition     = var.database_iam_resource_id == null || can(regex("^(db|cluster)-[A-Z0-9]+$", var.database_iam_resource_id))
    error_message = "database_iam_resource_id must look like db-ABCDEFGHIJKL0123456789 or cluster-ABCDEFGHIJKL0123456789."
  }
}

variable "database_iam_users" {
  description = "With database_iam_resource_id and database_roles = \"per-function\": each function's database user (granted rds_iam and the function's role), keys lister, classifier, deleter."
  type        = map(string)
  default = {
    lister     = "orphan_cleanup_lister"
    classifier = "orphan_cleanup_classifier"
    deleter    = "orphan_cleanup_deleter"
  }

  validation {
    condition = length(setsubtract(["lister", "classifier", "deleter"], keys(var.database_iam_users))) == 0 && alltrue([
    for k, v in var.database_iam_users : contains(["lister", "classifier", "deleter"], k) && can(regex("^[A-Za-z_][A-Za-z0-9_$-]{0,62}$", v))])
    error_message = "database_iam_users: keys lister, classifier and deleter, each a Postgres role name."
  }
}

variable "database_iam_user" {
  description = "With database_iam_resource_id and database_roles = \"shared\": the one database user of the three functions (the runtime role)."
  type        = string
  default     = "orphan_cleanup_runtime"

  validation {
    condition     = can(regex("^[A-Za-z_][A-Za-z0-9_$-]{0,62}$", var.database_iam_user))
    error_message = "database_iam_user must be a Postgres role name."
  }
}

variable "schedule_expression" {
  description = "EventBridge Scheduler expression of the stack's one schedule (the tick): each tick invokes the lister with {}, which selects the due backends from the ledger and queues one listing job per listing, so a backend added to the ledger is picked up without an apply."
  type        = string
  default     = "rate(5 minutes)"
}

variable "max_mode" {
  description = "ORPHAN_CLEANUP_MAX_MODE, the ceiling: report or delete. A backend's row may say report under a delete stack, never delete under a report stack (docs/SAFETY.md rules 8 and 16)."
  type        = string
  default     = "report"

  validation {
    condition     = contains(["report", "delete"], var.max_mode)
    error_message = "max_mode must be report or delete."
  }
}

variable "mode" {
  description = "ORPHAN_CLEANUP_MODE: report, delete or off, the mode of a backend whose ledger row names none; never more than max_mode."
  type        = string
  default     = "report"

  validation {
    condition     = contains(["report", "delete", "off"], var.mode)
    error_message = "mode must be report, delete or off."
  }
}

variable "margin_seconds" {
  description = "ORPHAN_CLEANUP_MARGIN_SECONDS, the STEP 5 safety margin."
  type        = number
  default     = 300
}

variable "interval_seconds" {
  description = "ORPHAN_CLEANUP_INTERVAL_SECONDS, the cleanup interval."
  type        = number
  default     = 900
}

variable "confirm_seconds" {
  description = "ORPHAN_CLEANUP_CONFIRM_SECONDS, the confirmation window of mark-then-sweep (docs/SAFETY.md rule 23); null: the interval, 0: off. A backend's row may only lengthen it."
  type        = number
  default     = null

  validation {
    condition     = var.confirm_seconds == null ? true : var.confirm_seconds >= 0 && floor(var.confirm_seconds) == var.confirm_seconds
    error_message = "confirm_seconds must be a whole number of seconds, 0 or more."
  }
}

variable "max_deletes" {
  description = "ORPHAN_CLEANUP_MAX_DELETES, groups one cycle may delete before it deletes nothing."
  type        = number
  default     = 100
}

variable "max_delete_share" {
  description = "ORPHAN_CLEANUP_MAX_DELETE_SHARE, share of a backend's listed groups one cycle may delete."
  type        = number
  default     = 0.5

  validation {
    condition     = var.max_delete_share >= 0 && var.max_delete_share <= 1
    error_message = "max_delete_share must be between 0 and 1."
  }
}

variable "sentry_dsn" {
  description = "SENTRY_DSN; empty disables Sentry."
  type        = string
  default     = ""
  sensitive   = true
}

variable "tag_key" {
  description = "Tag key carrying the provider_ref (the backends' settings.tag_key); the deleter may only write EC2 resources whose value for it has 12 characters."
  type        = string
  default     = "provider_ref"

  validation {
    condition     = can(regex("^[A-Za-z0-9+=._:/@-]{1,128}$", var.tag_key))
    error_message = "tag_key: 1-128 letters, digits or + = . _ : / @ -."
  }
}

variable "protect_tag_keys" {
  description = "Every protect tag key the backends use (settings.protect_tag_key): the deleter's role gets one explicit Deny of every delete per key, whatever the tag's value. The first is the stack's own (ORPHAN_CLEANUP_PROTECT_TAG_KEY), which protects whatever the ledger's rows say."
  type        = list(string)
  default     = ["orphan-cleanup-protect"]

  validation {
    condition     = length(var.protect_tag_keys) > 0 && alltrue([for k in var.protect_tag_keys : can(regex("^[A-Za-z0-9+=._:/@-]{1,128}$", k))])
    error_message = "protect_tag_keys: at least one key, each 1-128 letters, digits or + = . _ : / @ -."
  }
}

variable "target_list_role_arn_pattern" {
  description = "Role ARN the lister may assume for backends in other accounts (their settings.role_arn): a fixed role name (and path), * allowed only for the account, e.g. arn:aws:iam::*:role/orphan-cleanup-list; null allows no cross-account listing. A * account needs target_organization_id or target_account_ids (the plan stops without them)."
  type        = string
  default     = null

  validation {
    condition     = var.target_list_role_arn_pattern == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|\\*):role/[A-Za-z0-9+=,.@_/-]+$", var.target_list_role_arn_pattern))
    error_message = "target_list_role_arn_pattern must be a role ARN whose path and name have no wildcard (* only for the account)."
  }
}

variable "target_delete_role_arn_pattern" {
  description = "Role ARN the deleter may assume for backends in other accounts (their settings.delete_role_arn): a fixed role name (and path), * allowed only for the account, e.g. arn:aws:iam::*:role/orphan-cleanup-delete (a * account needs target_organization_id or target_account_ids); null allows no cross-account deletes."
  type        = string
  default     = null

  validation {
    condition     = var.target_delete_role_arn_pattern == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|\\*):role/[A-Za-z0-9+=,.@_/-]+$", var.target_delete_role_arn_pattern))
    error_message = "target_delete_role_arn_pattern must be a role ARN whose path and name have no wildcard (* only for the account)."
  }
}

variable "target_organization_id" {
  description = "AWS Organizations id (o-...): the lister and deleter may assume target roles only in accounts of this organisation (aws:ResourceOrgID on sts:AssumeRole); null: no organisation condition."
  type        = string
  default     = null

  validation {
    condition     = var.target_organization_id == null || can(regex("^o-[a-z0-9]{10,32}$", var.target_organization_id))
    error_message = "target_organization_id must be an organisation id (o- and 10-32 lowercase letters or digits)."
  }
}

variable "target_account_ids" {
  description = "Account ids: the lister and deleter may assume target roles only in these accounts (aws:ResourceAccount on sts:AssumeRole); empty: no account condition."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.target_account_ids : can(regex("^[0-9]{12}$", a))])
    error_message = "target_account_ids must be 12-digit account ids."
  }
}

variable "subnet_ids" {
  description = "Subnets for the functions when the ledger is only reachable inside a VPC; empty runs them outside any VPC. The subnets need a route to the EC2, SQS, Secrets Manager, STS and X-Ray APIs (NAT or VPC endpoints; EC2 in other regions and Sentry need NAT), and the ledger's security group must admit security_group_ids on 5432."
  type        = list(string)
  default     = []
}

variable "security_group_ids" {
  description = "Security groups for the functions when subnet_ids is set."
  type        = list(string)
  default     = []
}

variable "lister_max_concurrency" {
  description = "Most listings the jobs queue drives at once (SQS scaling_config of the lister, 2-1000)."
  type        = number
  default     = 5

  validation {
    condition     = var.lister_max_concurrency >= 2 && var.lister_max_concurrency <= 1000
    error_message = "lister_max_concurrency must be between 2 and 1000 (SQS event source maximum_concurrency)."
  }
}

variable "classifier_max_concurrency" {
  description = "Most classifier instances the listing queue drives at once (SQS scaling_config, 2-1000)."
  type        = number
  default     = 5

  validation {
    condition     = var.classifier_max_concurrency >= 2 && var.classifier_max_concurrency <= 1000
    error_message = "classifier_max_concurrency must be between 2 and 1000 (SQS event source maximum_concurrency)."
  }
}

variable "deleter_max_concurrency" {
  description = "Most deleter instances the delete queue drives at once (SQS scaling_config, 2-1000); keeps EC2 API rate limits. Each handles one group at a time."
  type        = number
  default     = 2

  validation {
    condition     = var.deleter_max_concurrency >= 2 && var.deleter_max_concurrency <= 1000
    error_message = "deleter_max_concurrency must be between 2 and 1000 (SQS event source maximum_concurrency)."
  }
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the functions' logs (they record every verdict and delete; the ledger keeps the durable record)."
  type        = number
  default     = 365
}

variable "logs_kms_key_arn" {
  description = "Customer-managed KMS key ARN for the log groups (its key policy must let logs.<region>.amazonaws.com use it); null keeps CloudWatch's default encryption at rest."
  type        = string
  default     = null

  validation {
    condition     = var.logs_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-f0-9-]+$", var.logs_kms_key_arn))
    error_message = "logs_kms_key_arn must be a KMS key ARN."
  }
}

variable "queue_kms_key_arn" {
  description = "Customer-managed KMS key ARN for every queue (SSE-KMS); the roles get kms:GenerateDataKey / kms:Decrypt on it through SQS only, and its key policy must allow IAM policies of this account. null keeps SQS-managed encryption (SSE-SQS)."
  type        = string
  default     = null

  validation {
    condition     = var.queue_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-f0-9-]+$", var.queue_kms_key_arn))
    error_message = "queue_kms_key_arn must be a KMS key ARN."
  }
}

variable "redrive_role_arn" {
  description = "Role ARN (no wildcard) that may send to the jobs, listing and delete queues besides their producer function, e.g. an operator role that moves dead letters back (start-message-move-task needs sqs:SendMessage on the destination); null: only the producing function's role may send."
  type        = string
  default     = null

  validation {
    condition     = var.redrive_role_arn == null || can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$", var.redrive_role_arn))
    error_message = "redrive_role_arn must be one role's ARN, without wildcards."
  }
}

variable "code_signing_config_arn" {
  description = "Lambda code signing configuration (AWS Signer) for the three functions: with one whose policy enforces, Lambda refuses an artifact no allowed profile signed; null: no code signing."
  type        = string
  default     = null

  validation {
    condition     = var.code_signing_config_arn == null || can(regex("^arn:aws[a-z-]*:lambda:[a-z0-9-]+:[0-9]{12}:code-signing-config:csc-[a-z0-9]{17}$", var.code_signing_config_arn))
    error_message = "code_signing_config_arn must be a Lambda code signing configuration ARN."
  }
}

variable "alarm_topic_arn" {
  description = "SNS topic the alarms notify; null creates the alarms without actions."
  type        = string
  default     = null

  validation {
    condition     = var.alarm_topic_arn == null || can(regex("^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.alarm_topic_arn))
    error_message = "alarm_topic_arn must be an SNS topic ARN."
  }
}

variable "stale_alarm_intervals" {
  description = "The staleness alarm fires when an enabled backend has gone this many interval_seconds without a clean cycle (the tick's StalestBackendSeconds)."
  type        = number
  default     = 6
}

variable "digest_email" {
  description = "An email address subscribed to the digest topic (SNS asks it to confirm); null: none."
  type        = string
  default     = null

  validation {
    condition     = var.digest_email == null || can(regex("^[^@\\s]+@[^@\\s]+$", var.digest_email))
    error_message = "digest_email must be an email address."
  }
}

variable "digest_queue_arn" {
  description = "An SQS queue subscribed to the digest topic, raw delivery (its queue policy must let the topic send); null: none."
  type        = string
  default     = null

  validation {
    condition     = var.digest_queue_arn == null || can(regex("^arn:aws[a-z-]*:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$", var.digest_queue_arn))
    error_message = "digest_queue_arn must be an SQS queue ARN."
  }
}

variable "slack_webhook_secret_arn" {
  description = "A Secrets Manager secret holding a Slack incoming webhook URL: the functions post each digest there as a short text; null: no Slack post."
  type        = string
  default     = null

  validation {
    condition     = var.slack_webhook_secret_arn == null || can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@!-]+$", var.slack_webhook_secret_arn))
    error_message = "slack_webhook_secret_arn must be a full Secrets Manager secret ARN."
  }
}
