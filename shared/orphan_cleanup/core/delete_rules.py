"""The pure deletion rules: which delete requests may run, how a deletion's end
is recorded (and whether a remembered protection survives it), how long a delete
gate holds. Data in, data out, like ``classify``; the pipeline (``cycle_state``) is
their only caller."""

from __future__ import annotations

from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.decisions import DeleteRecord
from orphan_cleanup.core.evidence import keep_line
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.owners import Keep
from orphan_cleanup.core.verdicts import Action, DeleteOutcome, DeleteResult, DeleteStatus


def delete_refusal(*, mode: str, request_state: str | None, recorded: ResourceGroup | None,
                   requested: ResourceGroup, tripped_regions: tuple[str, ...],
                   kept: bool = False) -> DeleteOutcome | None:
    """Why a delete request must not run now (not a delete cycle, not dispatched,
    not the group that was classified, already done, kept by the operator, region
    tripped), or None. The resources deleted are the ``recorded`` ones, never the
    message's (rule 12). An operator's keep in force now wins over the plan (rule 23):
    ``protected``, recorded as such (``kept_result``)."""
    if mode != "delete":
        return DeleteOutcome.NOT_DELETE_MODE
    if request_state is None or recorded is None:
        return DeleteOutcome.NOT_DISPATCHED
    # A request must name exactly the resources classified: a tampered or corrupted
    # one (an extra resource of the same ref) is refused and deletes nothing.
    if sorted((r.kind.value, r.id) for r in recorded.resources) != sorted(
            (r.kind.value, r.id) for r in requested.resources):
        return DeleteOutcome.GROUP_MISMATCH
    if request_state != "queued":
        return DeleteOutcome.ALREADY_DONE
    if kept:
        return DeleteOutcome.PROTECTED
    if recorded.region in tripped_regions:
        return DeleteOutcome.REGION_TRIPPED
    return None


_RESULT_ACTION = {DeleteStatus.DELETED: Action.DELETED, DeleteStatus.DELETING: Action.DELETING,
                  DeleteStatus.SKIPPED: Action.REPORTED}
_REQUEST_STATE = {Action.DELETED: "done", Action.DELETING: "deleting", Action.REPORTED: "skipped",
                  Action.DELETE_FAILED: "failed"}
_ORPHAN_STATE = {Action.DELETED: "deleted", Action.DELETING: "deleting", Action.REPORTED: "open",
                 Action.DELETE_FAILED: "delete_failed"}


def delete_record(group: ResourceGroup, *, result: DeleteResult | None = None, error: str | None = None,
                  trip_region: bool = False, skipped_reason: str | None = None) -> DeleteRecord:
    """How a deletion's end is recorded: the group's action, the request's and the
    orphan's states, and what it means for the cycle (a deletion in progress or
    left alone is unsettled; a failure fails the cycle unless its region tripped)."""
    if result is not None and result.status is DeleteStatus.PROTECTED:
        # A verdict, not a failure (rule 14): reported, the request done with, the orphan
        # row protected (later cycles read it: ``LedgerRecord.protected_primaries``), and
        # the cycle neither failed nor held unsettled by it.
        return DeleteRecord(action=Action.REPORTED, request_state="skipped", orphan_state="protected",
                            unsettled=False, failed=False, trip_region=False, error=None,
                            keeps_protection=keeps_protection(Action.REPORTED),
                            message=f"left orphan group {group.key} in place: protected ({result.protection}:"
                                    f" {result.protection_detail})",
                            result=result, skipped_reason=result.protection, protection=result.protection,
                            protection_detail=result.protection_detail)
    if result is not None and result.error is not None:  # part deleted, then a call failed
        error, trip_region = result.error, trip_region or result.region_unavailable
        action = Action.DELETE_FAILED
    elif result is not None:
        action = _RESULT_ACTION[result.status]
    elif skipped_reason is not None:
        action = Action.REPORTED
    else:
        action = Action.DELETE_FAILED
    what = f"orphan group {group.key} ({len(group.resources)} resources)"
    message = {Action.DELETED: f"deleted {what}",
               Action.DELETING: f"deleting {what}: owner termination confirmed, dependents follow",
               Action.REPORTED: f"left {what} in place: {skipped_reason or 'resources changed since listing'}",
               }.get(action, f"failed to delete {what}: {error}")
    in_use = [s.id for s in result.skipped if s.reason == "in_use"] if result is not None else []
    if in_use:  # a verdict, never a failure (SAFETY.md rule 21): unsettled until it is free
        message = (f"{message}; " if result is not None and result.deleted else f"left {what} in place: ") \
            + f"{', '.join(in_use)} in use by something outside the group"
    if result is not None and result.cancelled_requests:
        message += f"; cancelled spot request {', '.join(result.cancelled_requests)} first"
    if result is not None and result.snapshots:
        message += "; kept snapshot " + ", ".join(f"{sid} of {vid}" for vid, sid in result.snapshots)
    if result is not None and result.snapshots_pending:
        if group.primary_id is None or group.primary_id not in result.deleted:
            message = f"deleting {what}"  # no owner was terminated: the snapshot is what is awaited
        message += "; waiting for snapshot " + ", ".join(
            f"{sid} of {vid}" for vid, sid in result.snapshots_pending) + " to complete before deleting the volume"
    return DeleteRecord(action=action, request_state=_REQUEST_STATE[action], orphan_state=_ORPHAN_STATE[action],
                        unsettled=action in (Action.DELETING, Action.REPORTED),
                        failed=action is Action.DELETE_FAILED and not trip_region, trip_region=trip_region,
                        error=error, message=message, result=result, skipped_reason=skipped_reason,
                        keeps_protection=keeps_protection(action) and not (
                            result is not None and group.primary_id is not None and group.primary_id in result.deleted))


def kept_result(keep: Keep) -> DeleteResult:
    """An operator's keep found by the deleter's re-check (SAFETY.md rule 23) as a protection
    found at delete time: the group is recorded ``protected`` / ``kept_by_operator``, nothing
    deleted, the cycle neither failed nor held unsettled by it."""
    return DeleteResult(status=DeleteStatus.PROTECTED, protection="kept_by_operator",
                        protection_detail=keep_line(keep.reason, keep.until.isoformat() if keep.until else None))


def keeps_protection(action: Action) -> bool:
    """SAFETY.md rule 14: whether a protection the group's orphan row remembers (AWS
    termination protection, which no listing shows: ``LedgerRecord.protected_primaries``)
    survives a deletion's end that took ``action``. Only a deletion (``deleted``, or
    ``deleting`` with the owner terminated) ends it: the protection was lifted. Anything else
    (a re-read that failed, a skip, a tripped region, the protection found again) leaves it
    remembered: a protection that cannot be read stays one."""
    return action not in (Action.DELETED, Action.DELETING)


def gate_ttl(limits: Limits) -> int:
    """How long a delete gate holds without renewal (a crashed deleter's gate expires)."""
    return max(60, min(900, limits.cycle_deadline_seconds))
