"""What a backend runs with: the process settings overridden by the backend's own
(limits, mode), where the stack's safety limits are ceilings a row may only tighten,
and the context its groups are classified in. Pure: data in, data out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orphan_cleanup.core.backends import Backend, Mode
from orphan_cleanup.core.classify import ClassifyContext, Limits
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.settings import Settings

#: The stack's limits a backend row may only tighten (SAFETY.md rule 8): the count and share
#: caps only lower, the margin and the confirmation window (rule 23) only longer. The
#: function picks the tighter of the two values.
TIGHTENING: dict[str, Callable[[Any, Any], Any]] = {"max_deletes": min, "max_delete_share": min,
                                                    "margin_seconds": max, "confirm_seconds": max}


def _stack(settings: Settings, key: str) -> Any:
    """The stack's value of a ``TIGHTENING`` limit (the confirmation window: unset is the interval)."""
    return settings.confirm_window_seconds if key == "confirm_seconds" else getattr(settings, key)


@dataclass(frozen=True)
class IgnoredSetting:
    """A backend's value of a ``TIGHTENING`` limit that would loosen the stack's: not used."""

    key: str
    value: Any  # the row's
    stack: Any  # the stack's, which applies

    @property
    def why(self) -> str:
        if self.key == "mode":
            return f"the backend's {self.value} ignored: the stack's ceiling is {self.stack} (ORPHAN_CLEANUP_MAX_MODE)"
        looser = "shorter" if self.key in ("margin_seconds", "confirm_seconds") else "higher"
        return f"the backend's {self.value} ignored: {looser} than the stack's {self.stack}"


def ignored_settings(settings: Settings, backend: Backend) -> dict[str, IgnoredSetting]:
    """The backend's limits that would loosen the stack's (``settings``), by key, and its
    ``mode`` when the stack's ceiling caps it."""
    out = {}
    for key, tighter in TIGHTENING.items():
        own, stack = getattr(backend.settings, key), _stack(settings, key)
        if own is not None and tighter(own, stack) != own:
            out[key] = IgnoredSetting(key, own, stack)
    mode = ignored_mode(settings, backend)
    if mode is not None:
        out["mode"] = mode
    return out


def _limit(settings: Settings, backend: Backend, key: str) -> Any:
    own, stack = getattr(backend.settings, key), _stack(settings, key)
    return stack if own is None else TIGHTENING[key](own, stack)


def limits_for(settings: Settings, backend: Backend) -> Limits:
    """The limits a cycle of ``backend`` runs with in this process: the row's interval, else
    the stack's; the tighter of the row's and the stack's margin and caps (a platform that
    writes ``backends`` never loosens what the operator deployed)."""
    s = backend.settings
    return Limits(
        interval_seconds=s.interval_seconds or settings.interval_seconds,
        margin_seconds=_limit(settings, backend, "margin_seconds"),
        max_backoff_seconds=settings.max_backoff_seconds,
        cycle_deadline_seconds=settings.cycle_deadline_seconds,
        max_deletes=_limit(settings, backend, "max_deletes"),
        max_delete_share=_limit(settings, backend, "max_delete_share"),
        confirm_seconds=_limit(settings, backend, "confirm_seconds"),
    )


def classify_context(settings: Settings, backend: Backend, listed_at: datetime, limits: Limits, *,
                     listed: ListedInstances | None = None, recheck_protections: bool = False) -> ClassifyContext:
    """The one way a ``ClassifyContext`` is made: ``backend``'s id, account scope, ref tag
    key and protect keys (its own, and its account's others: SAFETY.md rule 16), the
    cycle's ``listed_at``, the margin of ``limits`` and the stack's stuck-pending threshold.
    ``listed``: the instances a live owner's other VM is judged beside (rule 17; None:
    none known). ``recheck_protections``: a remembered protection is not trusted but left
    to the deleter's re-read (a delete cycle, rule 14)."""
    own = backend.settings.protect_tag_key
    stack = {settings.protect_tag_key}  # always protects (rule 16), even a row's tag_key: nothing goes
    return ClassifyContext(
        backend_id=backend.id, scope=backend.scope, listed_at=listed_at,
        margin=timedelta(seconds=limits.margin_seconds), protect_key=own,
        more_protect_keys=(backend.protect_keys | stack) - {own}, tag_key=backend.settings.tag_key,
        stuck_after=timedelta(seconds=settings.stuck_pending_seconds),
        recheck_protections=recheck_protections, listed=listed)


