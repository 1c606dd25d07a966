"""The library's error types. Adapters translate SDK errors into these at the edge."""

from __future__ import annotations


class OrphanCleanupError(Exception):
    """Base of every error this library raises on purpose."""


class ConfigError(OrphanCleanupError):
    """Bad input from a user: a setting, a CLI argument, an event payload."""


class DatabaseError(OrphanCleanupError):
    """The ledger database could not be reached or answered with an error."""


class SchemaNotMigrated(ConfigError):
    """The database lacks this version's migrations (none at all, or older ones).

    Commands that must not run DDL (``status``, ``backend list|show``, ``explain``, and
    every command on a ``DATABASE_URL`` but ``migrate``) raise it instead of migrating."""

    MESSAGE = "database is not migrated (or older than this version): run orphan-cleanup migrate"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class BackendBusy(OrphanCleanupError):
    """An operator's change that must not happen while a cycle of the backend runs
    (a live lease): the CLI exits 3, as ``run`` does for a held backend."""

    reason = "busy"


class LeaseLost(OrphanCleanupError):
    """A cycle's fence no longer matches: another cycle owns the backend now.

    The holder must apply nothing and emit nothing (SAFETY.md rule 6).
    """


class MessageRefused(OrphanCleanupError):
    """A queue message disagrees with its cycle's own rows (backend, mode, listing
    time) or is malformed: it is refused whole and nothing of it is applied
    (SAFETY.md rule 12). Raised so that the record fails alone."""


class BlastRadiusExceeded(OrphanCleanupError):
    """A cycle would delete more than the configured count or share of groups
    (SAFETY.md rule 8): it deletes nothing and reports this (c7n's
    ``max-resources`` / ``max-resources-percent``). ``limit_name`` is
    ``max_deletes`` (``limit`` a count) or ``max_delete_share`` (a fraction)."""

    def __init__(self, *, limit_name: str, limit: float, to_delete: int, listed: int) -> None:
        self.limit_name, self.limit, self.to_delete, self.listed = limit_name, limit, to_delete, listed
        if limit_name == "max_deletes":
            message = f"would delete {to_delete} groups, more than the cap of {int(limit)}"
        else:
            message = (f"would delete {to_delete} of {listed} listed groups "
                       f"({to_delete / listed:.0%}), more than the cap of {limit:.0%}")
        super().__init__(message)


class ProviderError(OrphanCleanupError):
    """A provider call failed. ``region`` names where, when known.

    Subclasses say how the pipeline should react; a plain ``ProviderError``
    is a failure of that call only.
    """

    def __init__(self, message: str, *, region: str | None = None) -> None:
        super().__init__(message)
        self.region = region


class ProviderUnavailable(ProviderError):
    """The region or service is unreachable: skip the rest of that region this cycle."""


class ProviderTimeout(ProviderUnavailable):
    """A call exceeded its timeout: treated like unavailable (seed 004)."""


class ProviderThrottled(ProviderUnavailable):
    """Throttled past the retry budget (the SDK's retries and our request budget): the
    region is unavailable for this cycle, skipped and unsettled, never a failed cycle
    (SAFETY.md rule 5)."""


class AccessDenied(ProviderError):
    """The credentials lack a permission."""


class IdentityMismatch(ProviderError):
    """The backend's credentials reach another account (AWS) or project (GCP) than
    the backend row names (SAFETY.md rule 11): the cycle fails and touches nothing."""


class ResourceNotFound(ProviderError):
    """The resource does not exist (any more). Deletion treats this as done."""


class DependencyNotReady(ProviderError):
    """A resource cannot be deleted yet because another still uses it (not a failure)."""


class ResourceInUse(ProviderError):
    """The provider refused a delete because something outside the group uses the resource
    (AWS ``InvalidSnapshot.InUse``: an AMI registered from the snapshot): a verdict
    (``in_use``, the group unsettled), never a failure that holds the backend failed."""
