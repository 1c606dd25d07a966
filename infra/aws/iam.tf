# One role per function with inline policies only: a managed policy such as
# AWSLambdaVPCAccessExecutionRole would grant ec2:DeleteNetworkInterface on *
# to every function. infra/checks fails on any EC2 write outside the
# deleter's tag-conditioned statement.

locals {
  ec2_delete_actions = [
    "ec2:TerminateInstances",
    "ec2:DeleteVolume",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteSecurityGroup",
    "ec2:ReleaseAddress",
    "ec2:DetachNetworkInterface",
    "ec2:DisassociateAddress",
    "ec2:CancelSpotInstanceRequests",
    "ec2:DeleteLaunchTemplate",
    "ec2:DeleteKeyPair",
    "ec2:DeletePlacementGroup",
    "elasticloadbalancing:DeleteLoadBalancer",
    "elasticloadbalancing:DeleteTargetGroup",
    "ec2:DeleteSnapshot",
  ]
  # Every delete but DeleteSnapshot, which the deleter may make only on the snapshots it
  # took itself (their orphan-cleanup-source tag: statement DeleteOnlySnapshotsTheDeleterTook).
  ec2_ref_delete_actions = [
    "ec2:TerminateInstances",
    "ec2:DeleteVolume",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteSecurityGroup",
    "ec2:ReleaseAddress",
    "ec2:DetachNetworkInterface",
    "ec2:DisassociateAddress",
    "ec2:CancelSpotInstanceRequests",
    "ec2:DeleteLaunchTemplate",
    "ec2:DeleteKeyPair",
    "ec2:DeletePlacementGroup",
    "elasticloadbalancing:DeleteLoadBalancer",
    "elasticloadbalancing:DeleteTargetGroup",
  ]
  # Describe* support no resource-level permission: "*" is the only form.
  ec2_describe_actions = [
    "ec2:DescribeInstances",
    "ec2:DescribeVolumes",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeAddresses",
    "ec2:DescribeSpotInstanceRequests",
    "ec2:DescribeSnapshots",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribeKeyPairs",
    "ec2:DescribePlacementGroups",
    "elasticloadbalancing:DescribeLoadBalancers",
    "elasticloadbalancing:DescribeTargetGroups",
    "elasticloadbalancing:DescribeTags",
  ]
  # The deleter also reads termination protection, which no describe shows (SAFETY.md rule 14).
  ec2_deleter_read_actions = [
    "ec2:DescribeInstances",
    "ec2:DescribeVolumes",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeAddresses",
    "ec2:DescribeSpotInstanceRequests",
    "ec2:DescribeSnapshots",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribeKeyPairs",
    "ec2:DescribePlacementGroups",
    "elasticloadbalancing:DescribeLoadBalancers",
    "elasticloadbalancing:DescribeTargetGroups",
    "elasticloadbalancing:DescribeTags",
    # what an ELBv2 delete would reach (SAFETY.md rule 15) and its deletion protection (rule 14)
    "elasticloadbalancing:DescribeListeners",
    "elasticloadbalancing:DescribeRules",
    "elasticloadbalancing:DescribeTargetHealth",
    # who launches from a launch template or registers in a target group (SAFETY.md rule 21)
    "autoscaling:DescribeAutoScalingGroups",
    "elasticloadbalancing:DescribeLoadBalancerAttributes",
  ]
  ec2_arn = "arn:${local.partition}:ec2:*:${local.account_id}"
  elb_arn = "arn:${local.partition}:elasticloadbalancing:*:${local.account_id}"
  # Snapshot ARNs name no account.
  snapshot_arn = "arn:${local.partition}:ec2:*::snapshot/*"
  step_policies = {
    lister     = data.aws_iam_policy_document.lister.json
    classifier = data.aws_iam_policy_document.classifier.json
    deleter    = data.aws_iam_policy_document.deleter.json
  }
  # Which target-account role each function may assume (settings.role_arn for
  # the lister, settings.delete_role_arn for the deleter).
  target_role_patterns = {
    for k, pattern in { lister = var.target_list_role_arn_pattern, deleter = var.target_delete_role_arn_pattern } :
    k => pattern if pattern != null
  }
}

