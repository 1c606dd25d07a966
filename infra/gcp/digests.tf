# Each eventful cycle's C6 digest (README, "Knowing it works"): JSON messages on a Pub/Sub
# topic (type, backend and outcome attributes), which every function may publish to (the
# one that finishes a cycle sends its digest), and an optional email through a Cloud
# Monitoring channel is the operator's (subscribe a push endpoint or a Cloud Function).

resource "google_pubsub_topic" "digests" {
  name         = "${var.name_prefix}-digests"
  project      = var.project_id
  labels       = var.labels
  kms_key_name = local.pubsub_kms_key

  depends_on = [google_project_service.api, google_kms_crypto_key_iam_member.pubsub]
}

resource "google_pubsub_topic_iam_member" "digest_publisher" {
  for_each = local.functions

  project = var.project_id
  topic   = google_pubsub_topic.digests.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.fn[each.key].member
}

# Optional: a Slack incoming webhook URL in a Secret Manager secret of the operator's; each
# function reads it as SLACK_WEBHOOK_URL and posts each digest there as a short text.
resource "google_secret_manager_secret_iam_member" "slack_webhook" {
  for_each = var.slack_webhook_secret == null ? {} : local.functions

  project   = var.project_id
  secret_id = var.slack_webhook_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.fn[each.key].member
}

# Optional: a pull subscription for whoever reads the digests (a chat bridge, a ticketing hook).
resource "google_pubsub_subscription" "digests" {
  count = var.digest_subscription ? 1 : 0

  name                       = "${var.name_prefix}-digests"
  project                    = var.project_id
  labels                     = var.labels
  topic                      = google_pubsub_topic.digests.id
  message_retention_duration = "604800s"

  expiration_policy {
    ttl = ""
  }
}
