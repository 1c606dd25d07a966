"""STEP 4-6 for one batch: classify its groups and shape what the fenced apply
writes (``BatchApplication``). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from orphan_cleanup.core import classify, costs, evidence
from orphan_cleanup.core.decisions import BatchApplication, GroupRow, OrphanRow, ReportEvent
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.listing_rules import volume_groups
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.owners import Keep, Record
from orphan_cleanup.core.verdicts import Action, Verdict, VerdictKind


def classify_batch(batch: ListingBatch, records: Mapping[str, Record], ctx: classify.ClassifyContext, *,
                  mode: str, record_all: bool, keeps: Mapping[str, Keep] | None = None) -> BatchApplication:
    """Classify a batch and shape what the fenced apply writes. ``mode`` and
    ``record_all`` are the cycle's (from its row, never from the message); ``ctx`` is
    the cycle's, judging beside this batch's listing (``policy.classify_context``);
    ``keeps`` the operator's keeps in force at its listing time, by ref (SAFETY.md rule 23).

    Most groups of a healthy account are tracked: unless the cycle records
    every group, a group that is neither written nor logged is only counted
    (building its row was most of this function's time; see bench/classifier.py)."""
    rows: list[GroupRow] = []
    orphans: list[OrphanRow] = []
    events: list[ReportEvent] = []
    to_report: list[GroupRow] = []
    errors: list[tuple[str, GroupRow]] = []
    by_kind: dict[VerdictKind, int] = {}
    recorded = classify.RECORDED
    keeps = keeps or {}
    for group, record in judged_groups(batch.groups, records):
        verdict = classify.classify(group, record, ctx)
        if keeps:
            verdict = classify.kept(verdict, keeps.get(group.provider_ref))
        kind = verdict.kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if not (record_all or kind in recorded or verdict.log_error):
            continue
        action = classify.verdict_action(kind, mode)
        keep = record_all or kind in recorded
        row = GroupRow(group=group, verdict=kind, reason=verdict.reason, action=action,
                       owner_type=record.owner_type if record else None,
                       owner_id=record.owner_id if record else None,
                       owner_name=record.owner_name if record else None,
                       evidence=_evidence(group, record, ctx, verdict, keeps.get(group.provider_ref))
                       if keep else None)
        if verdict.log_error:
            errors.append((verdict.log_error, row))
        if keep:
            rows.append(row)
        if kind in (VerdictKind.ORPHAN, VerdictKind.PROTECTED):
            orphans.append(OrphanRow(row=row, state="open" if kind is VerdictKind.ORPHAN else "protected",
                                     reported=action is Action.REPORTED, orphan_since=_orphan_since(group, record)))
        # ``orphan_resources`` are not written from a listing (a message anyone who may write
        # to the queue could forge): only the deleter's re-read confirms which resources were
        # attached to an orphan VM (``DeleteResult.attached``, SAFETY.md rule 15).
        if action is Action.REPORTED:
            to_report.append(row)
            events.append(ReportEvent(row=row, message=f"{kind.value} resource group {group.key}: {verdict.reason}"))
    return BatchApplication(
        cycle_id=batch.cycle_id, seq=batch.seq, last=batch.last, batch_count=batch.batch_count,
        failures=batch.failures, groups=len(batch.groups), skipped=VerdictKind.SKIPPED in by_kind,
        rows=tuple(rows), orphans=tuple(orphans), events=tuple(events),
        to_report=tuple(to_report), errors=tuple(errors), counts={kind.value: n for kind, n in by_kind.items()})


def judged_groups(groups: Iterable[ResourceGroup],
                  records: Mapping[str, Record]) -> Iterator[tuple[ResourceGroup, Record | None]]:
    """Each listed group with its ref's record, as classification judges it: a volume owner's
    primary-less group as one group per volume (``listing_rules.volume_groups``: README, C1, a
    volume group's primary is the volume), recorded and deleted as such. (The cycle's count of
    listed groups stays the listing's: the blast-radius share is not loosened by a split.)"""
    for group in groups:
        record = records.get(group.provider_ref)
        if record is not None and record.owner_type == "volume":
            for one in volume_groups(group):
                yield one, record
        else:
            yield group, record


def _orphan_since(group: ResourceGroup, record: Record | None) -> datetime | None:
    """Since when the group is an orphan: its owner's end (terminated or soft-deleted, the
    earlier), never before the group's listed creation; else that creation."""
    ends = [t for t in (record.terminated_at, record.deleted_at) if t is not None] if record is not None else []
    created = {r.id: r.created_at for r in group.resources if r.created_at is not None}
    return costs.orphan_since(costs.listed_creation(created, group.primary_id), min(ends, default=None))


def _evidence(group: ResourceGroup, record: Record | None, ctx: classify.ClassifyContext,
              verdict: Verdict, keep: Keep | None = None) -> dict[str, Any]:
    """The facts of the verdict and, where they say something short, the C3 detail line (``d``)."""
    ev = evidence.record_of(group, record, ctx, verdict)
    if keep is not None and verdict.reason == "kept_by_operator":
        ev["kp"] = evidence.keep_record(keep)
    line = evidence.detail(verdict.reason, ev, group, ctx.listed_at)
    if line:
        ev["d"] = line[:200]
    return ev
