"""An operator's backend input (``backend add|update``), checked before anything is
written: ids, accounts, regions, settings JSON. Every problem is a one-line
``ConfigError`` (exit 2).

Stricter than a row written with SQL (``core.backends.Backend``, which every parse applies):
unknown settings keys are refused, and AWS regions must be ones botocore knows (its
bundled endpoint data: offline, no call)."""

from __future__ import annotations

import argparse
import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from orphan_cleanup.core.errors import ConfigError

if TYPE_CHECKING:
    from orphan_cleanup.core.backends import Backend

BACKEND_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
AWS_ACCOUNT = re.compile(r"^\d{12}$")
GCP_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")


@lru_cache(maxsize=1)
def known_aws_regions() -> frozenset[str]:
    """Every region of every AWS partition in botocore's bundled data (EC2's regions,
    and the partitions' region lists, which may name newer ones)."""
    import botocore.loaders
    import botocore.session

    session = botocore.session.get_session()
    regions: set[str] = set()
    for partition in session.get_available_partitions():
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    for partition in botocore.loaders.create_loader().load_data("partitions")["partitions"]:
        regions.update(r for r in partition.get("regions", {}) if not r.endswith("-global"))
    return frozenset(regions)


def check_id(backend_id: str) -> str:
    if not BACKEND_ID.match(backend_id):
        raise ConfigError(f"backend id {backend_id!r} must be 1-100 letters, digits, '-', '_', '.', ':'")
    return backend_id


def check_account(provider: str, account: str) -> str:
    if provider == "aws" and not AWS_ACCOUNT.match(account):
        raise ConfigError(f"AWS account {account!r} must be 12 digits")
    if provider == "gcp" and not GCP_PROJECT.match(account):
        raise ConfigError(f"GCP project id {account!r} is malformed")
    return account


def parse_regions(provider: str, text: str) -> list[str]:
    """``r1,r2`` as a list: not empty, no duplicate, each an AWS region botocore knows
    or a GCP region or zone (``us-central1``, ``us-central1-a``)."""
    from orphan_cleanup.core.backend_rules import GCP_LOCATION

    regions = [r.strip() for r in text.split(",") if r.strip()]
    if not regions:
        raise ConfigError(f"bad region list {text!r}: give at least one region")
    if len(set(regions)) != len(regions):
        raise ConfigError(f"bad region list {text!r}: a region is named twice")
    if provider == "aws":
        import botocore

        bad = [r for r in regions if r not in known_aws_regions()]
        why = (f"not an AWS region botocore {botocore.__version__} knows"
               " (e.g. us-east-1; a newer region needs a newer botocore)")
    else:
        bad = [r for r in regions if not GCP_LOCATION.match(r)]
        why = "not a GCP region or zone (e.g. us-central1, us-central1-a)"
    if bad:
        raise ConfigError(f"bad region list {text!r}: {', '.join(bad)}: {why}")
    return regions


def parse_settings(text: str, flag: str = "--settings") -> dict[str, Any]:
    """A JSON object of settings keys this version knows (values checked later, on the
    whole backend: ``checked_backend``)."""

    from orphan_cleanup.core.backends import BackendSettings

    try:
        settings = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} is not JSON: {e.msg}") from e
    if not isinstance(settings, dict):
        raise ConfigError(f"{flag} must be a JSON object")
    if _has_nul(settings):
        raise ConfigError(f"{flag}: a NUL character (\\u0000) cannot be stored (Postgres jsonb refuses it)")
    try:
        BackendSettings.refuse_unknown_keys(settings)
    except ValueError as e:
        raise ConfigError(f"{flag}: {e}") from e
    return settings


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _check_key(backend_id: str, key: Any) -> None:
    """A service-account key the Google library itself reads (its private key parsed), when
    the gcp extra is installed; the model has checked its fields already."""
    if not isinstance(key, str):
        return
    try:
        from google.oauth2 import service_account
    except ImportError:  # the lean [aws] install: the model's check stands
        return
    try:
        service_account.Credentials.from_service_account_info(json.loads(key))
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"backend {backend_id!r}: settings.credentials_json: the key cannot be read"
                          f" ({type(e).__name__}; check the key file)") from e


def merge_settings(stored: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` over ``stored`` (JSON merge patch: a ``null`` removes the key, back to
    its default); keys the platform stored for itself are kept."""
    merged = dict(stored)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def checked_backend(backend_id: str, provider: str, account: str, regions: list[str] | tuple[str, ...],
                    settings: dict[str, Any], mode: str | None) -> Backend:
    """The backend the model makes of these values, or a ``ConfigError`` naming the field."""
    from pydantic import ValidationError

    from orphan_cleanup.core.backend_rules import describe_validation
    from orphan_cleanup.core.backends import Backend

    doc = {"id": backend_id, "provider": provider, "account": account, "regions": list(regions),
           "settings": settings, "mode": mode}
    try:
        backend = Backend.model_validate(doc)
        # Then strictly typed, as JSON: "300" or true is no number of seconds (a row written
        # with SQL is read leniently; what the CLI stores is exact).
        Backend.model_validate_json(json.dumps(doc), strict=True)
    except ValidationError as e:
        raise ConfigError(f"backend {backend_id!r}: {describe_validation(e)}") from e
    _check_key(backend_id, settings.get("credentials_json"))
    return backend


def validate_new_backend(backend_id: str, provider: str, account: str, regions_text: str,
                         settings_text: str | None) -> tuple[list[str], dict[str, Any]]:
    """``backend add``'s input: (regions, settings as given)."""
    check_id(backend_id)
    check_account(provider, account)
    regions = parse_regions(provider, regions_text)
    settings = parse_settings(settings_text) if settings_text else {}
    checked_backend(backend_id, provider, account, regions, settings, None)
    return regions, settings


def validate_backend(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """``backend add``'s arguments: (regions, settings); a ``ConfigError`` otherwise."""
    return validate_new_backend(args.id, args.provider, args.account, args.regions, args.settings)
