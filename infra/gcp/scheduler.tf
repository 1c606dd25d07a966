# One job per backend: POST {"backend": "<id>"} to the lister with an OIDC
# token. `gcloud scheduler jobs run <name>` is a manual single-backend run.
resource "google_cloud_scheduler_job" "backend" {
  for_each = var.backends

  name             = "${var.name_prefix}-${each.key}"
  project          = var.project_id
  region           = var.region
  description      = "orphan-cleanup lister run for backend ${each.key}"
  schedule         = coalesce(each.value.schedule, var.schedule)
  time_zone        = coalesce(each.value.time_zone, var.time_zone)
  attempt_deadline = "600s"

  retry_config {
    retry_count          = 1
    min_backoff_duration = "30s"
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.fn["lister"].service_config[0].uri
    body        = base64encode(jsonencode({ backend = each.key }))
    headers = {
      "Content-Type" = "application/json"
    }

    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.fn["lister"].service_config[0].uri
    }
  }

  depends_on = [google_project_service.api, google_cloud_run_v2_service_iam_member.scheduler_invoker]
}
