"""Paths, names and small helpers shared by the checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
TARGET_TEMPLATE = REPO / "infra" / "aws-target-account" / "template.yaml"
TERRAFORM_DIRS = (REPO / "infra" / "gcp", REPO / "infra" / "aws")

TAG_KEY = "provider_ref"
PROTECT_KEY = "orphan-cleanup-protect"
AWS_HANDLERS = {"lister": "functions.aws.lister.handler",
                "classifier": "functions.aws.classifier.handler",
                "deleter": "functions.aws.deleter.handler"}
GCP_ENTRY_POINTS = ("lister", "classifier", "deleter")
SAMPLE_PARAMETERS = {
    "BackendIds": "aws-prod,aws-dev",
    "DatabaseUrlSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-db-AbCdEf",
}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def unquote(s: str) -> str:
    """hcl2 keeps the quotes of string literals and block labels."""
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s


def resources_of_type(cfn: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in cfn["Resources"].items() if isinstance(v, dict) and v.get("Type") == type_}
