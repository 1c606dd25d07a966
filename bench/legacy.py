"""The STEP 3 join and ``build_payload`` as they were before issue #10 (commit
caf2dda), kept so every benchmark run measures the "before" next to the
"after" on the same machine, in the same run. Not used by the product."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pg8000.native

from orphan_cleanup.core import classify
from orphan_cleanup.core.decisions import BatchApplication
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.owners import LedgerRecord
from orphan_cleanup.core.verdicts import Action, VerdictKind

JOIN_SQL = """
SELECT r.provider_ref, r.owner_type, r.owner_id, r.owner_name, r.issued_at,
       i.id IS NOT NULL, i.status, i.backend_id, i.primary_id, i.region,
       i.created_at, i.provisioned_at, i.terminated_at, i.deleted_at,
       CASE WHEN r.provider_ref = ANY(CAST(:leftover AS text[])) THEN
           (SELECT array_agg(o.resource_id) FROM orphan_resources o
             WHERE o.backend_id = :backend AND o.provider_ref = r.provider_ref)
       END
  FROM provider_refs r
  LEFT JOIN instances i ON i.provider_ref = r.provider_ref
 WHERE r.provider_ref = ANY(CAST(:refs AS text[]))
"""


def load_records(conn: pg8000.native.Connection, backend_id: str,
                 groups: Iterable[ResourceGroup]) -> dict[str, LedgerRecord]:
    """STEP 3: the ledger records of the groups' refs, keyed by ref, in one statement."""
    refs: set[str] = set()
    leftover: set[str] = set()
    for g in groups:
        refs.add(g.provider_ref)
        if g.primary_id is None:
            leftover.add(g.provider_ref)
    if not refs:
        return {}
    rows = conn.run(JOIN_SQL, refs=sorted(refs), leftover=sorted(leftover), backend=backend_id)
    return {row[0]: record_from_row(row) for row in rows}


def record_from_row(row: list) -> LedgerRecord:
    return LedgerRecord(
        provider_ref=row[0], owner_type=row[1], owner_id=row[2], owner_name=row[3], issued_at=row[4],
        instance_found=bool(row[5]), status=row[6], backend_id=row[7], primary_id=row[8], region=row[9],
        created_at=row[10], provisioned_at=row[11], terminated_at=row[12], deleted_at=row[13],
        known_orphan_resource_ids=frozenset(row[14] or ()),
    )


def build_payload(batch: ListingBatch, records: dict, ctx: classify.ClassifyContext, **_cycle: Any) -> tuple[
        dict[str, Any], list[dict[str, Any]], list[tuple[str, dict[str, Any]]], dict[str, int]]:
    """Classify a batch and shape what the fenced apply writes. Pure. (The cycle's
    mode and record_all, which the shipped one takes, equal the batch's here.)"""
    rows, orphans, orphan_res, events, to_report, errors = [], [], [], [], [], []
    counts: dict[str, int] = {}
    skipped = False
    report = batch.mode != "delete"
    for group in batch.groups:
        record = records.get(group.provider_ref)
        verdict = classify.classify(group, record, ctx)
        kind = verdict.kind
        counts[kind.value] = counts.get(kind.value, 0) + 1
        skipped = skipped or kind is VerdictKind.SKIPPED
        if kind is VerdictKind.ORPHAN:
            action = Action.REPORTED if report else Action.NONE
        elif kind is VerdictKind.PROTECTED:
            action = Action.REPORTED
        else:
            action = Action.NONE
        row = {"group_key": group.key, "provider_ref": group.provider_ref, "region": group.region,
               "primary_id": group.primary_id, "resources": [r.model_dump(mode="json") for r in group.resources],
               "verdict": kind.value, "reason": verdict.reason, "action": action.value,
               "owner_id": record.owner_id if record else None,
               "owner_name": record.owner_name if record else None}
        if verdict.log_error:
            errors.append((verdict.log_error, row))
        if batch.record_all or kind in (VerdictKind.ORPHAN, VerdictKind.PROTECTED, VerdictKind.SKIPPED):
            rows.append(row)
        if kind in (VerdictKind.ORPHAN, VerdictKind.PROTECTED):
            state = "open" if kind is VerdictKind.ORPHAN else "protected"
            orphans.append({**row, "state": state, "reported": 1 if action is Action.REPORTED else 0})
        if kind is VerdictKind.ORPHAN:
            orphan_res.extend({"provider_ref": group.provider_ref, "resource_id": r.id} for r in group.resources)
        if action is Action.REPORTED:
            to_report.append(row)
            events.append({"kind": f"{kind.value}_reported", "provider_ref": group.provider_ref,
                           "message": f"{kind.value} resource group {group.key}: {verdict.reason}",
                           "owner_type": record.owner_type if record else None,
                           "owner_id": row["owner_id"], "owner_name": row["owner_name"],
                           "details": {"resources": [r.id for r in group.resources], "reason": verdict.reason}})
    payload = {"cycle_id": batch.cycle_id, "seq": batch.seq, "last": batch.last, "batch_count": batch.batch_count,
               "failures": [f.model_dump() for f in batch.failures], "groups": len(batch.groups),
               "skipped": skipped, "rows": rows, "orphans": orphans, "orphan_resources": orphan_res,
               "events": events}
    return payload, to_report, errors, counts


@dataclass(frozen=True)
class LegacyApplication(BatchApplication):
    """The v0 payload, already shaped as ``oc_apply_batch`` reads it. (Its rows are
    not re-typed: the "before" run reports nothing, with a quiet reporter anyway.)"""

    payload: dict[str, Any] = field(default_factory=dict)


def _build_legacy(batch: ListingBatch, records: dict, ctx: classify.ClassifyContext,
                  **cycle: Any) -> LegacyApplication:
    payload, _to_report, _errors, counts = build_payload(batch, records, ctx, **cycle)
    return LegacyApplication(cycle_id=batch.cycle_id, seq=batch.seq, last=batch.last, batch_count=batch.batch_count,
                             failures=batch.failures, groups=len(batch.groups), skipped=payload["skipped"],
                             counts=counts, payload=payload)


@contextmanager
def installed() -> Iterator[None]:
    """Run ``Pipeline.handle_batch`` with the functions above (the "before")."""
    import orphan_cleanup.cycle.classifier as classifier  # where handle_batch finds classify_batch
    import orphan_cleanup.ledger.queries as queries
    import orphan_cleanup.ledger.session as store  # where LedgerSession.apply finds apply_payload

    shipped = store.apply_payload

    def apply_payload(app: BatchApplication) -> dict[str, Any]:
        return app.payload if isinstance(app, LegacyApplication) else shipped(app)

    saved = queries.load_records, classifier.classify_batch, store.apply_payload
    queries.load_records, classifier.classify_batch, store.apply_payload = (  # type: ignore[assignment]
        load_records, _build_legacy, apply_payload)
    try:
        yield
    finally:
        queries.load_records, classifier.classify_batch, store.apply_payload = saved
