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

# Knowing it works (README): the tick logs one structured line ("tick done", with
# stalest_backend_seconds); two log-based metrics read it, and two policies alert on them:
# a backend that has gone too long without a clean cycle, and a tick that stopped.
locals {
  tick_filter         = "resource.type = \"cloud_run_revision\" AND resource.labels.service_name = \"${var.name_prefix}-lister\" AND jsonPayload.message = \"tick done\""
  stale_alarm_seconds = var.stale_alarm_intervals * var.interval_seconds
  # An absence condition's duration: whole minutes, from 2 minutes to 23.5 hours.
  tick_absent_seconds = min(84600, max(120, floor(3 * var.interval_seconds / 60) * 60))
}

resource "google_logging_metric" "stalest_backend_seconds" {
  project         = var.project_id
  name            = "${var.name_prefix}-stalest-backend-seconds"
  description     = "The tick's StalestBackendSeconds: the longest time since any enabled, enrolled backend's last clean cycle."
  filter          = local.tick_filter
  value_extractor = "EXTRACT(jsonPayload.stalest_backend_seconds)"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "s"
  }

  bucket_options {
    exponential_buckets {
      num_finite_buckets = 32
      growth_factor      = 1.5
      scale              = 60
    }
  }

  depends_on = [google_project_service.api]
}

resource "google_logging_metric" "ticks" {
  project     = var.project_id
  name        = "${var.name_prefix}-ticks"
  description = "Ticks the lister ran (one per Cloud Scheduler call)."
  filter      = local.tick_filter

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  depends_on = [google_project_service.api]
}

resource "google_monitoring_alert_policy" "stalest_backend" {
  project      = var.project_id
  display_name = "orphan-cleanup: a backend without a clean cycle for ${var.stale_alarm_intervals} intervals"
  combiner     = "OR"
  user_labels  = var.labels

  conditions {
    display_name = "StalestBackendSeconds > ${local.stale_alarm_seconds}"
    condition_threshold {
      filter          = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.stalest_backend_seconds.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = local.stale_alarm_seconds
      duration        = "0s"

      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_PERCENTILE_99"
        cross_series_reducer = "REDUCE_MAX"
      }
    }
  }

  documentation {
    content   = "A backend has gone ${var.stale_alarm_intervals} intervals without a clean cycle (always unsettled, failing, or never run). `orphan-cleanup status` names it; README, \"Knowing it works\"."
    mime_type = "text/markdown"
  }

  notification_channels = var.notification_channels
  depends_on            = [google_project_service.api]
}

resource "google_monitoring_alert_policy" "tick_stopped" {
  project      = var.project_id
  display_name = "orphan-cleanup: the tick stopped"
  combiner     = "OR"
  user_labels  = var.labels

  conditions {
    display_name = "no tick for three intervals"
    condition_absent {
      filter   = "resource.type = \"cloud_run_revision\" AND metric.type = \"logging.googleapis.com/user/${google_logging_metric.ticks.name}\""
      duration = "${local.tick_absent_seconds}s"

      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    content   = "The lister logged no tick for three intervals: Cloud Scheduler or the function stopped, and nothing is cleaned. README, \"Knowing it works\"."
    mime_type = "text/markdown"
  }

  notification_channels = var.notification_channels
  depends_on            = [google_project_service.api]
}
