"""``orphan-cleanup explain --backend ID REF_OR_RESOURCE_ID [--json]`` (README contract C3):
for the latest cycles of a backend that recorded a ref, or a group holding a
resource id, the evidence behind each verdict: the ledger values read, each
owner time against the listing time and the margin, the tags that mattered, the
rule that decided, the action taken and what the re-read before deleting found.

Read-only: the database is opened without migrations and read in one read-only
transaction. Exit codes: 0 found; 1 nothing recorded; 2 bad input (unknown
backend, bad argument, database unreachable or not migrated).

What is recorded: every orphan, protected and skipped group of every cycle;
tracked and ignored groups only by manual runs (``run``), which record all. An id no
cycle recorded exits 1 with the reasons that are true (``cli/explain_unrecorded.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from orphan_cleanup.cli.exits import EXIT_NOT_FOUND, EXIT_OK
from orphan_cleanup.cli.output import human_time, verdict_style
from orphan_cleanup.core import evidence as ev_text
from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.listing import ResourceKind, is_valid_ref
from orphan_cleanup.core.policy import ignored_settings
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.explain import (
    DeleteRow,
    ExplainedGroup,
    JournalEntry,
    explained_groups,
    journal_entries,
    keep_of,
)
from orphan_cleanup.ledger.migrate import require_current_schema
from orphan_cleanup.ledger.store import LedgerStore

CYCLES = 5

#: How the providers' re-read by id names a resource it left alone (``SkippedResource.reason``).
_SKIPPED = {"protected": "carries the protect tag now", "ref_changed": "carries another ref now",
            "ref_missing": "lost its ref tag", "owner_skipped": "left with its VM",
            "blast_protected": "would take a protected disk, volume or interface with it (or is one)",
            "blast_foreign": "would take another ref's disk, volume or interface with it (or is one), or, a load"
                             " balancer, a listener forwarding to a target group outside its group",
            "blast_unlisted": "would take a resource of its ref that the listing did not show with it (or is one)",
            "blast_unreadable": "would take a disk, volume or interface the re-read cannot answer for with it",
            "group_protected": "left with its group: a member carries the protect tag now",
            "unreadable": "the re-read before its VM's delete did not answer for it (it may carry a protect tag)",
            "member_unreadable": "left: a member of its group did not answer the re-read before the delete",
            "not_attached": "not attached to its VM as re-read: left for the next listing",
            "primary_gone": "its VM was gone before this delete, and no earlier one saw it attached: left",
            "not_our_snapshot": "is a snapshot the deleter did not take",
            "snapshot_retained": "is a snapshot its retention keeps (retain_snapshots_days unset, or not that old)",
            "in_use": "something outside its group uses it (an instance, an image, a load balancer, a registered"
                      " target): left, the group not done",
            "deletion_protection": "a load balancer with deletion protection on: left alone",
            "replaced": "its name named another resource right before the delete call: not deleted",
            "changed_since_read": "changed between the deletion's reads and its call: left for the next cycle",
            "protection_unreadable": "its termination protection cannot be read and a spot request would have to be"
                                     " cancelled first: left alone",
            "spot_request_ref_missing": "its spot request carries no ref tag: not cancelled",
            "spot_request_protected": "its spot request carries a protect tag: not cancelled",
            "spot_request_ref_changed": "its spot request carries another ref: not cancelled"}


def command(args: argparse.Namespace) -> int:
    """The CLI command (``cli.main`` maps ``ConfigError``, ``SchemaNotMigrated`` included,
    and ``DatabaseError`` to exit 2)."""
    from orphan_cleanup.entrypoints import bootstrap

    query = args.ref_or_resource_id
    if not query or len(query) > 1024 or "\x00" in query:
        raise ConfigError("REF_OR_RESOURCE_ID must be 1-1024 characters (a provider_ref or a resource id)")
    settings = bootstrap.load_settings()
    db = bootstrap.open_database(settings)  # never run_migrations: explain is read-only (C3)
    require_current_schema(db)
    groups = explain(db, args.backend, query)
    journal = journal_entries(db, args.backend, query, sorted({g.group.provider_ref for g in groups}))
    ignored = ignored_limits(db, settings, args.backend)
    removed_at = _removed_at(db, args.backend)
    from orphan_cleanup.cli.explain_unrecorded import removed_line, why_not_recorded

    if not groups and not journal:
        for line in why_not_recorded(db, args.backend, query, removed_at=removed_at):  # the reasons true here
            print(line, file=sys.stderr)
        return EXIT_NOT_FOUND
    if removed_at is not None:
        print(f"orphan-cleanup: {removed_line(args.backend, removed_at)}", file=sys.stderr)
    refs = [query] if is_valid_ref(query) else []
    keep = keep_of(db, args.backend, refs + sorted({g.group.provider_ref for g in groups} - set(refs)))
    if args.json:
        print(json.dumps({**document(args.backend, query, groups, journal), "ignored_settings": ignored,
                          "keep": keep}, indent=2))
    else:
        if keep is not None:
            print(keep_text(keep))
        print_explained(args.backend, query, groups)
        for key, why in ignored.items():
            print(f"settings: {key}: {why['why']} (the stack's as this shell's environment says)")
        print_journal(journal)
    return EXIT_OK


def keep_text(keep: Mapping[str, Any]) -> str:
    """The operator's keep of the ref, first (SAFETY.md rule 23): its reason, when it was
    written, its end."""
    line = ev_text.keep_line(keep["reason"], keep["until"] and human_time(keep["until"]))
    return (f"ref {keep['provider_ref']}: {line} (kept {human_time(keep['kept_at'])}"
            + ("; ended: its groups are judged as any other)" if keep["ended"] else
               "; its groups are protected, never deleted: orphans release to end it)"))


def _removed_at(db: Database, backend_id: str) -> Any:
    """When ``backend remove`` removed the backend (its row is gone; its history stays),
    else None (a backend that exists, or that never did)."""
    with db.connection() as conn:
        rows = conn.run("SELECT max(at) FROM events WHERE backend_id = :b AND kind = 'backend_removed'"
                        " AND NOT EXISTS (SELECT 1 FROM backends WHERE id = :b)", b=backend_id)
    return rows[0][0] if rows else None


def ignored_limits(db: Database, settings: Settings, backend_id: str) -> dict[str, dict[str, Any]]:
    """The backend row's limits that would loosen the stack's and are not used (SAFETY.md
    rule 8), as ``backend show --json`` gives them; none for a row the model refuses, or a
    removed backend (whose cycles are still explained)."""
    try:
        row = LedgerStore(db).backend_row(backend_id)
    except ConfigError:
        return {}
    if row.backend is None:
        return {}
    return {k: {"value": i.value, "stack": i.stack, "why": i.why}
            for k, i in ignored_settings(settings, row.backend).items()}


def explain(db: Database, backend_id: str, query: str, *, cycles: int = CYCLES) -> list[ExplainedGroup]:
    """The groups matching ``query`` in the latest ``cycles`` cycles that recorded one."""
    return explained_groups(db, backend_id, query, cycles=cycles)


# ---- the JSON document ---------------------------------------------------------------

def document(backend_id: str, query: str, groups: Sequence[ExplainedGroup],
             journal: Sequence[JournalEntry] = ()) -> dict[str, Any]:
    """``{"backend", "query", "cycles": [...], "journal": [...]}``: one entry per recorded
    group, newest cycle first (a cycle that recorded two groups of one ref, a retry leak and
    its kept VM, has two); then every journaled provider call on those refs or that
    resource, oldest first (SAFETY.md rule 19: also those of a cycle that lost its lease)."""
    return {"backend": backend_id, "query": query, "cycles": [entry(g) for g in groups],
            "journal": [journal_doc(j) for j in journal]}


def journal_doc(j: JournalEntry) -> dict[str, Any]:
    return {"at": j.at.isoformat(), "cycle_id": j.cycle_id, "phase": j.phase, "call": j.call, "target": j.target,
            "region": j.region, "blast": list(j.blast), "outcome": j.outcome, "error": j.error}


def entry(g: ExplainedGroup) -> dict[str, Any]:
    grp = g.group
    return {"cycle_id": g.cycle_id, "listed_at": g.listed_at.isoformat(), "mode": g.mode,
            "group": {"provider_ref": grp.provider_ref, "region": grp.region, "primary_id": grp.primary_id,
                      "resources": [{"kind": r.kind.value, "id": r.id, "state": r.state.value,
                                     "created_at": r.created_at.isoformat() if r.created_at else None,
                                     "tags": r.tags} for r in grp.resources]},
            "verdict": g.verdict, "reason": g.reason, "action": g.action,
            "detail": (g.evidence or {}).get("d"),
            "evidence": ev_text.expand(g.reason, g.evidence, grp, g.listed_at),
            "delete": delete_doc(g)}


def delete_doc(g: ExplainedGroup) -> dict[str, Any] | None:
    """The delete request's end as recorded (None: the cycle asked for no delete)."""
    d = g.delete
    if d is None:
        if g.blocked_reason and g.verdict == "orphan":
            return {"state": "blocked", "attempts": 0, "updated_at": None, "result": None, "error": None,
                    "skipped_reason": None, "found": f"deleted nothing: blast-radius cap: {g.blocked_reason}"}
        return None
    rec = d.result or {}
    return {"state": d.state, "attempts": d.attempts, "updated_at": d.updated_at.isoformat() if d.updated_at else None,
            "result": rec.get("result"), "error": rec.get("error"), "skipped_reason": rec.get("skipped"),
            "found": reread(g, d)}


