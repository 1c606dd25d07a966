# Listing batches (lister -> classifier) and delete requests (classifier ->
# deleter). Each topic is delivered by a push subscription to its function,
# with a dead-letter topic that a pull subscription retains for inspection.

resource "google_pubsub_topic" "listing" {
  name         = "${var.name_prefix}-listing"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = var.kms_key_name

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic" "delete" {
  name         = "${var.name_prefix}-delete"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = var.kms_key_name

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic" "dead_letter" {
  for_each = toset(["listing", "delete"])

  name         = "${var.name_prefix}-${each.key}-dead-letter"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = var.kms_key_name

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
  push = {
    listing = {
      topic    = google_pubsub_topic.listing
      function = "classifier"
    }
    delete = {
      topic    = google_pubsub_topic.delete
      function = "deleter"
    }
  }
}

resource "google_pubsub_subscription" "push" {
  for_each = local.push

  name    = "${var.name_prefix}-${each.key}-push"
  project = var.project_id
  topic   = each.value.topic.id
  labels  = var.labels
  # Longer than the function's timeout, so a slow delivery is not redelivered.
  ack_deadline_seconds       = 600
  message_retention_duration = "86400s"

  push_config {
    # The topic in the path lets functions-framework fill the CloudEvent source.
    push_endpoint = "${google_cloudfunctions2_function.fn[each.value.function].service_config[0].uri}/${each.value.topic.id}"

    oidc_token {
      service_account_email = google_service_account.push.email
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
