# The functions' logs (every verdict and delete) in a log bucket of their own, kept
# log_retention_days, whatever the _Default bucket's 30 days. Like the AWS log groups, it
# outlives the stack (docs/DEPLOY.md, "Logs"): `terraform destroy` refuses to delete it
# (prevent_destroy); `terraform state rm google_logging_project_bucket_config.functions`
# first leaves it, with its logs, in the project.
resource "google_logging_project_bucket_config" "functions" {
  project        = var.project_id
  location       = var.region
  bucket_id      = "${var.name_prefix}-functions"
  retention_days = var.log_retention_days
  description    = "orphan-cleanup: the lister's, classifier's and deleter's logs"
  depends_on     = [google_project_service.api]

  lifecycle {
    prevent_destroy = true
  }
}

resource "google_logging_project_sink" "functions" {
  project                = var.project_id
  name                   = "${var.name_prefix}-functions"
  destination            = "logging.googleapis.com/projects/${var.project_id}/locations/${var.region}/buckets/${google_logging_project_bucket_config.functions.bucket_id}"
  filter                 = "resource.type = \"cloud_run_revision\" AND resource.labels.service_name = (${join(" OR ", [for k in keys(local.functions) : "\"${var.name_prefix}-${k}\""])})"
  unique_writer_identity = true
}
