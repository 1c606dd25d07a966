variable "project_id" {
  description = "Project that hosts the functions, topics, scheduler jobs and the database URL secret."
  type        = string
}

variable "region" {
  description = "Region of the functions, the scheduler jobs and the source bucket."
  type        = string
  default     = "us-central1"
}

variable "name_prefix" {
  description = "Prefix of every resource name (functions, topics, service accounts, custom roles)."
  type        = string
  default     = "orphan-cleanup"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,17}$", var.name_prefix))
    error_message = "name_prefix: 3-18 characters, lowercase letters, digits and dashes (service account ids are at most 30 characters)."
  }
}

variable "labels" {
  description = "Labels added to the resources that take labels."
  type        = map(string)
  default     = {}
}

variable "enable_apis" {
  description = "Enable the Google APIs the stack needs (Cloud Functions, Run, Build, Artifact Registry, Pub/Sub, Scheduler, Secret Manager, Storage, Compute, IAM, Monitoring)."
  type        = bool
  default     = true
}

variable "source_archive" {
  description = "Path of the Cloud Functions source zip built by `python infra/package.py`; null means build/gcp/function-source.zip at the repository root."
  type        = string
  default     = null
}

variable "runtime" {
  description = "Cloud Functions Python runtime; the tested interpreter is CPython 3.11."
  type        = string
  default     = "python311"
}

variable "build_service_account" {
  description = "Service account (full resource name projects/P/serviceAccounts/EMAIL) Cloud Build uses to build the functions; null uses the project's default build account."
  type        = string
  default     = null
}

variable "schedule" {
  description = "Cron schedule of the stack's one Cloud Scheduler job (the tick): each tick posts {} to the lister, which selects the due backends from the ledger and publishes one listing job per listing, so a backend added to the ledger is picked up without an apply."
  type        = string
  default     = "*/5 * * * *"
}