def reread(g: ExplainedGroup, d: DeleteRow) -> str:
    """What the deleter found on re-reading, in words: the ledger again under the ref's
    gate (still an orphan?), then each resource by its immutable id (same ref, no protect tag?)."""
    rec = d.result or {}
    skipped_reason, error, result = rec.get("skipped"), rec.get("error"), rec.get("result")
    if d.state == "queued":
        return "queued: not handled yet"
    if skipped_reason == "owner_changed:created_at_changed":
        return ("re-read by id under the gate: the provider does not report the VM created when the"
                " listing says (gone, or another time): nothing deleted")
    if skipped_reason and skipped_reason.startswith("owner_changed:"):
        return (f"ledger re-read under the gate: the owner changed since the listing (now"
                f" {skipped_reason.split(':', 1)[1]}): nothing deleted")
    if skipped_reason == "region_tripped":
        return "its region timed out or was unavailable earlier in the cycle: not tried"
    if skipped_reason == "backend_off":
        return "the backend was switched off after the cycle started: not tried"
    if skipped_reason == "backend_changed":
        return "the backend's account, roles or key changed after the cycle started: not tried"
    if error:
        return f"delete failed: {error}"
    if not result:
        return d.state
    parts = ["ledger re-read under the gate: still an orphan"]
    skipped = [f"{s['id']} {_SKIPPED.get(s['reason'], s['reason'])}" for s in result.get("skipped", [])]
    deleted = list(result.get("deleted", []))
    if skipped:
        parts.append("re-read by id: " + ", ".join(skipped))
    if deleted:
        has_vm = any(r.kind is ResourceKind.INSTANCE and r.id in deleted for r in g.group.resources)
        parts.append(("re-read by id: same ref, no protect tag; " if not skipped else "")
                     + f"deleted {', '.join(deleted)}" + (" (termination confirmed)" if has_vm else ""))
    taken, waiting = ev_text.snapshot_pairs(result.get("snapshots")), ev_text.snapshot_pairs(
        result.get("snapshots_pending"))
    if taken is None or waiting is None:
        parts.append("snapshots: the record cannot be read")
    elif note := ev_text.snapshot_note(taken, waiting):
        parts.append(f"kept {note}")
    if result.get("pending"):
        parts.append(f"pending until their VM is gone: {', '.join(result['pending'])} (next cycle)")
    if result.get("status") == "skipped" and not deleted:
        parts.append("nothing deleted")
    return "; ".join(parts)


