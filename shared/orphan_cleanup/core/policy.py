"""What a backend runs with: the process settings overridden by the backend's own
(limits, mode). Pure: data in, data out."""

from __future__ import annotations

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