data "aws_iam_policy_document" "lambda_trust" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "fn" {
  for_each = local.functions

  name               = "${var.name_prefix}-${each.key}"
  description        = "orphan-cleanup ${each.key}"
  assume_role_policy = data.aws_iam_policy_document.lambda_trust.json
}

# ------------------------------------------------------------- every function

data "aws_iam_policy_document" "runtime" {
  for_each = local.functions

  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.fn[each.key].arn}:*"]
  }

  statement {
    sid       = "Tracing"
    actions   = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
    resources = ["*"]
  }

  statement {
    sid       = "ReadDatabaseUrl"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [local.database_secret[each.key]]
  }

  lifecycle {
    precondition {
      condition     = local.database_secret[each.key] != null
      error_message = "database_roles = \"${var.database_roles}\" needs ${local.shared_database ? "database_url_secret_arn" : "function_database_url_secret_arns[\"${each.key}\"]"} (docs/DATABASE.md, \"One role per function\")."
    }
  }
}

resource "aws_iam_role_policy" "runtime" {
  for_each = local.functions

  name   = "runtime"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.runtime[each.key].json
}

data "aws_iam_policy_document" "secret_key" {
  count = var.database_secret_kms_key_arn == null ? 0 : 1

  statement {
    sid       = "DecryptDatabaseSecret"
    actions   = ["kms:Decrypt"]
    resources = [var.database_secret_kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "secret_key" {
  for_each = var.database_secret_kms_key_arn == null ? {} : local.functions

  name   = "database-secret-key"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.secret_key[0].json
}

# ------------------------------------------------------ RDS IAM authentication
# With database_iam_resource_id, each function's password is an RDS IAM token: its role may
# connect as its own database user of that one instance or cluster, nothing else.
data "aws_iam_policy_document" "database_iam_auth" {
  for_each = local.iam_auth ? local.functions : {}

  statement {
    sid       = "ConnectAsItsOwnDatabaseUser"
    actions   = ["rds-db:connect"]
    resources = ["arn:${local.partition}:rds-db:${data.aws_region.current.name}:${local.account_id}:dbuser:${var.database_iam_resource_id}/${local.database_user[each.key]}"]
  }
}

resource "aws_iam_role_policy" "database_iam_auth" {
  for_each = local.iam_auth ? local.functions : {}

  name   = "database-iam-auth"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.database_iam_auth[each.key].json
}

# --------------------------------------------------------------------- steps

data "aws_iam_policy_document" "lister" {
  statement {
    sid       = "DescribeTaggedResources"
    actions   = local.ec2_describe_actions
    resources = ["*"]
  }

  statement {
    sid       = "QueueListingJobs"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.main["jobs"].arn]
  }

  statement {
    sid       = "ConsumeListingJobs"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"]
    resources = [aws_sqs_queue.main["jobs"].arn]
  }

  statement {
    sid       = "PublishListingBatches"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.main["listing"].arn]
  }

  statement {
    sid       = "ReportFailedRuns"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.lister_dlq.arn]
  }
}

data "aws_iam_policy_document" "classifier" {
  statement {
    sid       = "ConsumeListingQueue"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"]
    resources = [aws_sqs_queue.main["listing"].arn]
  }

  statement {
    sid       = "DispatchDeletes"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.main["delete"].arn]
  }
}

