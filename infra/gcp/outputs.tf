output "function_names" {
  description = "Cloud Functions by step (lister, classifier, deleter)."
  value       = { for k, f in google_cloudfunctions2_function.fn : k => f.name }
}

output "function_uris" {
  description = "HTTPS endpoints of the functions (internal-only unless ingress_settings says otherwise)."
  value       = { for k, f in google_cloudfunctions2_function.fn : k => f.service_config[0].uri }
}

output "jobs_topic" {
  description = "JOBS_TOPIC: full id of the topic of listing jobs (tick -> lister)."
  value       = google_pubsub_topic.jobs.id
}

output "listing_topic" {
  description = "LISTING_TOPIC: full id of the listing topic."
  value       = google_pubsub_topic.listing.id
}

output "delete_topic" {
  description = "DELETE_TOPIC: full id of the delete topic."
  value       = google_pubsub_topic.delete.id
}

output "dead_letter_subscriptions" {
  description = "Pull subscriptions that retain dead-lettered messages, by topic (jobs, listing, delete)."
  value       = { for k, s in google_pubsub_subscription.dead_letter : k => s.name }
}

output "scheduler_job" {
  description = "The Cloud Scheduler job of the tick (`gcloud scheduler jobs run NAME --location REGION` runs a tick now)."
  value       = google_cloud_scheduler_job.tick.name
}

output "service_accounts" {
  description = "Service account emails of the functions, the scheduler caller, the push callers of the classifier and the deleter, and the jobs push caller."
  value = merge(
    { for k, sa in google_service_account.fn : k => sa.email },
    {
      scheduler       = google_service_account.scheduler.email
      push_classifier = google_service_account.push["classifier"].email
      push_deleter    = google_service_account.push["deleter"].email
      jobs_push       = google_service_account.jobs_push.email
    },
  )
}

output "database_url_secrets" {
  description = "The Secret Manager secret each function reads as DATABASE_URL (its own, or the shared one with database_roles = \"shared\"); add a version to each with `gcloud secrets versions add`."
  value       = { for name, secret in local.database_secret : name => google_secret_manager_secret.database_url[secret].id }
}

output "source_bucket" {
  description = "Bucket holding the functions' source archives."
  value       = google_storage_bucket.source.name
}

output "digest_topic" {
  description = "NOTIFY_TOPIC, the Pub/Sub topic of the cycles' digests (README, Knowing it works)."
  value       = google_pubsub_topic.digests.id
}
