"""The ledger's side of a cycle's digest: what the finished cycle found, deleted and failed
to delete, read after its STEP 7 committed, and the ``events`` rows that record each
notification (``digest_sent``, ``notify_failed``: append-only, as every event)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pg8000.native
from pydantic import ValidationError

from orphan_cleanup.core.costs import Prices
from orphan_cleanup.core.digest import MAX_LISTED, DigestFacts, DigestGroup
from orphan_cleanup.ledger.queries import KEEPS_SQL, json_value
from orphan_cleanup.ledger.watch import OPEN_STATES

_log = logging.getLogger("orphan_cleanup")

# The cycle's orphan groups that are news: first recorded by this cycle (the orphans row
# was created after the cycle started: one cycle of a backend at a time holds its lease),
# deleted, failed to delete, or marked (SAFETY.md rule 23: with its delete_after); and the
# groups it found kept by the operator (rule 23), with the keep as the cycle read it (``kp``,
# the classifier's), else as it is now (a keep the deleter found). One row per group and
# kind, at most MAX_LISTED per kind. With each, its owner as the ledger has it now (the
# platform's tables): its name and its end (terminated or soft-deleted, the earlier; none
# for a live owner or a row that is gone).
_GROUPS_SQL = """
SELECT kind, provider_ref, primary_id, region, reason, first_seen, resources, total, owner_name, owner_end,
       keep_reason, kept_until, delete_after FROM (
  SELECT k.kind, g.provider_ref, g.primary_id, g.region, g.reason, o.first_seen, coalesce(o.resources, g.resources)
         AS resources, count(*) OVER (PARTITION BY k.kind) AS total,
         row_number() OVER (PARTITION BY k.kind ORDER BY g.group_key) AS n,
         coalesce(i.name, v.name, r.owner_name, o.owner_name) AS owner_name,
         least(i.terminated_at, i.deleted_at, v.deleted_at) AS owner_end,
         CASE WHEN g.evidence ? 'kp' THEN g.evidence->'kp'->>'r' ELSE kk.reason END AS keep_reason,
         CASE WHEN g.evidence ? 'kp' THEN g.evidence->'kp'->>'u' ELSE to_json(kk.until)#>>'{}' END AS kept_until,
         g.delete_after
    FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id
    LEFT JOIN orphans o ON o.backend_id = c.backend_id AND o.group_key = g.group_key
    LEFT JOIN provider_refs r ON r.provider_ref = g.provider_ref
    LEFT JOIN instances i ON i.provider_ref = g.provider_ref
    LEFT JOIN volumes v ON v.provider_ref = g.provider_ref AND r.owner_type = 'volume'  -- README, C1
    LEFT JOIN LATERAL (""" + KEEPS_SQL.format(backend="c.backend_id", refs="ARRAY[g.provider_ref]",
                                               t="oc_clock()") + """) kk ON true
    CROSS JOIN LATERAL (VALUES
        (CASE WHEN g.verdict = 'orphan' AND o.first_seen >= c.started_at THEN 'new_orphans' END),
        (CASE WHEN g.verdict = 'orphan' THEN CASE g.action WHEN 'deleted' THEN 'deleted'
                                                            WHEN 'delete_failed' THEN 'delete_failed'
                                                            WHEN 'marked' THEN 'marked' END END),
        (CASE WHEN g.verdict = 'protected' AND g.reason = 'kept_by_operator' THEN 'kept' END)) AS k(kind)
   WHERE g.cycle_id = :c AND g.verdict IN ('orphan', 'protected') AND k.kind IS NOT NULL) x
 WHERE n <= :m ORDER BY kind, provider_ref, region, primary_id"""


def digest_facts(conn: pg8000.native.Connection, cycle_id: str) -> DigestFacts | None:
    """The finished cycle's facts (None: no such finished cycle)."""
    rows = conn.run(
        "SELECT c.backend_id, b.provider, b.account, c.mode, c.outcome, c.failures, c.error, oc_clock(),"
        " CASE WHEN isfinite(coalesce(k.clean_at, k.created_at))"
        "   THEN CAST(extract(epoch FROM oc_clock() - coalesce(k.clean_at, k.created_at)) AS bigint) END,"
        " (SELECT count(*) FROM orphans o WHERE o.backend_id = c.backend_id AND o.verdict = 'orphan'"
        "   AND o.state IN (" + ", ".join(f"'{s}'" for s in OPEN_STATES) + ")),"
        " (SELECT json_build_array(count(*), coalesce(json_agg(DISTINCT e.cycle_id), '[]'))::text FROM events e"
        "   WHERE e.backend_id = c.backend_id AND e.kind = 'notify_failed'"
        "   AND e.id > coalesce((SELECT max(s.id) FROM events s WHERE s.backend_id = c.backend_id"
        "   AND s.kind = 'digest_sent'), 0)),"
        " b.settings->'prices'"
        " FROM cycles c LEFT JOIN coverages() b ON b.id = c.backend_id"
        " LEFT JOIN cleanup k ON k.backend_id = c.backend_id"
        " WHERE c.id = :c AND c.outcome IS NOT NULL",
        c=cycle_id)
    if not rows:
        return None
    (backend, provider, account, mode, outcome, failures, error, now, since_clean, open_orphans, missed,
     prices) = rows[0]
    missed_count, missed_cycles = json.loads(missed)
    groups: dict[str, list[DigestGroup]] = {"new_orphans": [], "deleted": [], "delete_failed": [], "marked": [],
                                            "kept": []}
    counts: dict[str, int] = dict.fromkeys(groups, 0)
    for (kind, ref, primary, region, reason, first_seen, resources, total, owner_name,
         owner_end, keep_reason, kept_until, delete_after) in conn.run(_GROUPS_SQL, c=cycle_id, m=MAX_LISTED):
        groups[kind].append(DigestGroup(provider_ref=ref, primary_id=primary, region=region, reason=reason,
                                        first_seen=first_seen, resources=tuple(json_value(resources) or ()),
                                        owner_name=owner_name, owner_end=owner_end,
                                        keep=(keep_reason, kept_until) if kind == "kept" else None,
                                        delete_after=delete_after if kind == "marked" else None))
        counts[kind] = int(total)
    return DigestFacts(
        backend=backend, provider=provider, account=account, cycle_id=cycle_id, mode=mode, outcome=outcome,
        failures=tuple(json_value(failures) or ()), error=error, now=now,
        since_clean_seconds=None if since_clean is None else max(0, int(since_clean)),
        open_orphans=int(open_orphans), new_orphans=tuple(groups["new_orphans"]), deleted=tuple(groups["deleted"]),
        delete_failed=tuple(groups["delete_failed"]), marked=tuple(groups["marked"]), kept=tuple(groups["kept"]),
        counts=counts,
        notify_failures=int(missed_count),
        missed_cycles=tuple(c for c in missed_cycles if c), prices=_prices(json_value(prices), backend))


