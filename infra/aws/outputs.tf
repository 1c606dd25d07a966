output "listing_queue_url" {
  description = "LISTING_QUEUE_URL, the queue of listing batches."
  value       = aws_sqs_queue.main["listing"].url
}

output "delete_queue_url" {
  description = "DELETE_QUEUE_URL, the queue of delete requests."
  value       = aws_sqs_queue.main["delete"].url
}

output "dead_letter_queue_urls" {
  description = "Dead-letter queues: listing, delete, and failed scheduled lister runs."
  value = {
    listing = aws_sqs_queue.dlq["listing"].url
    delete  = aws_sqs_queue.dlq["delete"].url
    lister  = aws_sqs_queue.lister_dlq.url
  }
}

output "function_names" {
  description = "Lambda functions by step (lister, classifier, deleter); `aws lambda invoke --function-name <lister> --payload '{\"backend\":\"ID\"}'` runs one backend."
  value       = { for k, f in aws_lambda_function.fn : k => f.function_name }
}

output "role_arns" {
  description = "Execution roles by step; trust the lister and deleter roles from target-account roles."
  value       = { for k, r in aws_iam_role.fn : k => r.arn }
}

output "schedule_names" {
  description = "EventBridge Scheduler schedules by backend id."
  value       = { for k, s in aws_scheduler_schedule.backend : k => s.name }
}