# ---- human output ----------------------------------------------------------------------

def print_explained(backend_id: str, query: str, groups: Sequence[ExplainedGroup],
                    stream: TextIO | None = None) -> None:
    """One block per recorded group, newest cycle first."""
    out = stream or sys.stdout
    cycles = len({g.cycle_id for g in groups})
    print(f"{query}: {len(groups)} recorded group(s) in the latest {cycles} cycle(s) of backend {backend_id}"
          " that recorded it", file=out)
    for g in groups:
        print(file=out)
        for line in block(g):
            print(line, file=out)


def print_journal(journal: Sequence[JournalEntry], stream: TextIO | None = None) -> None:
    """The journaled provider calls, oldest first: an intent and its result on one line."""
    if not journal:
        return
    out = stream or sys.stdout
    print(f"\nprovider calls (journal, {len(journal)} rows):", file=out)
    for j in journal:
        what = f"{j.call} {j.target}" + (f" (with {', '.join(j.blast)})" if j.blast else "")
        end = "intent" if j.phase == "intent" else f"{j.outcome}" + (f": {j.error}" if j.error else "")
        print(f"  {_at(j.at)}  {end:<8} {what}  cycle {j.cycle_id or '-'}", file=out)


def block(g: ExplainedGroup) -> list[str]:
    grp, ev, listed = g.group, g.evidence, g.listed_at
    lines = [f"cycle {g.cycle_id}  listed_at {_at(listed)}  mode {g.mode}{', manual' if g.manual else ''}"
             f"  outcome {g.outcome or 'running'}"]
    members = ", ".join(f"{r.kind.value} {r.id}" for r in grp.resources) or "no resources"
    lines.append(_row("group", f"ref {grp.provider_ref}  {grp.region}  primary {grp.primary_id or '-'}: {members}"))
    rule = ev_text.RULES.get(g.reason, "")
    lines.append(_row("verdict", f"{verdict_style(g.verdict)} ({g.reason})" + (f": {rule}" if rule else "")))
    if ev is None:
        lines.append(_row("evidence", "not recorded (classified before migration 0008)"))
    else:
        lines += _evidence_lines(g, ev, listed)
    lines.append(_row("action", g.action + (f" ({g.error})" if g.error else "")))
    doc = delete_doc(g)
    if doc is not None:
        lines.append(_row("delete", f"{doc['state']}: {doc['found']}"))
    return lines


