# One job per stack, the tick: POST {} to the lister with an OIDC token. The
# lister selects the due backends in the ledger and publishes one listing job
# per listing to the jobs topic (a backend added to the ledger needs no
# apply). `gcloud scheduler jobs run <name>` runs a tick now.
resource "google_cloud_scheduler_job" "tick" {
  name             = "${var.name_prefix}-tick"
  project          = var.project_id
  region           = var.region
  description      = "orphan-cleanup tick: the lister publishes a listing job per due backend"
  schedule         = var.schedule
  time_zone        = var.time_zone
  attempt_deadline = "600s"

  retry_config {
    retry_count          = 1
    min_backoff_duration = "30s"
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.fn["lister"].service_config[0].uri
    body        = base64encode(jsonencode({}))
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
