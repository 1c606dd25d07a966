"""What a cycle decides and does: verdicts, outcomes, actions, and what a deletion did."""

from __future__ import annotations

from enum import StrEnum

from pydantic import model_validator

from orphan_cleanup.core.listing import Frozen, ResourceKind


class VerdictKind(StrEnum):
    TRACKED = "tracked"
    ORPHAN = "orphan"
    SKIPPED = "skipped"
    IGNORED = "ignored"
    PROTECTED = "protected"


class Verdict(Frozen):
    kind: VerdictKind
    reason: str
    # An error worth logging (stuck pending owner, owner without provisioning data).
    log_error: str | None = None


class Outcome(StrEnum):
    CLEAN = "clean"
    UNSETTLED = "unsettled"
    FAILED = "failed"


class Action(StrEnum):
    NONE = "none"
    REPORTED = "reported"
    DELETED = "deleted"
    DELETING = "deleting"
    DELETE_FAILED = "delete_failed"
    # A delete cycle found the orphan but its confirmation window has not passed (SAFETY.md
    # rule 23): ``cycle_groups.delete_after`` says when a later cycle may delete it.
    MARKED = "marked"


class DeleteStatus(StrEnum):
    DELETED = "deleted"  # every resource of the group with our ref is gone
    DELETING = "deleting"  # the owner's termination is confirmed under way; dependents later
    SKIPPED = "skipped"  # nothing deleted: protect tag or changed ref found on re-read
    # nothing deleted: the re-read (or the provider's refusal) shows a controller or a
    # termination/deletion protection; ``DeleteResult.protection`` says which (rule 14)
    PROTECTED = "protected"


class DeleteOutcome(StrEnum):
    """What the deleter did with one delete request (metrics name ``Delete_<value>``)."""

    DELETED = "deleted"  # the group is gone
    DELETING = "deleting"  # the owner is shutting down; its dependents go next cycle
    SKIPPED = "skipped"  # the owner or the resources changed since the listing: left alone
    PROTECTED = "protected"  # a controller or a termination/deletion protection: a verdict, not a failure
    FAILED = "failed"  # a provider call failed (the cycle fails)
    REGION_TRIPPED = "region_tripped"  # the region timed out / is unavailable this cycle (rule 5)
    BACKEND_OFF = "backend_off"  # the backend was switched off since the cycle started
    # its account, roles or key changed since the cycle took its lease (SAFETY.md rule 18)
    BACKEND_CHANGED = "backend_changed"
    IDENTITY_FAILED = "identity_failed"  # the credentials do not reach the backend's account (rule 11)
    # Refusals: nothing was done and nothing is recorded.
    FENCED = "fenced"  # the cycle lost its lease or finished (rule 6)
    CYCLE_UNKNOWN = "cycle_unknown"
    NOT_DELETE_MODE = "not_delete_mode"
    NOT_DISPATCHED = "not_dispatched"  # this cycle did not ask for this group to be deleted
    GROUP_MISMATCH = "group_mismatch"  # the request's resources are not the classified group's (rule 12)
    ALREADY_DONE = "already_done"  # a redelivery of a request already recorded


class SkippedResource(Frozen):
    kind: ResourceKind
    id: str
    reason: str


class DeleteResult(Frozen):
    """What ``delete_resource_group`` did. ``deleted`` lists ids confirmed gone
    (or confirmed terminating for the instance); ``skipped`` what was left alone and why."""

    status: DeleteStatus
    deleted: tuple[str, ...] = ()
    skipped: tuple[SkippedResource, ...] = ()
    pending: tuple[str, ...] = ()
    # With ``PROTECTED``: the reason (``managed_by_controller``, ``termination_protection``,
    # ``deletion_protection``) and its evidence (the controller id, the attribute).
    protection: str | None = None
    protection_detail: str | None = None
    # Spot requests cancelled so that EC2 does not replace the instance (AWS):
    # named in the record even when the request is not a member of the group.
    cancelled_requests: tuple[str, ...] = ()
    # The group's dependents the re-read showed attached to its primary before it was
    # terminated: the only ones a later cycle may take for leftovers of this orphan
    # (``orphan_resources``; never the listing's word alone, SAFETY.md rule 15).
    attached: tuple[str, ...] = ()
    # Snapshots taken (or found completed) of data volumes before they were deleted, as
    # ``(volume id, snapshot id)``; and those still being taken.
    snapshots: tuple[tuple[str, str], ...] = ()
    snapshots_pending: tuple[tuple[str, str], ...] = ()
    # A provider call failed after part of the group was deleted: the one-line error (the
    # deletion failed, or its region tripped when ``region_unavailable``), and the rest pending.
    error: str | None = None
    region_unavailable: bool = False

    @model_validator(mode="after")
    def _protection_iff_protected(self) -> DeleteResult:
        if (self.status is DeleteStatus.PROTECTED) != (self.protection is not None):
            raise ValueError("a protected result names its protection, and only a protected one")
        return self
