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
  description = "Lambda Python runtime (the artifact's wheels are built for CPython 3.12 on arm64)."
  type        = string
  default     = "python3.12"
}

variable "database_url_secret_arn" {
  description = "ARN of the Secrets Manager secret whose SecretString is the ledger's postgresql:// URL; the functions read it at cold start (DATABASE_URL_SECRET_ARN)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:.+$", var.database_url_secret_arn))
    error_message = "database_url_secret_arn must be a full Secrets Manager secret ARN."
  }
}

variable "database_secret_kms_key_arn" {
  description = "Customer-managed KMS key ARN encrypting the database secret; null when it uses aws/secretsmanager."
  type        = string
  default     = null
}

variable "backends" {
  description = "Backends to schedule, keyed by backend id (a row of the ledger's backends table). One EventBridge Scheduler schedule per entry; schedule_expression overrides the default."
  type = map(object({
    schedule_expression = optional(string)
  }))
  default = {}

  validation {
    condition     = alltrue([for id in keys(var.backends) : can(regex("^[A-Za-z0-9_.-]{1,40}$", id))])
    error_message = "Backend ids become schedule names: letters, digits, '_', '.' and '-' only, at most 40."
  }
}

variable "schedule_expression" {
  description = "Default EventBridge Scheduler expression of a backend's lister run. A run whose backend saw no ledger activity since its last clean cycle ends early (STEP 1), so a short rate is cheap."
  type        = string
  default     = "rate(5 minutes)"
}

variable "mode" {
  description = "ORPHAN_CLEANUP_MODE: report, delete or off. A backend's own mode in the ledger overrides it."
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
  description = "Tag key carrying the provider_ref; the deleter may only write EC2 resources that carry it."
  type        = string
  default     = "provider_ref"
}

variable "protect_tag_key" {
  description = "Tag key that makes a resource untouchable (explicit Deny), whatever its value."
  type        = string
  default     = "orphan-cleanup-protect"
}

variable "target_role_arn_pattern" {
  description = "Role ARN (or pattern with *) the lister and deleter may assume for backends in other accounts, e.g. arn:aws:iam::*:role/orphan-cleanup-target; null allows no cross-account access."
  type        = string
  default     = null
}

variable "subnet_ids" {
  description = "Subnets for the functions when the ledger is only reachable inside a VPC; empty runs them outside any VPC. The subnets need a route to the EC2, SQS, Secrets Manager and STS APIs."
  type        = list(string)
  default     = []
}

variable "security_group_ids" {
  description = "Security groups for the functions when subnet_ids is set."
  type        = list(string)
  default     = []
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
}

variable "alarm_topic_arn" {
  description = "SNS topic the alarms notify; null creates the alarms without actions."
  type        = string
  default     = null
}
