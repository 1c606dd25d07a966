# One service account per function, plus one for Cloud Scheduler and one per
# function for the Pub/Sub push deliveries it receives (jobs_push: the lister's listing
# jobs; push: the classifier's listings and the deleter's delete requests), each may
# invoke only its function. Each gets only what its step needs.

resource "google_service_account" "fn" {
  for_each = local.functions

  project      = var.project_id
  account_id   = "${var.name_prefix}-${each.key}"
  display_name = "orphan-cleanup ${each.key}"
}

resource "google_service_account" "scheduler" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-sched"
  display_name = "orphan-cleanup Cloud Scheduler caller"
}

resource "google_service_account" "push" {
  for_each = {
    classifier = "${var.name_prefix}-push"
    deleter    = "${var.name_prefix}-push-del"
  }

  project      = var.project_id
  account_id   = each.value
  display_name = "orphan-cleanup Pub/Sub push caller of the ${each.key}"
}

# The one push account of the classifier and the deleter: kept as the classifier's.
moved {
  from = google_service_account.push
  to   = google_service_account.push["classifier"]
}

resource "google_service_account" "jobs_push" {
  project      = var.project_id
  account_id   = "${var.name_prefix}-jobs"
  display_name = "orphan-cleanup Pub/Sub push caller of the lister (listing jobs)"
}

# ------------------------------------------------------------------- compute
# GCP IAM conditions cannot test resource labels (only names, types and
# Resource Manager tags), so unlike AWS the delete permission cannot be limited
# to resources labelled provider_ref: the deleter re-reads each resource by its
# numeric id and checks the label before deleting (docs/SAFETY.md rule 3).

locals {
  # What the code calls, derived from it by infra/checks (gcp_permissions.py):
  # aggregatedList per kind; projects.get for the identity check (docs/SAFETY.md
  # rule 11); snapshots.list for retain_snapshots_days; images.list (global).
  lister_permissions = [
    "compute.addresses.list",
    "compute.disks.list",
    "compute.forwardingRules.list",
    "compute.images.list",
    "compute.instances.list",
    "compute.projects.get",
    "compute.snapshots.list",
  ]
  # Read by numeric id (a list filtered on the id, hence .list), re-read by name, check
  # the label, delete, wait for the operation, read again to confirm; an instance's
  # aggregatedList for a retry leak's VM (holds_instance); projects.get for the identity
  # check.
  # snapshot_before_delete: disks.createSnapshot makes a labelled
  # snapshot (snapshots.create, setLabels), read back by name before the disk
  # goes; retain_snapshots_days deletes expired ones (a global operation).
  deleter_permissions = [
    "compute.addresses.delete",
    "compute.addresses.get",
    "compute.addresses.list",
    "compute.disks.createSnapshot",
    "compute.disks.delete",
    "compute.disks.get",
    "compute.disks.list",
    "compute.forwardingRules.delete",
    "compute.forwardingRules.get",
    "compute.forwardingRules.list",
    "compute.globalOperations.get",
    "compute.images.delete",
    "compute.images.get",
    "compute.images.list",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.projects.get",
    "compute.regionOperations.get",
    "compute.snapshots.create",
    "compute.snapshots.delete",
    "compute.snapshots.get",
    "compute.snapshots.list",
    "compute.snapshots.setLabels",
    "compute.zoneOperations.get",
  ]
  role_prefix = replace(var.name_prefix, "-", "_")
}

resource "google_project_iam_custom_role" "lister" {
  for_each = toset(local.compute_projects)

  project     = each.value
  role_id     = "${local.role_prefix}_lister"
  title       = "orphan-cleanup lister"
  description = "List instances, disks and addresses (aggregatedList) and snapshots."
  permissions = local.lister_permissions
}

resource "google_project_iam_custom_role" "deleter" {
  for_each = toset(local.compute_projects)

  project     = each.value
  role_id     = "${local.role_prefix}_deleter"
  title       = "orphan-cleanup deleter"
  description = "Read by id, re-read, delete and confirm deletion of instances, disks, addresses and snapshots; snapshot disks."
  permissions = local.deleter_permissions
}

