"""Delete bookkeeping: dispatch under the blast-radius cap, per-ref gates,
and fenced recording of each deletion's result."""

from __future__ import annotations

import json
from datetime import datetime
from dataclasses import dataclass

from orphan_cleanup import classify
from orphan_cleanup.ledger.cycles import Limits, finish, is_complete, lock_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.models import Action, DeleteOutcome, DeleteResult, DeleteStatus, Outcome, ResourceGroup


@dataclass(frozen=True)
class Dispatch:
    groups: list[ResourceGroup]
    blocked: str | None
    outcome: Outcome | None  # set when the cycle finished in this call


def dispatch_deletes(db: Database, cycle_id: str, limits: Limits, now: datetime | None = None) -> Dispatch:
    """Once every batch is in: apply the blast-radius cap to the cycle's orphans
    and register one delete request per orphan group (or none, with the reason).
    Finishes the cycle when there is nothing to delete. Idempotent."""
    with db.transaction() as conn:
        c = lock_cycle(conn, cycle_id)
        listing_done = c["expected_batches"] is not None and c["applied_batches"] >= c["expected_batches"]
        if c["dispatched"] or not listing_done:
            return Dispatch([], None, None)
        rows = conn.run("SELECT provider_ref, region, primary_id, resources FROM cycle_groups"
                        " WHERE cycle_id = :c AND verdict = 'orphan' ORDER BY group_key", c=cycle_id)
        groups = [_group(r) for r in rows]
        blocked = classify.blast_radius_violation(
            len(groups), c["groups_listed"], max_deletes=limits.max_deletes, max_share=limits.max_delete_share)
        if blocked:
            conn.run("UPDATE cycles SET dispatched = true, blocked_reason = :r, unsettled = true WHERE id = :c",
                     r=blocked, c=cycle_id)
            conn.run("UPDATE cycle_groups SET action = 'reported' WHERE cycle_id = :c AND verdict = 'orphan'",
                     c=cycle_id)
            conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, details)"
                     " VALUES (:b, :c, 'delete_blocked', :m, CAST(:d AS jsonb))",
                     b=c["backend_id"], c=cycle_id, m=f"deleted nothing: {blocked}",
                     d=json.dumps({"orphans": len(groups), "listed": c["groups_listed"]}))
            groups = []
        if groups:
            conn.run("INSERT INTO delete_requests (cycle_id, group_key)"
                     " SELECT :c, x FROM unnest(CAST(:keys AS text[])) AS x ON CONFLICT DO NOTHING",
                     c=cycle_id, keys=[g.key for g in groups])
            conn.run("UPDATE cycles SET dispatched = true, open_deletes = open_deletes + :n,"
                     " planned_deletes = :n WHERE id = :c", n=len(groups), c=cycle_id)
            return Dispatch(groups, None, None)
        conn.run("UPDATE cycles SET dispatched = true WHERE id = :c", c=cycle_id)
        c.update(dispatched=True, unsettled=c["unsettled"] or bool(blocked))
        return Dispatch([], blocked, finish(conn, c, limits, now))


def _group(row: list) -> ResourceGroup:
    resources = row[3] if isinstance(row[3], list) else json.loads(row[3])
    return ResourceGroup.model_validate(
        {"provider_ref": row[0], "region": row[1], "primary_id": row[2], "resources": resources})


def delete_allowed(db: Database, cycle_id: str,
                   requested: ResourceGroup) -> tuple[DeleteOutcome | None, ResourceGroup | None]:
    """Why a delete request must not run now (fenced, not a delete cycle, not
    dispatched, not the group that was classified, already done, region tripped),
    or None, with the group as this cycle recorded it: the resources to delete
    come from that row, never from the message (DESIGN §5 rule 12)."""
    with db.transaction() as conn:
        c = lock_cycle(conn, cycle_id)
        if c["mode"] != "delete":
            return DeleteOutcome.NOT_DELETE_MODE, None
        state = conn.run("SELECT state FROM delete_requests WHERE cycle_id = :c AND group_key = :k",
                         c=cycle_id, k=requested.key)
        if not state:
            return DeleteOutcome.NOT_DISPATCHED, None
        recorded = conn.run("SELECT provider_ref, region, primary_id, resources FROM cycle_groups"
                            " WHERE cycle_id = :c AND group_key = :k AND verdict = 'orphan'",
                            c=cycle_id, k=requested.key)
        if not recorded:
            return DeleteOutcome.NOT_DISPATCHED, None
        group = _group(recorded[0])
        # A request must name exactly the resources classified: a tampered or corrupted
        # one (an extra resource of the same ref) is refused and deletes nothing.
        if sorted((r.kind.value, r.id) for r in group.resources) != sorted(
                (r.kind.value, r.id) for r in requested.resources):
            return DeleteOutcome.GROUP_MISMATCH, None
        if state[0][0] != "queued":
            return DeleteOutcome.ALREADY_DONE, group
        if group.region in (c["tripped_regions"] or ()):
            return DeleteOutcome.REGION_TRIPPED, group
    return None, group


