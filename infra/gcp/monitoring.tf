resource "google_monitoring_alert_policy" "dead_letters" {
  for_each = google_pubsub_subscription.dead_letter

  project      = var.project_id
  display_name = "orphan-cleanup: messages in ${var.name_prefix}-${each.key}-dead-letter-retain"
  combiner     = "OR"
  user_labels  = var.labels

  conditions {
    display_name = "undelivered messages > 0"
    condition_threshold {
      filter          = "resource.type = \"pubsub_subscription\" AND resource.labels.subscription_id = \"${var.name_prefix}-${each.key}-dead-letter-retain\" AND metric.type = \"pubsub.googleapis.com/subscription/num_undelivered_messages\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    content   = "Messages a function failed ${var.max_delivery_attempts} times. Inspect them with `gcloud pubsub subscriptions pull ${var.name_prefix}-${each.key}-dead-letter-retain`; see docs/DEPLOY.md."
    mime_type = "text/markdown"
  }

  notification_channels = var.notification_channels
  depends_on            = [google_project_service.api]
}

resource "google_monitoring_alert_policy" "function_errors" {
  for_each = google_cloudfunctions2_function.fn

  project      = var.project_id
  display_name = "orphan-cleanup: ${var.name_prefix}-${each.key} errors"
  combiner     = "OR"
  user_labels  = var.labels

  conditions {
    display_name = "5xx responses > 0"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND resource.labels.service_name = \"${var.name_prefix}-${each.key}\" AND metric.type = \"run.googleapis.com/request_count\" AND metric.labels.response_code_class = \"5xx\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }

  notification_channels = var.notification_channels
  depends_on            = [google_project_service.api]
}
