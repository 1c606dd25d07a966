"""Secrets out of any text that leaves the process (SAFETY.md rule 22).

The composition root ``remember``s every secret value it reads (a database URL and its
password, an RDS token, a webhook URL, the Sentry DSN), when it reads it: a rotated
password read late is remembered then. ``redact`` replaces each remembered value, in
its plain and URL-encoded forms, and whatever has the shape of a secret (a URL's
credentials, a Slack webhook path, a PEM key, a SigV4 signature) whether remembered or
not. Sentry's ``before_send`` runs every event through ``redact_tree``."""

from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "[redacted]"
_MIN_LENGTH = 6  # shorter values ("postgres", a port) would mask ordinary words; patterns catch the rest

_MAX_KNOWN = 1024  # a warm function makes an RDS token per connection: the oldest are dropped
_known: dict[str, None] = {}  # insertion-ordered
_lock = threading.Lock()

_PATTERNS = (
    # scheme://user:password@host, scheme://key@host (a Sentry DSN): the credentials go
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@'\"<>]+@"), rf"\1{MASK}@"),
    # a Slack incoming webhook's path is its secret
    (re.compile(r"(?i)(hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/)[^\s'\"<>]+"), rf"\1{MASK}"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), MASK),
    # an RDS IAM token or any SigV4-presigned query: its signature and security token
    (re.compile(r"(?i)(X-Amz-(?:Signature|Security-Token|Credential)=)[^&\s'\"]+"), rf"\1{MASK}"),
    (re.compile(r"(?i)\b(password|passwd|pwd|secret|token|private_key|sentry_key)(['\"]?\s*[=:]\s*['\"]?)"
                r"(?!\[redacted\])[^\s'\",&}]+"), rf"\1\2{MASK}"),
)


def remember(*values: str | None) -> None:
    """Add secret values to what ``redact`` masks (with their URL-encoded forms)."""
    with _lock:
        for value in values:
            if value and len(value) >= _MIN_LENGTH:
                for form in (value, quote(value, safe=""), quote_plus(value), quote(value)):
                    _known.pop(form, None)
                    _known[form] = None
        while len(_known) > _MAX_KNOWN:
            del _known[next(iter(_known))]


def redact(text: str) -> str:
    """``text`` without any remembered secret or secret-shaped part."""
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_tree(value: Any) -> Any:
    """``redact`` applied to every string (keys too) of a JSON-like tree, in place where it can."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_tree(k) if isinstance(k, str) else k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_tree(v) for v in value)
    return value