def acquire_gate(db: Database, scope: str, ref: str, holder: str, ttl_seconds: int) -> bool:
    """Take the per-ref delete gate (a lease row). Unrelated refs never wait. The gate is
    per account (``Backend.scope``, kept in the ``backend_id`` column): backends sharing an
    account list the same groups and must not delete one at the same time (rule 4)."""
    with db.transaction() as conn:
        rows = conn.run(
            "INSERT INTO delete_gates AS g (backend_id, provider_ref, holder, expires_at)"
            " VALUES (:b, :r, :h, now() + make_interval(secs => :t))"
            " ON CONFLICT (backend_id, provider_ref) DO UPDATE SET holder = excluded.holder,"
            " expires_at = excluded.expires_at WHERE g.expires_at < now() OR g.holder = excluded.holder"
            " RETURNING holder", b=scope, r=ref, h=holder, t=ttl_seconds)
    return bool(rows)


def release_gate(db: Database, scope: str, ref: str, holder: str) -> None:
    with db.transaction() as conn:
        conn.run("DELETE FROM delete_gates WHERE backend_id = :b AND provider_ref = :r AND holder = :h",
                 b=scope, r=ref, h=holder)


def record_delete(db: Database, cycle_id: str, group: ResourceGroup, limits: Limits, *,
                  result: DeleteResult | None = None, error: str | None = None,
                  trip_region: bool = False, skipped_reason: str | None = None,
                  now: datetime | None = None) -> Outcome | None:
    """Record one deletion's end (fenced, once per (cycle, group)); finishes the
    cycle when it was the last open piece. Returns the outcome if it finished."""
    if result is not None:
        action = {DeleteStatus.DELETED: Action.DELETED, DeleteStatus.DELETING: Action.DELETING,
                  DeleteStatus.SKIPPED: Action.REPORTED}[result.status]
        state = {Action.DELETED: "done", Action.DELETING: "deleting", Action.REPORTED: "skipped"}[action]
    elif skipped_reason is not None:
        action, state = Action.REPORTED, "skipped"
    else:
        action, state = Action.DELETE_FAILED, "failed"
    orphan_state = {Action.DELETED: "deleted", Action.DELETING: "deleting",
                    Action.REPORTED: "open", Action.DELETE_FAILED: "delete_failed"}[action]
    detail = {"result": result.model_dump(mode="json") if result else None, "error": error,
              "skipped": skipped_reason}
    with db.transaction() as conn:
        c = lock_cycle(conn, cycle_id)
        rows = conn.run("UPDATE delete_requests SET state = :s, attempts = attempts + 1,"
                        " result = CAST(:r AS jsonb), updated_at = now()"
                        " WHERE cycle_id = :c AND group_key = :k AND state = 'queued' RETURNING 1",
                        s=state, r=json.dumps(detail), c=cycle_id, k=group.key)
        if not rows:
            return None
        conn.run("UPDATE cycle_groups SET action = :a, error = :e, updated_at = now()"
                 " WHERE cycle_id = :c AND group_key = :k", a=action.value, e=error, c=cycle_id, k=group.key)
        conn.run("UPDATE orphans SET state = :s, last_error = :e WHERE backend_id = :b AND group_key = :k",
                 s=orphan_state, e=error, b=c["backend_id"], k=group.key)
        # The event targets the owner by the id and name kept in provider_refs.
        conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, provider_ref, owner_type, owner_id,"
                 " owner_name, details) SELECT :b, :c, :kind, :m, :ref, r.owner_type, r.owner_id, r.owner_name,"
                 " CAST(:d AS jsonb) FROM (SELECT 1) AS one"
                 " LEFT JOIN provider_refs r ON r.provider_ref = :ref",
                 b=c["backend_id"], c=cycle_id, kind=f"orphan_{action.value}",
                 m=_message(action, group, error, skipped_reason), ref=group.provider_ref,
                 d=json.dumps(detail))
        unsettled = action in (Action.DELETING, Action.REPORTED)
        failed = action is Action.DELETE_FAILED and not trip_region
        tripped = list(c["tripped_regions"] or ())
        if trip_region and group.region not in tripped:
            tripped.append(group.region)
        conn.run("UPDATE cycles SET open_deletes = open_deletes - 1, unsettled = unsettled OR :u,"
                 " failed = failed OR :f, tripped_regions = CAST(:t AS text[]),"
                 " error = CASE WHEN :f THEN coalesce(error, :e) ELSE error END WHERE id = :c",
                 u=unsettled or trip_region, f=failed, t=tripped, e=error, c=cycle_id)
        c.update(open_deletes=c["open_deletes"] - 1, unsettled=c["unsettled"] or unsettled or trip_region,
                 failed=c["failed"] or failed, tripped_regions=tripped,
                 error=c["error"] or (error if failed else None))
        if is_complete(c):
            return finish(conn, c, limits, now)
    return None


def _message(action: Action, group: ResourceGroup, error: str | None, skipped: str | None) -> str:
    what = f"orphan group {group.key} ({len(group.resources)} resources)"
    if action is Action.DELETED:
        return f"deleted {what}"
    if action is Action.DELETING:
        return f"deleting {what}: owner termination confirmed, dependents follow"
    if action is Action.REPORTED:
        return f"left {what} in place: {skipped or 'resources changed since listing'}"
    return f"failed to delete {what}: {error}"



def gate_ttl(limits: Limits) -> int:
    return max(60, min(900, limits.cycle_deadline_seconds))
