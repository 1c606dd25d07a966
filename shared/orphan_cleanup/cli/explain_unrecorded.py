"""``explain`` of an id that no cycle of the backend recorded: why, in the words that are
true for this backend's history and this ledger (README, "Running it by hand"):

- a manual run (``run``) records every group it lists: an id missing from the latest one
  was never listed by it (no ref tag, another region, account or kind, created later);
- a scheduled cycle records only its orphan, protected and skipped groups: what it listed
  and found tracked or ignored (no ledger record, no valid ref) is not recorded;
- the ledger: an owner recording the id as its VM, or the ref's owner.
"""

from __future__ import annotations

import json
from datetime import datetime

from orphan_cleanup.cli.output import human_time
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.unrecorded import LedgerOwner, UnrecordedFacts, unrecorded_facts


def why_not_recorded(db: Database, backend_id: str, query: str, *, removed_at: datetime | None = None) -> list[str]:
    """The lines ``explain`` prints on stderr before it exits 1 (``removed_at``: the
    backend was removed then, so no run of it is suggested)."""
    facts = unrecorded_facts(db, backend_id, query)
    head = f"orphan-cleanup: nothing recorded for {query!r} by the cycles of backend {backend_id}:"
    return [head, *(f"  - {line}" for line in reasons(backend_id, query, facts, removed_at=removed_at))]


def removed_line(backend_id: str, removed_at: datetime) -> str:
    return (f"backend {backend_id} was removed at {human_time(removed_at)} (backend remove): no cycle of it runs"
            " any more (a retired coverage may still list what it covered: see status); what its cycles recorded"
            " stays")


def reasons(backend_id: str, query: str, facts: UnrecordedFacts, *, removed_at: datetime | None = None) -> list[str]:
    out: list[str] = [removed_line(backend_id, removed_at)] if removed_at is not None else []
    run = (f"`orphan-cleanup run --backend {backend_id}` (report mode: deletes nothing)" if removed_at is None
           else "a manual run of a backend")
    manual = facts.manual
    if manual is not None:
        out.append(f"never listed: the latest manual run (cycle {manual.cycle_id}, listed at"
                   f" {human_time(manual.listed_at)}) recorded every group it listed, and none holds it: a resource"
                   f" without a {facts.tag_key!r} tag is never listed (listings ask the provider for that key), nor"
                   f" one in a region, account or kind that {backend_id} does not list, nor one created after that"
                   " listing")
        if manual.failed_regions:
            regions = ", ".join("every region" if r == "*" else r for r in manual.failed_regions)
            out.append(f"that run could not list {regions}: what is there was not seen")
    if facts.scheduled:
        since = "since that run" if manual is not None else "so far"
        out.append(f"scheduled cycles record only orphan, protected and skipped groups: {facts.scheduled} of them"
                   f" listed {since} (the latest at {human_time(facts.latest_scheduled)}); a group they listed"
                   " and found tracked, or ignored (a ref not in this ledger, or a ref tag without a valid ref"
                   f" value), is not recorded: {run} records every group")
    if manual is None and not facts.scheduled:
        out.append(f"no cycle of {backend_id} finished a listing" if removed_at is not None
                   else f"no cycle of {backend_id} has finished a listing yet: {run}")
    elif manual is None:
        out.append(f"no manual run of {backend_id} has listed yet")
    out += _ledger(query, facts)
    return out


def _ledger(query: str, facts: UnrecordedFacts) -> list[str]:
    lines = []
    if facts.is_ref and not facts.ref_known:
        lines.append(f"the ledger has no ref {query} (provider_refs): a resource tagged with it is not ours"
                     " (no_record, ignored)")
    for owner in facts.owners:
        if owner.provider_ref == query:
            lines.append(f"the ledger: ref {query} belongs to {_who(owner)}")
        else:
            lines.append(f"the ledger: {_who(owner)} records {query} as its primary_id (ref {owner.provider_ref})"
                         ": a run that lists it finds it tracked")
    if not facts.is_ref and not facts.owners:
        lines.append(f"the ledger: no owner records {query} as its primary_id")
    return lines


def _who(owner: LedgerOwner) -> str:
    name = f" {json.dumps(owner.owner_name)}" if owner.owner_name else ""
    if owner.status is None:
        table = "volumes" if owner.owner_type == "volume" else "instances"
        return f"owner {owner.owner_id or '?'}{name}, whose {table} row is gone (hard-deleted)"
    facts = [f"status {owner.status}", f"primary_id {owner.primary_id or '-'}",
             f"backend {owner.backend_id or '-'}"]
    return f"owner {owner.owner_id}{name} ({', '.join(facts)})"
