output "jobs_queue_url" {
  description = "JOBS_QUEUE_URL, the queue of listing jobs (tick -> lister)."
  value       = aws_sqs_queue.main["jobs"].url
}

output "listing_queue_url" {
  description = "LISTING_QUEUE_URL, the queue of listing batches."
  value       = aws_sqs_queue.main["listing"].url
}

output "delete_queue_url" {
  description = "DELETE_QUEUE_URL, the queue of delete requests."
  value       = aws_sqs_queue.main["delete"].url
}

output "dead_letter_queue_urls" {
  description = "Dead-letter queues: jobs, listing, delete, and failed ticks (lister)."
  value = {
    jobs    = aws_sqs_queue.dlq["jobs"].url
    listing = aws_sqs_queue.dlq["listing"].url
    delete  = aws_sqs_queue.dlq["delete"].url
    lister  = aws_sqs_queue.lister_dlq.url
  }
}

output "function_names" {
  description = "Lambda functions by step (lister, classifier, deleter); `aws lambda invoke --function-name <lister> --payload '{\"backend\":\"ID\"}'` runs one backend."
  value       = { for k, f in aws_lambda_function.fn : k => f.function_name }
}

output "log_group_names" {
  description = "CloudWatch log groups by step (lister, classifier, deleter), named by the tool, name_prefix and this deployment's id; kept by destroy (docs/DEPLOY.md, \"Redeploys\")."
  value       = { for k, g in aws_cloudwatch_log_group.fn : k => g.name }
}

output "role_arns" {
  description = "Execution roles by step; the target account's list role trusts the lister's, its delete role the deleter's."
  value       = { for k, r in aws_iam_role.fn : k => r.arn }
}

output "schedule_name" {
  description = "The EventBridge Scheduler schedule of the tick."
  value       = aws_scheduler_schedule.tick.name
}

output "digest_topic_arn" {
  description = "NOTIFY_TOPIC_ARN, the SNS topic of the cycles' digests (subscribe to it: README, Knowing it works)."
  value       = aws_sns_topic.digests.arn
}