def _evidence_lines(g: ExplainedGroup, ev: Mapping[str, Any], listed: datetime) -> list[str]:
    grp, margin = g.group, int(ev.get("m", 0))
    step5 = g.reason in ev_text.STEP5
    lines = [_row("owner", _owner(ev))]
    times = ev_text.owner_times(ev, listed)
    lines.append(_row("margin", f"{ev_text.span(margin)}: horizon listed_at - margin = "
                      f"{_at(listed - timedelta(seconds=margin))}"
                      + ("" if step5 else " (not applied: the verdict came before STEP 5)")))
    created = [(r.id, r.created_at) for r in grp.resources if r.created_at is not None]
    # One column for the time names and the resource ids, as wide as the longest of them
    # (AWS ids, GCP numeric ids, names) and two spaces on: an id never runs into its date.
    width = max((len(n) for n in [*times, *(rid for rid, _ in created)]), default=0) + 2
    for i, (name, t) in enumerate(times.items()):
        lines.append(_row("times" if i == 0 else "", f"{name:<{width}}{_judge(t, listed, margin, step5)}"))
    for i, (rid, t) in enumerate(created):
        lines.append(_row("created" if i == 0 else "", f"{rid:<{width}}{_judge(t, listed, margin, step5)}"))
    if g.reason in ("primary_mismatch", "backend_mismatch", "suspected_copy"):
        lines.append(_row("copy?", ev_text.copy_gap(ev, grp, listed)))
    lines.append(_row("tags", _tags(g, ev)))
    if "ko" in ev:
        lines.append(_row("history", f"{ev['ko']} of {len(grp.resources)} resource(s) in an earlier orphan group"))
    if "mg" in ev:
        lines.append(_row("malformed", str(ev["mg"])))
    if "d" in ev:
        lines.append(_row("detail", str(ev["d"])))
    return lines


def _owner(ev: Mapping[str, Any]) -> str:
    if not ev_text.has_owner(ev):
        return "no ledger record for this ref"
    who = f"{ev.get('o') or '?'}" + (f" {json.dumps(ev['on'])}" if ev.get("on") else "")
    if ev.get("ot"):
        who += f" (owner type {ev['ot']})"
    if ev.get("gone"):
        return f"{who}: instances row hard-deleted (only provider_refs is left)"
    facts = [f"status {ev.get('st')}"]
    if ev.get("ob"):
        scope = ev.get("os") or "no backends row"
        facts.append(f"backend {ev['ob']} ({scope}" + (f"; this backend: {ev['sc']})" if ev.get("sc") else ")"))
    else:
        facts.append("no backend_id")
    facts.append(f"primary_id {ev.get('pid') or '-'}")
    if "de" in (ev.get("t") or {}):
        facts.append("soft-deleted")
    return f"{who}: " + ", ".join(facts)


def _tags(g: ExplainedGroup, ev: Mapping[str, Any]) -> str:
    tag_key, protect_key = ev.get("tk", DEFAULT_TAG_KEY), ev.get("pk", DEFAULT_PROTECT_KEY)
    grp = g.group
    odd = [f"{r.id} {tag_key}={r.tags.get(tag_key)!r}" for r in grp.resources
           if r.tags.get(tag_key) != grp.provider_ref]
    ref = f"{tag_key}={grp.provider_ref} on every resource" if not odd else "; ".join(odd)
    protected = list(ev.get("pt", []))
    return ref + "; " + (f"{protect_key} on {', '.join(protected)}" if protected else f"no {protect_key} tag")


def _judge(t: datetime, listed: datetime, margin: int, step5: bool) -> str:
    """``2026-12-01 10:00:00Z is 3h12m before listed_at - margin: old enough``."""
    if not step5:
        return f"{_at(t)} is {ev_text.relative(t, listed, 'listed_at')}"
    horizon = listed - timedelta(seconds=margin)
    if not ev_text.within_margin(t, listed, margin):
        return f"{_at(t)} is {ev_text.relative(t, horizon, 'listed_at - margin')}: old enough"
    if t == horizon:
        return f"{_at(t)} is at listed_at - margin: within the margin"
    return f"{_at(t)} is {ev_text.relative(t, horizon, 'listed_at - margin')}: within the margin"


def _row(label: str, text: str) -> str:
    return f"  {label:<9} {text}"


def _at(t: datetime) -> str:
    return f"{t.astimezone(UTC) if t.tzinfo else t:%Y-%m-%d %H:%M:%S}Z"
