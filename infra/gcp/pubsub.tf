# Listing jobs (the tick -> lister), listing batches (lister -> classifier)
# and delete requests (classifier -> deleter). Each topic is delivered by a
# push subscription to its function, with a dead-letter topic that a pull
# subscription retains for inspection. Only the producing function's service
# account may publish to a topic (iam.tf).

resource "google_pubsub_topic" "jobs" {
  name         = "${var.name_prefix}-jobs"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = local.pubsub_kms_key

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic" "listing" {
  name         = "${var.name_prefix}-listing"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = local.pubsub_kms_key

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic" "delete" {
  name         = "${var.name_prefix}-delete"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = local.pubsub_kms_key

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic" "dead_letter" {
  for_each = toset(["jobs", "listing", "delete"])

  name         = "${var.name_prefix}-${each.key}-dead-letter"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = local.pubsub_kms_key

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_subscription" "dead_letter" {
  for_each = google_pubsub_topic.dead_letter

  name                       = "${each.value.name}-retain"
  project                    = var.project_id
  topic                      = each.value.id
  labels                     = var.labels
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60

  expiration_policy {
    ttl = ""
  }
}

locals {
  # The lister is an HTTP function: it gets the Pub/Sub push envelope itself
  # ({"message": {"data": base64(job)}, "subscription": ...}) and answers non-2xx
  # to have a job redelivered. The CloudEvent functions take the topic in the
  # path, which lets functions-framework fill the CloudEvent source.
  push = {
    jobs = {
      topic    = google_pubsub_topic.jobs
      function = "lister"
      path     = ""
      invoker  = google_service_account.jobs_push
    }
    listing = {
      topic    = google_pubsub_topic.listing
      function = "classifier"
      path     = "/${google_pubsub_topic.listing.id}"
      invoker  = google_service_account.push["classifier"]
    }
    delete = {
      topic    = google_pubsub_topic.delete
      function = "deleter"
      path     = "/${google_pubsub_topic.delete.id}"
      invoker  = google_service_account.push["deleter"]
    }
  }
}

resource "google_pubsub_subscription" "push" {
  for_each = local.push

  name    = "${var.name_prefix}-${each.key}-push"
  project = var.project_id
  topic   = each.value.topic.id
  labels  = var.labels
  # Longer than every function's timeout (lister 540 s), so a slow delivery
  # is not redelivered while it still runs.
  ack_deadline_seconds       = 600
  message_retention_duration = "86400s"

  push_config {
    push_endpoint = "${google_cloudfunctions2_function.fn[each.value.function].service_config[0].uri}${each.value.path}"

    oidc_token {
      service_account_email = each.value.invoker.email
      audience              = google_cloudfunctions2_function.fn[each.value.function].service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter[each.key].id
    max_delivery_attempts = var.max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [
    google_pubsub_topic_iam_member.dead_letter_publisher,
    google_cloud_run_v2_service_iam_member.push_invoker,
    google_cloud_run_v2_service_iam_member.jobs_push_invoker,
  ]
}

# Dead-lettering is done by the Pub/Sub service agent: it must publish to the
# dead-letter topic and acknowledge on the source subscription.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  for_each = google_pubsub_topic.dead_letter

  project = var.project_id
  topic   = each.value.name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  for_each = google_pubsub_subscription.push

  project      = var.project_id
  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}
