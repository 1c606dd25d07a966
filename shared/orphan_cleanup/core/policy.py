"""What a backend runs with: the process settings overridden by the backend's own
(limits, mode). Pure: data in, data out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orphan_cleanup.core.backends import Backend, Mode
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.settings import Settings


def limits_for(settings: Settings, backend: Backend) -> Limits:
    s = backend.settings
    return Limits(
        interval_seconds=s.interval_seconds or settings.interval_seconds,
        margin_seconds=s.margin_seconds if s.margin_seconds is not None else settings.margin_seconds,
        max_backoff_seconds=settings.max_backoff_seconds,
        cycle_deadline_seconds=settings.cycle_deadline_seconds,
        max_deletes=s.max_deletes if s.max_deletes is not None else settings.max_deletes,
        max_delete_share=s.max_delete_share if s.max_delete_share is not None else settings.max_delete_share,
    )


def effective_mode(settings: Settings, backend: Backend, override: Mode | None = None) -> Mode:
    """The backend's own mode, else the global one; ``off`` is final (no override
    runs an off backend), otherwise an override is an operator's one-off request."""
    base = backend.mode or settings.mode
    return "off" if base == "off" else override or base


#: Backend settings that fall back to a process setting (an environment variable) when unset.
PROCESS_FALLBACK = {"margin_seconds": "margin_seconds", "interval_seconds": "interval_seconds",
                    "max_deletes": "max_deletes", "max_delete_share": "max_delete_share"}


def setting_sources(settings: Settings, backend: Backend, stored: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Every backend setting as a cycle of this process would use it, and where that value
    comes from: ``backend`` (the row has it), ``environment`` (a limit the row leaves to the
    process, whose variable is set), or ``default`` (the product's)."""
    s = backend.settings
    out: dict[str, tuple[Any, str]] = {}
    for key in type(s).model_fields:
        value = getattr(s, key)
        if stored.get(key) is not None:
            out[key] = (value, "backend")
        elif key in PROCESS_FALLBACK:
            field = PROCESS_FALLBACK[key]
            out[key] = (getattr(settings, field), "environment" if field in settings.model_fields_set else "default")
        elif key == "delete_role_arn":
            out[key] = (s.role_arn, "default")  # the deleter assumes role_arn (Backend.for_deleting)
        elif key == "project":
            out[key] = (backend.account, "default")  # the backend's account (Backend.scope_account)
        else:
            out[key] = (value, "default")
    return out


def environment_variable(key: str) -> str | None:
    """The variable a backend setting falls back to (``ORPHAN_CLEANUP_MARGIN_SECONDS``), if any."""
    field = PROCESS_FALLBACK.get(key)
    return Settings.model_fields[field].alias if field else None