data "aws_iam_policy_document" "deleter" {
  statement {
    sid       = "ConsumeDeleteQueue"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"]
    resources = [aws_sqs_queue.main["delete"].arn]
  }

  statement {
    sid       = "DescribeTaggedResources"
    actions   = local.ec2_deleter_read_actions
    resources = ["*"]
  }

  # Termination protection, which no describe shows (SAFETY.md rule 14);
  # DescribeInstanceAttribute takes instance ARNs, so only instances.
  statement {
    sid       = "ReadTerminationProtection"
    actions   = ["ec2:DescribeInstanceAttribute"]
    resources = ["${local.ec2_arn}:instance/*"]
  }

  # Every EC2 write is limited to resources carrying a well-formed ref tag
  # (12 characters); a request naming several resources (detach, disassociate)
  # needs the tag on each of them.
  statement {
    sid     = "DeleteOnlyRefTaggedResources"
    actions = local.ec2_ref_delete_actions
    resources = [
      "${local.ec2_arn}:instance/*",
      "${local.ec2_arn}:volume/*",
      "${local.ec2_arn}:network-interface/*",
      "${local.ec2_arn}:security-group/*",
      "${local.ec2_arn}:elastic-ip/*",
      "${local.ec2_arn}:spot-instances-request/*",
      "${local.ec2_arn}:launch-template/*",
      "${local.ec2_arn}:key-pair/*",
      "${local.ec2_arn}:placement-group/*",
      "${local.elb_arn}:loadbalancer/*",
      "${local.elb_arn}:targetgroup/*",
    ]

    condition {
      test     = "StringLike"
      variable = "aws:ResourceTag/${var.tag_key}"
      values   = ["????????????"]
    }
  }

  # Only the snapshots the deleter took itself (their orphan-cleanup-source tag), never a
  # backup that copied the ref tag (docs/SAFETY.md rule 15).
  statement {
    sid       = "DeleteOnlySnapshotsTheDeleterTook"
    actions   = ["ec2:DeleteSnapshot"]
    resources = [local.snapshot_arn]

    condition {
      test     = "StringLike"
      variable = "aws:ResourceTag/${var.tag_key}"
      values   = ["????????????"]
    }

    # The source tag's value is the id of the volume it was taken of (IAM cannot compare
    # it with the snapshot's own volume: the deleter checks that, docs/SAFETY.md rule 15).
    condition {
      test     = "StringLike"
      variable = "aws:ResourceTag/orphan-cleanup-source"
      values   = ["vol-*"]
    }
  }

  # snapshot_before_delete: a snapshot of a ref-tagged volume, carrying the ref itself,
  # and tags only on a snapshot being created (never a re-tag of an existing resource).
  statement {
    sid       = "SnapshotOnlyRefTaggedVolumes"
    actions   = ["ec2:CreateSnapshot"]
    resources = ["${local.ec2_arn}:volume/*"]

    condition {
      test     = "StringLike"
      variable = "aws:ResourceTag/${var.tag_key}"
      values   = ["????????????"]
    }
  }

  statement {
    sid       = "SnapshotsCarryTheRef"
    actions   = ["ec2:CreateSnapshot"]
    resources = [local.snapshot_arn]

    condition {
      test     = "StringLike"
      variable = "aws:RequestTag/${var.tag_key}"
      values   = ["????????????"]
    }

    condition {
      test     = "StringLike"
      variable = "aws:RequestTag/orphan-cleanup-source"
      values   = ["vol-*"]
    }
  }

  statement {
    sid       = "TagSnapshotsAsTheyAreCreated"
    actions   = ["ec2:CreateTags"]
    resources = [local.snapshot_arn]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreateSnapshot"]
    }

    condition {
      test     = "StringLike"
      variable = "aws:RequestTag/${var.tag_key}"
      values   = ["????????????"]
    }

    condition {
      test     = "StringLike"
      variable = "aws:RequestTag/orphan-cleanup-source"
      values   = ["vol-*"]
    }
  }

  # One Deny per protect key: conditions of one statement are ANDed, and no
  # EC2 condition key lists a resource's tag keys.
  dynamic "statement" {
    for_each = var.protect_tag_keys
    content {
      effect    = "Deny"
      actions   = local.ec2_delete_actions
      resources = ["*"]

      condition {
        test     = "Null"
        variable = "aws:ResourceTag/${statement.value}"
        values   = ["false"]
      }
    }
  }
}

