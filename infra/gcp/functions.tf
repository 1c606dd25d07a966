resource "google_cloudfunctions2_function" "fn" {
  for_each = local.functions

  name        = "${var.name_prefix}-${each.key}"
  project     = var.project_id
  location    = var.region
  description = each.value.description
  labels      = var.labels

  build_config {
    runtime         = var.runtime
    entry_point     = each.value.entry_point
    service_account = var.build_service_account

    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    available_memory                 = var.function_memory
    timeout_seconds                  = each.value.timeout
    min_instance_count               = 0
    max_instance_count               = each.value.max_instances
    max_instance_request_concurrency = 1
    ingress_settings                 = var.ingress_settings
    all_traffic_on_latest_revision   = true
    service_account_email            = google_service_account.fn[each.key].email
    environment_variables            = local.function_environment[each.key]
    vpc_connector                    = var.vpc_connector
    vpc_connector_egress_settings    = var.vpc_connector == null ? null : "PRIVATE_RANGES_ONLY"

    secret_environment_variables {
      key        = "DATABASE_URL"
      project_id = var.project_id
      secret     = google_secret_manager_secret.database_url[local.database_secret[each.key]].secret_id
      version    = "latest"
    }

    # The digests' Slack webhook (digests.tf), when one is given.
    dynamic "secret_environment_variables" {
      for_each = var.slack_webhook_secret == null ? [] : [var.slack_webhook_secret]
      content {
        key        = "SLACK_WEBHOOK_URL"
        project_id = var.project_id
        secret     = secret_environment_variables.value
        version    = "latest"
      }
    }
  }

  depends_on = [
    google_project_service.api,
    google_secret_manager_secret_iam_member.database_url,
  ]

  lifecycle {
    # Under a report ceiling nothing is deleted (docs/SAFETY.md rule 8): a delete stack says so twice.
    precondition {
      condition     = var.mode != "delete" || var.max_mode == "delete"
      error_message = "mode = \"delete\" needs max_mode = \"delete\": under a report ceiling nothing is deleted (docs/DEPLOY.md, \"Turn on deletion\")."
    }
  }
}
