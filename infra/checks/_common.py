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
    f"{fn}DatabaseUrlSecretArn": f"arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-{fn.lower()}-AbCdEf"
    for fn in ("Lister", "Classifier", "Deleter")
}
# More than one protect key, so the checks see the per-key Deny statements repeat.
SAMPLE_PROTECT_KEYS = ("orphan-cleanup-protect", "platform-keep")
# template.yaml: each work queue, the function consuming it and the role that alone
# may send to it (ARCHITECTURE.md: tick -> jobs -> lister -> listing -> classifier
# -> delete -> deleter).
SAM_QUEUES = {
    "JobsQueue": {"consumer": "ListerFunction", "producer": "ListerRole"},
    "ListingQueue": {"consumer": "ClassifierFunction", "producer": "ListerRole"},
    "DeleteQueue": {"consumer": "DeleterFunction", "producer": "ClassifierRole"},
}
# infra/aws-target-account/template.yaml: role -> the parameter naming the only
# principal its trust policy admits.
TARGET_ROLES = {"ListRole": "ListerRoleArn", "DeleteRole": "DeleterRoleArn"}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def unquote(s: str) -> str:
    """hcl2 keeps the quotes of string literals and block labels."""
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s


def resources_of_type(cfn: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in cfn["Resources"].items() if isinstance(v, dict) and v.get("Type") == type_}