def effective_mode(settings: Settings, backend: Backend, override: Mode | None = None) -> Mode:
    """The backend's own mode, else the global one, capped by the stack's ceiling
    (``ORPHAN_CLEANUP_MAX_MODE``, SAFETY.md rule 8: a row never loosens what the operator
    deployed); ``off`` is final (no override runs an off backend), otherwise an override is
    an operator's one-off request, which is not a row and is not capped. A retired coverage
    deletes only under its own rule (SAFETY.md rule 24)."""
    base = backend.mode or settings.mode
    if backend.retired_from is not None:
        # A retired coverage (SAFETY.md rule 24) runs as its backend last ran, capped by the
        # ceiling; no override loosens that (one may only ask for report).
        allowed: Mode = "off" if base == "off" else \
            "delete" if base == "delete" and settings.mode_ceiling == "delete" else "report"
        return "report" if override == "report" and allowed != "off" else allowed
    if base == "off":
        return "off"
    if override is not None:
        return override
    return "report" if base == "delete" and settings.mode_ceiling == "report" else base


def ignored_mode(settings: Settings, backend: Backend) -> IgnoredSetting | None:
    """The row's ``mode`` when the stack's ceiling caps it (``delete`` under ``report``)."""
    if backend.mode == "delete" and settings.mode_ceiling == "report":
        return IgnoredSetting("mode", backend.mode, settings.mode_ceiling)
    return None


#: Backend settings that fall back to a process setting (an environment variable) when unset.
PROCESS_FALLBACK = {"margin_seconds": "margin_seconds", "interval_seconds": "interval_seconds",
                    "max_deletes": "max_deletes", "max_delete_share": "max_delete_share",
                    "confirm_seconds": "confirm_seconds"}


def setting_sources(settings: Settings, backend: Backend, stored: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Every backend setting as a cycle of this process would use it, and where that value
    comes from: ``backend`` (the row has it), ``environment`` (a limit the row leaves to the
    process, or sets looser than the process's (``ignored_settings``), whose variable is
    set), or ``default`` (the product's)."""
    s = backend.settings
    ignored = ignored_settings(settings, backend)
    out: dict[str, tuple[Any, str]] = {}
    for key in type(s).model_fields:
        value = getattr(s, key)
        if stored.get(key) is not None and key not in ignored:
            out[key] = (value, "backend")
        elif key in PROCESS_FALLBACK:
            field = PROCESS_FALLBACK[key]
            out[key] = (_stack(settings, field), "environment" if field in settings.model_fields_set else "default")
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


def stack_key_refusal(settings: Settings, backend: Backend) -> str | None:
    """Why no cycle of this backend starts, in one line, or None: its row names the stack's
    protect key (``ORPHAN_CLEANUP_PROTECT_TAG_KEY``) as its ref tag key, so every resource it
    lists would carry the key that protects it (SAFETY.md rule 16: no row takes that key away)."""
    if backend.settings.tag_key != settings.protect_tag_key:
        return None
    return (f"backend {backend.id}: settings.tag_key {backend.settings.tag_key!r} is the stack's protect key"
            " (ORPHAN_CLEANUP_PROTECT_TAG_KEY): nothing it lists could be deleted; give the backend another tag_key")


def ledger_key_refusal(backend: Backend) -> str | None:
    """Why a deployed function refuses this backend, in one line, or None: its row holds a
    service-account key (or a key file path, which only the CLI's machine has). A key in
    the ledger can delete, is readable by every role that reads ``backends`` and is shared
    by lister and deleter; a function uses its own identity instead."""
    s = backend.settings
    if s.credentials_json is not None:
        key, what = "credentials_json", "holds a service-account key"
    elif s.credentials_file is not None:
        key, what = "credentials_file", "names a key file"
    else:
        return None
    return (f"backend {backend.id}: settings.{key} {what}; the deployed functions take no key from the ledger:"
            " grant the function's own service account (workload identity) access to the project, then remove"
            f" it (backend update {backend.id} --settings '{{\"{key}\": null}}'); the CLI may use a key file"
            " (credentials_file)")
