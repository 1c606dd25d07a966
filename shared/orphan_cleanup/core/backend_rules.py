"""What a backend's configuration must satisfy, whoever wrote it (the CLI or a
platform's plain SQL): tag keys valid for the provider, IAM role ARNs, regions.

Pure rules, no I/O: ``backends.Backend`` / ``backends.BackendSettings`` apply them on
every parse of a row, the CLI before writing one. The CLI also checks AWS region
names against botocore's own list (``cli.validation.known_aws_regions``); a row only
needs a non-empty region list, so a region newer than the installed botocore
still works from SQL (its listing fails alone if the name is wrong)."""

from __future__ import annotations

import re

from pydantic import ValidationError

ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
AWS_TAG_KEY_MAX = 128
GCP_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
GCP_LOCATION = re.compile(r"^[a-z]+-[a-z]+\d+(-[a-z])?$")  # a region (us-central1) or a zone (us-central1-a)
EXTERNAL_ID = re.compile(r"^[\w+=,.@:/-]{2,1224}$")  # sts:AssumeRole's ExternalId
#: What ``google.oauth2.service_account`` needs of a key: these fields, non-empty strings.
SERVICE_ACCOUNT_FIELDS = ("client_email", "private_key", "token_uri")


def role_arn_problem(value: str) -> str | None:
    if ROLE_ARN.match(value):
        return None
    return f"{value!r} is not an IAM role ARN (arn:aws:iam::<12-digit account>:role/<name>)"


def service_account_key_problem(text: str) -> str | None:
    """Why ``text`` is not a GCP service-account key (the JSON of a key file); None if it is.
    Never quotes the key: it is a secret."""
    import json

    try:
        key = json.loads(text)
    except ValueError as e:
        return f"is not JSON (a service-account key file's content): {getattr(e, 'msg', 'malformed')}"
    if not isinstance(key, dict):
        return "must be a service-account key: a JSON object"
    if key.get("type", "service_account") != "service_account":
        return f"is a key of type {str(key.get('type'))[:40]!r}, not 'service_account'"
    missing = [f for f in SERVICE_ACCOUNT_FIELDS if not (isinstance(key.get(f), str) and key[f].strip())]
    if missing:
        return f"is not a service-account key: no {', '.join(missing)}"
    if "PRIVATE KEY-----" not in key["private_key"]:
        return "is not a service-account key: private_key is not a PEM key"
    return None


def tag_key_problem(provider: str, key: str) -> str | None:
    """Why ``key`` cannot be a tag key (AWS) or label key (GCP) on ``provider``; None if it can."""
    if not key:
        return "must not be empty"
    if provider == "aws":
        if len(key) > AWS_TAG_KEY_MAX:
            return f"{key[:20]!r}... is longer than {AWS_TAG_KEY_MAX} characters (AWS tag keys)"
        if key.lower().startswith("aws:"):
            return f"{key!r} starts with 'aws:', a prefix AWS reserves"
        return None
    if not GCP_LABEL_KEY.match(key):
        return f"{key!r} is not a GCP label key (lowercase letter first, then up to 62 of a-z 0-9 _ -)"
    return None


def tag_key_list_problem(value: object) -> str | None:
    """Why ``value`` cannot be a list of tag keys (``controller_tag_keys``): a list of
    non-empty strings (an empty list is allowed: no controller is recognised by tag)."""
    if not isinstance(value, (list, tuple)):
        return f"must be a list of tag keys, got {type(value).__name__}"
    for key in value:
        if not isinstance(key, str) or not key.strip():
            return f"{key!r} is not a non-empty tag key"
        if len(key) > AWS_TAG_KEY_MAX:
            return f"{key[:20]!r}... is longer than {AWS_TAG_KEY_MAX} characters (AWS tag keys)"
    return None


def describe_validation(error: ValidationError) -> str:
    """Every problem of a pydantic error on one line: ``settings.tag_key: must not be empty``."""
    problems = []
    for e in error.errors():
        where = ".".join(str(part) for part in e["loc"])
        cause = e.get("ctx", {}).get("error")
        message = str(cause) if e["type"] == "value_error" and cause is not None else e["msg"]
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
