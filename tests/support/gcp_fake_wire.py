"""Wire-format pieces of the fake Compute Engine server (see ``gcp_fake``):
the list ``filter`` parser, aggregated-list paging, error bodies, self links,
the Project resource.

Pure functions over plain dicts, no sockets, so they can be unit-tested alone.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

GOOGLE_BASE = "https://www.googleapis.com/compute/v1"
MAX_RESULTS = 500

#: The ``reason`` Compute Engine writes in error bodies, by HTTP status.
REASONS = {
    400: "invalid",
    403: "forbidden",
    404: "notFound",
    409: "conflict",
    429: "rateLimitExceeded",
    500: "backendError",
    502: "backendError",
    503: "backendError",
    504: "backendError",
}


class WireError(Exception):
    """Turned into a Google-format error body by the server."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or REASONS.get(status, "invalid")


def error_body(status: int, message: str, reason: str) -> dict[str, Any]:
    return {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def region_of(location: str) -> str:
    """``us-central1-a`` -> ``us-central1``; a region is returned unchanged
    (regions are ``geo-nameN``, zones add one more ``-suffix``)."""
    return "-".join(location.split("-")[:2])


def self_link(project: str, scope: str, location: str, collection: str, name: str) -> str:
    return f"{GOOGLE_BASE}/projects/{project}/{scope}/{location}/{collection}/{name}"


# --- filter -------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<and>AND\b)|(?P<or>OR\b)
    |(?P<field>[A-Za-z][A-Za-z0-9_.\-]*)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*
     (?P<value>"[^"]*"|'[^']*'|[^\s()]+))""",
    re.VERBOSE,
)

Predicate = Callable[[dict[str, Any]], bool]


class ListFilter(NamedTuple):
    """A parsed list ``filter``: whether an item matches, the label keys it names, and the
    numeric ids it pins (``id = N``: a list narrowed to one resource, a read by id)."""

    predicate: Predicate
    label_keys: frozenset[str]
    ids: frozenset[str]