variable "time_zone" {
  description = "Time zone of the tick's schedule."
  type        = string
  default     = "Etc/UTC"
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

variable "protect_tag_key" {
  description = "ORPHAN_CLEANUP_PROTECT_TAG_KEY, the stack's own protect label key: a resource carrying it is never deleted, whatever the ledger's rows say (GCP IAM conditions cannot test labels, so the deleter checks it)."
  type        = string
  default     = "orphan-cleanup-protect"

  validation {
    condition     = can(regex("^[a-z][a-z0-9_-]{0,62}$", var.protect_tag_key))
    error_message = "protect_tag_key must be a label key: lowercase letters, digits, _ and -, starting with a letter."
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

variable "database_roles" {
  description = "per-function (the default): each function logs in as its own database role (docs/DATABASE.md, \"One role per function\") and reads only its own secret (one per function, database_url_secrets); with cloud_sql_iam_auth each is its own IAM database user too. shared: the three read one secret (the runtime role's URL), the explicit, wider choice."
  type        = string
  default     = "per-function"

  validation {
    condition     = contains(["per-function", "shared"], var.database_roles)
    error_message = "database_roles must be per-function or shared."
  }
}

variable "database_url" {
  description = "With database_roles = \"shared\": the runtime role's postgresql:// URL. When set, Terraform stores it as a secret version (and so in its state); leave null and add the versions with gcloud instead (docs/DEPLOY.md), as for the per-function secrets."
  type        = string
  default     = null
  sensitive   = true
}

variable "compute_projects" {
  description = "Projects whose instances, disks and addresses the functions list and delete; empty means project_id only. A custom role is created in each (needs iam.roles.create there)."
  type        = list(string)
  default     = []
}

variable "lister_max_instances" {
  description = "Most lister instances at once (each serves one request: the tick or one listing job), so it bounds concurrent listings."
  type        = number
  default     = 5
}

variable "classifier_max_instances" {
  description = "Most classifier instances at once (each serves one request)."
  type        = number
  default     = 5
}

variable "deleter_max_instances" {
  description = "Most deleter instances at once, each deleting one group: bounds concurrent Compute API delete calls."
  type        = number
  default     = 2
}

variable "max_delivery_attempts" {
  description = "Pub/Sub deliveries of one message before it goes to the dead-letter topic (5-100). Deliveries refused while the function is at its instance limit count too, so keep it well above 5."
  type        = number
  default     = 15

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts must be between 5 and 100."
  }
}

variable "function_memory" {
  description = "Memory of each function."
  type        = string
  default     = "512M"
}

variable "vpc_connector" {
  description = "Serverless VPC Access connector (projects/P/locations/R/connectors/C) when the ledger database has only a private address; null for none."
  type        = string
  default     = null
}

variable "cloud_sql_instance" {
  description = "Cloud SQL instance connection name (PROJECT:REGION:INSTANCE) of the ledger: the functions connect through the Cloud SQL Python Connector (CLOUD_SQL_INSTANCE) and their service accounts get roles/cloudsql.client on that instance only (an IAM condition on its name). The URL in the secret then names only the user, password and database (postgresql://USER:PASSWORD@/DATABASE). null: the URL's host."
  type        = string
  default     = null

  validation {
    condition     = var.cloud_sql_instance == null || can(regex("^([a-z0-9.-]+:)?[a-z][a-z0-9-]*:[a-z0-9-]+:[a-z0-9][a-z0-9-]*$", var.cloud_sql_instance))
    error_message = "cloud_sql_instance must be PROJECT:REGION:INSTANCE."
  }
}

variable "cloud_sql_iam_auth" {
  description = "With cloud_sql_instance: log in as IAM database users (CLOUD_SQL_IAM_AUTH), each function as its own service account (DATABASE_USER), with roles/cloudsql.instanceUser. Create those users on the instance and grant them the runtime role (docs/DATABASE.md)."
  type        = bool
  default     = false
}

variable "cloud_sql_ip_type" {
  description = "Which address of the instance the connector uses (CLOUD_SQL_IP_TYPE): public, private (through vpc_connector) or psc."
  type        = string
  default     = "public"

  validation {
    condition     = contains(["public", "private", "psc"], var.cloud_sql_ip_type)
    error_message = "cloud_sql_ip_type must be public, private or psc."
  }
}

variable "ingress_settings" {
  description = "Who may call the functions: ALLOW_INTERNAL_ONLY lets Cloud Scheduler and Pub/Sub of this project through and nobody from outside."
  type        = string
  default     = "ALLOW_INTERNAL_ONLY"

  validation {
    condition     = contains(["ALLOW_ALL", "ALLOW_INTERNAL_ONLY", "ALLOW_INTERNAL_AND_GCLB"], var.ingress_settings)
    error_message = "ingress_settings must be ALLOW_ALL, ALLOW_INTERNAL_ONLY or ALLOW_INTERNAL_AND_GCLB."
  }
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channel ids the alerts notify; empty creates the alerts without notifications."
  type        = list(string)
  default     = []
}

variable "kms_key_name" {
  description = "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for the source bucket, and for the topics unless pubsub_kms_key_name is set; null uses Google-managed keys."
  type        = string
  default     = null
}

variable "pubsub_kms_key_name" {
  description = "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) for every Pub/Sub topic (jobs, listing, delete, dead letters); null falls back to kms_key_name, and both null uses Google-managed keys. The stack lets the Pub/Sub service agent use it."
  type        = string
  default     = null
}

variable "stale_alarm_intervals" {
  description = "The staleness alert fires when an enabled backend has gone this many interval_seconds without a clean cycle (the tick's stalest_backend_seconds)."
  type        = number
  default     = 6
}

variable "digest_subscription" {
  description = "Create a pull subscription on the digest topic (NOTIFY_TOPIC), for a reader of the digests; the topic is created either way."
  type        = bool
  default     = false
}

variable "slack_webhook_secret" {
  description = "The id of a Secret Manager secret (in project_id) holding a Slack incoming webhook URL: the functions read it as SLACK_WEBHOOK_URL and post each digest there; null: no Slack post."
  type        = string
  default     = null
}

variable "log_retention_days" {
  description = "Days the functions' own log bucket keeps their logs (they record every verdict and delete; the ledger keeps the durable record): 1-3650."
  type        = number
  default     = 365

  validation {
    condition     = var.log_retention_days >= 1 && var.log_retention_days <= 3650
    error_message = "log_retention_days must be 1-3650."
  }
}