resource "aws_iam_role_policy" "step" {
  for_each = local.functions

  name   = each.key
  role   = aws_iam_role.fn[each.key].id
  policy = local.step_policies[each.key]
}

# ------------------------------------------------------------- cross-account

data "aws_iam_policy_document" "assume_target" {
  for_each = local.target_role_patterns

  statement {
    sid       = "AssumeTargetRole"
    actions   = ["sts:AssumeRole"]
    resources = [each.value]

    # Only roles of the organisation or the accounts given, when given (required for a *
    # account: the precondition below).
    dynamic "condition" {
      for_each = var.target_organization_id == null ? [] : [var.target_organization_id]
      content {
        test     = "StringEquals"
        variable = "aws:ResourceOrgID"
        values   = [condition.value]
      }
    }

    dynamic "condition" {
      for_each = length(var.target_account_ids) == 0 ? [] : [var.target_account_ids]
      content {
        test     = "StringEquals"
        variable = "aws:ResourceAccount"
        values   = condition.value
      }
    }
  }

  lifecycle {
    precondition {
      condition     = !can(regex("^arn:[^:]+:iam::\\*:", each.value)) || var.target_organization_id != null || length(var.target_account_ids) > 0
      error_message = "${each.key == "lister" ? "target_list_role_arn_pattern" : "target_delete_role_arn_pattern"} names every account (*): set target_organization_id or target_account_ids."
    }
  }
}

resource "aws_iam_role_policy" "assume_target" {
  for_each = local.target_role_patterns

  name   = "cross-account"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.assume_target[each.key].json
}

# ------------------------------------------------------------ queue key (KMS)
# With queue_kms_key_arn, senders need GenerateDataKey (and Decrypt), receivers
# Decrypt, only through SQS. The lister sends (jobs, listing, its DLQ) and
# receives (jobs), the classifier receives and sends, the deleter receives.

data "aws_iam_policy_document" "queue_key_send" {
  count = var.queue_kms_key_arn == null ? 0 : 1

  statement {
    sid       = "EncryptAndDecryptQueueMessages"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [var.queue_kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["sqs.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "queue_key_receive" {
  count = var.queue_kms_key_arn == null ? 0 : 1

  statement {
    sid       = "DecryptQueueMessages"
    actions   = ["kms:Decrypt"]
    resources = [var.queue_kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["sqs.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "queue_key" {
  for_each = var.queue_kms_key_arn == null ? {} : local.functions

  name   = "queue-key"
  role   = aws_iam_role.fn[each.key].id
  policy = each.key == "deleter" ? data.aws_iam_policy_document.queue_key_receive[0].json : data.aws_iam_policy_document.queue_key_send[0].json
}

# ----------------------------------------------------------------------- VPC

data "aws_iam_policy_document" "vpc_access" {
  statement {
    sid       = "DescribeForVpcAccess"
    actions   = ["ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"]
    resources = ["*"]
  }

  # Lambda manages a VPC function's interfaces with the execution role. Those
  # calls carry no lambda:SourceFunctionArn; calls from the function code
  # always do, so the code cannot use this grant.
  statement {
    sid = "LambdaManagedInterfacesOnly"
    actions = [
      "ec2:CreateNetworkInterface",
      "ec2:DeleteNetworkInterface",
      "ec2:AssignPrivateIpAddresses",
      "ec2:UnassignPrivateIpAddresses",
    ]
    resources = ["*"]

    condition {
      test     = "Null"
      variable = "lambda:SourceFunctionArn"
      values   = ["true"]
    }
  }
}

resource "aws_iam_role_policy" "vpc_access" {
  for_each = local.in_vpc ? local.functions : {}

  name   = "vpc-access"
  role   = aws_iam_role.fn[each.key].id
  policy = data.aws_iam_policy_document.vpc_access.json
}