def _prices(value: Any, backend: str) -> Prices | None:
    """The backend's price table; one that is not valid prices nothing (logged, as ``orphans``
    warns: the digest still goes out)."""
    if value is None:
        return None
    try:
        return Prices.model_validate(value)
    except ValidationError as e:
        _log.warning(f"backend {backend}: settings.prices ignored in its digest: {e.errors()[0]['msg']}")
        return None


def record_notification(conn: pg8000.native.Connection, backend_id: str, cycle_id: str, *,
                        failed: dict[str, str], sent: list[str]) -> None:
    """One ``notify_failed`` event per channel that did not take the digest (``failed``:
    channel -> error), and ``digest_sent`` when every channel took it."""
    for channel, error in failed.items():
        conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, details)"
                 " VALUES (:b, :c, 'notify_failed', :m, CAST(:d AS jsonb))", b=backend_id, c=cycle_id,
                 m=f"digest not delivered to {channel}: {error}"[:500],
                 d=json.dumps({"channel": channel, "error": error[:500]}))
    if not failed:
        details: dict[str, Any] = {"channels": sent}
        conn.run("INSERT INTO events (backend_id, cycle_id, kind, message, details)"
                 " VALUES (:b, :c, 'digest_sent', :m, CAST(:d AS jsonb))", b=backend_id, c=cycle_id,
                 m=f"digest sent to {', '.join(sent)}", d=json.dumps(details))