resource "google_project_iam_member" "lister_compute" {
  for_each = toset(local.compute_projects)

  project = each.value
  role    = google_project_iam_custom_role.lister[each.value].id
  member  = google_service_account.fn["lister"].member
}

resource "google_project_iam_member" "deleter_compute" {
  for_each = toset(local.compute_projects)

  project = each.value
  role    = google_project_iam_custom_role.deleter[each.value].id
  member  = google_service_account.fn["deleter"].member
}

# ------------------------------------------------------------ secret, topics

# Each function may read its own database secret only.
resource "google_secret_manager_secret_iam_member" "database_url" {
  for_each = google_service_account.fn

  project   = var.project_id
  secret_id = google_secret_manager_secret.database_url[local.database_secret[each.key]].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value.member
}

# The Cloud SQL connector: every function connects (cloudsql.client); with IAM login each
# also logs in as its own IAM database user (cloudsql.instanceUser). Both on the ledger's
# instance only: an IAM condition on its resource name.
resource "google_project_iam_member" "cloud_sql_client" {
  for_each = var.cloud_sql_instance == null ? {} : google_service_account.fn

  project = local.cloud_sql_project
  role    = "roles/cloudsql.client"
  member  = each.value.member

  condition {
    title      = "orphan-cleanup ledger instance"
    expression = "resource.name == \"${local.cloud_sql_resource}\" && resource.service == \"sqladmin.googleapis.com\""
  }
}

resource "google_project_iam_member" "cloud_sql_instance_user" {
  for_each = var.cloud_sql_instance != null && var.cloud_sql_iam_auth ? google_service_account.fn : {}

  project = local.cloud_sql_project
  role    = "roles/cloudsql.instanceUser"
  member  = each.value.member

  condition {
    title      = "orphan-cleanup ledger instance"
    expression = "resource.name == \"${local.cloud_sql_resource}\" && resource.service == \"sqladmin.googleapis.com\""
  }
}

# Topic publishers: only the producing step (the tick runs in the lister).
resource "google_pubsub_topic_iam_member" "lister_publishes_jobs" {
  project = var.project_id
  topic   = google_pubsub_topic.jobs.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.fn["lister"].member
}

resource "google_pubsub_topic_iam_member" "lister_publishes_listing" {
  project = var.project_id
  topic   = google_pubsub_topic.listing.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.fn["lister"].member
}

resource "google_pubsub_topic_iam_member" "classifier_publishes_delete" {
  project = var.project_id
  topic   = google_pubsub_topic.delete.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.fn["classifier"].member
}

# ------------------------------------------------------------------- callers
# A 2nd gen function is served by a Cloud Run service: invoking it takes
# run.invoker on that service (service_config.service is its full name).

resource "google_cloud_run_v2_service_iam_member" "scheduler_invoker" {
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.fn["lister"].service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

resource "google_cloud_run_v2_service_iam_member" "jobs_push_invoker" {
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.fn["lister"].service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.jobs_push.member
}

resource "google_cloud_run_v2_service_iam_member" "push_invoker" {
  for_each = toset(["classifier", "deleter"])

  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.fn[each.value].service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.push[each.value].member
}

# Pub/Sub mints the OIDC token of push deliveries as the push accounts.
resource "google_service_account_iam_member" "pubsub_token_creator" {
  for_each = {
    classifier = google_service_account.push["classifier"].name
    deleter    = google_service_account.push["deleter"].name
    jobs       = google_service_account.jobs_push.name
  }

  service_account_id = each.value
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
}

# The token creator binding was a single resource before the jobs push account.
moved {
  from = google_service_account_iam_member.pubsub_token_creator
  to   = google_service_account_iam_member.pubsub_token_creator["push"]
}

# Then the push account was one per function: the shared one is the classifier's.
moved {
  from = google_service_account_iam_member.pubsub_token_creator["push"]
  to   = google_service_account_iam_member.pubsub_token_creator["classifier"]
}