def parse_filter(text: str) -> ListFilter:
    """Parse the subset of the Compute ``filter`` syntax the fake understands.

    Terms ``field OP value`` joined by whitespace or ``AND``, optionally in
    parentheses. Fields: ``labels.KEY``, ``name``, ``status``, ``id`` (the numeric
    id, a decimal uint64: ``id = 123``, ``id=123``, ``id eq 123``). Operators:
    ``:`` (``:*`` means "key is set"), ``=``, ``!=``, ``eq``/``ne`` (full-match
    regex). Returns the predicate, the label keys the filter mentions and the ids it
    pins (every term must hold, so a pinned id narrows the list to that resource).
    Anything else (``OR``, unknown fields, a non-numeric id, junk) raises ``WireError(400)``.
    """
    terms: list[Predicate] = []
    keys: set[str] = set()
    ids: set[str] = set()
    pos = 0
    depth = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise WireError(400, f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.")
        pos = m.end()
        if m.group("or"):
            raise WireError(400, f"Invalid value for field 'filter': '{text}'. OR is not supported by this fake.")
        if m.group("lp"):
            depth += 1
        elif m.group("rp"):
            depth -= 1
            if depth < 0:
                raise WireError(400, f"Invalid value for field 'filter': '{text}'. Unbalanced parentheses.")
        elif m.group("field") == "id":
            term, pinned = _id_term(m.group("op"), m.group("value"), text)
            terms.append(term)
            if pinned is not None:
                ids.add(pinned)
        elif m.group("field"):
            term, key = _term(m.group("field"), m.group("op"), m.group("value"), text)
            terms.append(term)
            if key:
                keys.add(key)
    if depth != 0 or not terms:
        raise WireError(400, f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.")
    return ListFilter(lambda item: all(t(item) for t in terms), frozenset(keys), frozenset(ids))


def _id_term(op: str, raw: str, text: str) -> tuple[Predicate, str | None]:
    """A term on the numeric ``id`` (a uint64 field: its value must be a decimal number);
    the id it pins (``=``, ``:``, ``eq`` of a number), or None (``!=``, ``ne``)."""
    value = raw[1:-1] if raw[:1] in "\"'" else raw
    if not value.isdigit() or int(value) >= 2**64:
        raise WireError(400, f"Invalid value for field 'filter': '{text}'. Invalid value '{value}' for field 'id'.")
    wanted = str(int(value))
    if op in ("!=", "ne"):
        return (lambda item: str(item.get("id")) != wanted), None
    return (lambda item: str(item.get("id")) == wanted), wanted


def _term(field: str, op: str, raw: str, text: str) -> tuple[Predicate, str | None]:
    value = raw[1:-1] if raw[:1] in "\"'" else raw
    if field.startswith("labels.") and len(field) > len("labels."):
        key: str | None = field[len("labels."):]
        get: Callable[[dict[str, Any]], str | None] = lambda item: item.get("labels", {}).get(key)
    elif field in ("name", "status"):
        key = None
        get = lambda item: item.get(field)
    else:
        raise WireError(400, f"Invalid value for field 'filter': '{text}'. Unknown field '{field}'.")
    if op == ":" and value == "*":
        return (lambda item: get(item) is not None), key
    if op in (":", "="):
        return (lambda item: get(item) == value), key
    if op == "!=":
        return (lambda item: get(item) != value), key
    try:
        rx = re.compile(value)
    except re.error as e:
        raise WireError(400, f"Invalid regular expression in filter: {value}") from e
    if op == "eq":
        return (lambda item: (v := get(item)) is not None and rx.fullmatch(v) is not None), key
    return (lambda item: (v := get(item)) is None or rx.fullmatch(v) is None), key


# --- paging -------------------------------------------------------------------------


def page_params(query: dict[str, str]) -> tuple[int, int]:
    """``(offset, max_results)`` from ``pageToken`` / ``maxResults``; 400 when malformed."""
    try:
        size = int(query.get("maxResults", MAX_RESULTS))
    except ValueError as e:
        raise WireError(400, "Invalid value for field 'maxResults'.") from e
    if not 0 < size <= MAX_RESULTS:
        raise WireError(400, f"Invalid value for field 'maxResults': {size}. Must be in [1, {MAX_RESULTS}].")
    token = query.get("pageToken", "")
    if not token:
        return 0, size
    try:
        offset = int(base64.urlsafe_b64decode(token.encode()).decode().removeprefix("o:"))
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError(400, "Invalid value for field 'pageToken'.") from e
    return offset, size


def aggregated_page(
    units: list[tuple[str, str, dict[str, Any]]], items_field: str, offset: int, size: int,
    render: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: body,
) -> tuple[dict[str, Any], str | None]:
    """One page of an aggregated list. ``units`` is the ordered flat list of
    ``(scope_key, "item" | "warning", body)``; a scope's items may straddle pages,
    exactly as the real API allows, so clients must merge by scope. Only the
    page's items go through ``render``."""
    chunk = units[offset:offset + size]
    items: dict[str, dict[str, Any]] = {}
    for scope, what, body in chunk:
        entry = items.setdefault(scope, {})
        if what == "item":
            entry.setdefault(items_field, []).append(render(body))
        else:
            entry["warning"] = body
    nxt = offset + size
    token = base64.urlsafe_b64encode(f"o:{nxt}".encode()).decode() if nxt < len(units) else None
    return items, token


def scope_warning(code: str, scope: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "data": [{"key": "scope", "value": scope}]}


def operation_body(
    project: str, scope: str, location: str, name: str, op_id: str, target: dict[str, Any], status: str,
    operation_type: str = "delete",
) -> dict[str, Any]:
    loc_key = "zone" if scope == "zones" else "region"
    return {
        "kind": "compute#operation",
        "id": op_id,
        "name": name,
        loc_key: f"{GOOGLE_BASE}/projects/{project}/{scope}/{location}",
        "operationType": operation_type,
        "targetLink": target["selfLink"],
        "targetId": target["id"],
        "status": status,
        "progress": 100 if status == "DONE" else 0,
        "insertTime": "2024-01-01T00:00:00.000-00:00",
        "selfLink": f"{GOOGLE_BASE}/projects/{project}/{scope}/{location}/operations/{name}",
    }


def project_number(project: str) -> str:
    """A stable 12-digit project number for a project id (the ``id`` of its Project resource)."""
    return str(100_000_000_000 + int(hashlib.sha1(project.encode()).hexdigest(), 16) % 900_000_000_000)


def project_body(project: str, number: str) -> dict[str, Any]:
    """The Project resource ``projects.get`` answers: ``name`` is the project id,
    ``id`` the project number (a decimal string, uint64)."""
    return {
        "kind": "compute#project",
        "id": number,
        "creationTimestamp": "2020-01-01T00:00:00.000-07:00",
        "name": project,
        "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": "bMVfsK3LRHE="},
        "quotas": [
            {"metric": "SNAPSHOTS", "limit": 5000, "usage": 0},
            {"metric": "NETWORKS", "limit": 15, "usage": 1},
        ],
        "selfLink": f"{GOOGLE_BASE}/projects/{project}",
        "defaultServiceAccount": f"{number}-compute@developer.gserviceaccount.com",
        "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
        "defaultNetworkTier": "PREMIUM",
        "vmDnsSetting": "ZONAL_ONLY",
    }


def strip_empty(body: dict[str, Any], keys: Iterable[str] = ("labels", "users")) -> dict[str, Any]:
    """Compute Engine omits empty maps and lists from its JSON."""
    return {k: v for k, v in body.items() if not (k in keys and not v)}
