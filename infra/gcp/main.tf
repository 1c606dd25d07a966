data "google_project" "this" {
  project_id = var.project_id
}

data "google_storage_project_service_account" "gcs" {
  count = var.kms_key_name == null ? 0 : 1

  project = var.project_id
}

locals {
  source_archive   = coalesce(var.source_archive, "${path.module}/../../build/gcp/function-source.zip")
  compute_projects = distinct(concat([var.project_id], var.compute_projects))
  pubsub_agent     = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
  pubsub_kms_key   = var.pubsub_kms_key_name != null ? var.pubsub_kms_key_name : var.kms_key_name

  # Entry points in functions/gcp/main.py (README, Deploy). The lister is an HTTP
  # function: Cloud Scheduler posts the tick ({}), the jobs push subscription
  # posts Pub/Sub envelopes. The classifier and deleter receive Pub/Sub push
  # deliveries, which functions-framework turns into CloudEvents.
  functions = {
    lister = {
      entry_point   = "lister"
      description   = "orphan-cleanup lister: the tick ({} from Cloud Scheduler) publishes the due listings; each job from the jobs topic runs STEP 1-2"
      timeout       = 540
      max_instances = var.lister_max_instances
    }
    classifier = {
      entry_point   = "classifier"
      description   = "orphan-cleanup classifier (STEP 3-6), fed by the listing topic"
      timeout       = 300
      max_instances = var.classifier_max_instances
    }
    deleter = {
      entry_point   = "deleter"
      description   = "orphan-cleanup deleter, fed by the delete topic; one group per request"
      timeout       = 300
      max_instances = var.deleter_max_instances
    }
  }

  environment = merge(
    {
      ORPHAN_CLEANUP_MODE             = var.mode
      ORPHAN_CLEANUP_MAX_MODE         = var.max_mode
      ORPHAN_CLEANUP_PROTECT_TAG_KEY  = var.protect_tag_key
      ORPHAN_CLEANUP_MARGIN_SECONDS   = tostring(var.margin_seconds)
      ORPHAN_CLEANUP_INTERVAL_SECONDS = tostring(var.interval_seconds)
      ORPHAN_CLEANUP_MAX_DELETES      = tostring(var.max_deletes)
      ORPHAN_CLEANUP_MAX_DELETE_SHARE = tostring(var.max_delete_share)
      JOBS_TOPIC                      = google_pubsub_topic.jobs.id
      LISTING_TOPIC                   = google_pubsub_topic.listing.id
      DELETE_TOPIC                    = google_pubsub_topic.delete.id
      NOTIFY_TOPIC                    = google_pubsub_topic.digests.id
      POWERTOOLS_SERVICE_NAME         = "orphan-cleanup"
      POWERTOOLS_METRICS_NAMESPACE    = "OrphanCleanup"
      LOG_EXECUTION_ID                = "true"
    },
    var.confirm_seconds == null ? {} : { ORPHAN_CLEANUP_CONFIRM_SECONDS = tostring(var.confirm_seconds) },
    var.sentry_dsn == "" ? {} : { SENTRY_DSN = var.sentry_dsn },
    var.cloud_sql_instance == null ? {} : {
      CLOUD_SQL_INSTANCE = var.cloud_sql_instance
      CLOUD_SQL_IP_TYPE  = var.cloud_sql_ip_type
      CLOUD_SQL_IAM_AUTH = tostring(var.cloud_sql_iam_auth)
    },
  )
  # With IAM database login each function is its own database user: its service account's
  # email without .gserviceaccount.com, as Cloud SQL names IAM users.
  function_environment = { for name, _ in local.functions : name => merge(local.environment,
    var.cloud_sql_instance != null && var.cloud_sql_iam_auth ? {
      DATABASE_USER = trimsuffix(google_service_account.fn[name].email, ".gserviceaccount.com")
  } : {}) }
  # The instance's project: all but the region and the name (a project may be domain-scoped).
  cloud_sql_project = var.cloud_sql_instance == null ? null : join(":", slice(split(":", var.cloud_sql_instance), 0, length(split(":", var.cloud_sql_instance)) - 2))
  # Its resource name, which the IAM conditions of cloudsql.client and .instanceUser test.
  cloud_sql_resource = var.cloud_sql_instance == null ? null : "projects/${local.cloud_sql_project}/instances/${element(split(":", var.cloud_sql_instance), length(split(":", var.cloud_sql_instance)) - 1)}"

  # One database URL secret per function (its own database role, docs/DATABASE.md, "One role
  # per function"); one for the three only with database_roles = "shared".
  database_secrets = var.database_roles == "shared" ? { shared = "${var.name_prefix}-database-url" } : {
    for name, _ in local.functions : name => "${var.name_prefix}-${name}-database-url"
  }
  database_secret = { for name, _ in local.functions : name => var.database_roles == "shared" ? "shared" : name }

  apis = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
  ]
  # The Cloud SQL connector's Admin API calls (the address, an ephemeral certificate).
  cloud_sql_apis = var.cloud_sql_instance == null ? [] : ["sqladmin.googleapis.com"]
}

resource "google_project_service" "api" {
  for_each = var.enable_apis ? toset(concat(local.apis, local.cloud_sql_apis)) : toset([])

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

# ------------------------------------------------------------ source archive

resource "google_storage_bucket" "source" {
  #checkov:skip=CKV_GCP_62:The bucket holds only the functions' source archives (private, uniform access, public access prevented); reads are recorded by Cloud Audit Logs, usage logs would add nothing.
  name                        = "${var.project_id}-${var.name_prefix}-source"
  project                     = var.project_id
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  labels                      = var.labels

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      num_newer_versions = 3
    }
    action {
      type = "Delete"
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  depends_on = [google_kms_crypto_key_iam_member.gcs]
}

# The object name carries the archive's hash: a new build redeploys the functions.
resource "google_storage_bucket_object" "source" {
  name   = "function-source-${filemd5(local.source_archive)}.zip"
  bucket = google_storage_bucket.source.name
  source = local.source_archive
}

resource "google_kms_crypto_key_iam_member" "gcs" {
  for_each = var.kms_key_name == null ? toset([]) : toset(["gcs"])

  crypto_key_id = var.kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = "serviceAccount:${data.google_storage_project_service_account.gcs[0].email_address}"
}

resource "google_kms_crypto_key_iam_member" "pubsub" {
  for_each = local.pubsub_kms_key == null ? toset([]) : toset(["pubsub"])

  crypto_key_id = local.pubsub_kms_key
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = local.pubsub_agent
}

# ---------------------------------------------------------- database secret

# Each secret holds a ledger URL; a function gets its own as DATABASE_URL through
# secret_environment_variables, never as a plain variable, and may read no other.
resource "google_secret_manager_secret" "database_url" {
  for_each = local.database_secrets

  project   = var.project_id
  secret_id = each.value
  labels    = var.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.api]
}

resource "google_secret_manager_secret_version" "database_url" {
  count = var.database_url != null && var.database_roles == "shared" ? 1 : 0

  secret      = google_secret_manager_secret.database_url["shared"].id
  secret_data = var.database_url
}

# The one secret of the stack before one per function: kept as the shared one.
moved {
  from = google_secret_manager_secret.database_url
  to   = google_secret_manager_secret.database_url["shared"]
}
