"""The C6 digest of a finished cycle (README, "Knowing it works"): whether a cycle deserves
one, the document, and its short texts (the SNS subject, the Slack message). Pure.

A cycle deserves a digest when it found new orphans (an orphan is new only in the first
cycle that records it), deleted or failed to delete something, failed, or found its
backend stale (no clean cycle for ``STALE_INTERVALS`` intervals). An unchanged cycle gets
none.

Each orphan item tells how old the leak is, not when this tool first saw it: the primary's
creation as the provider reported it (``created_at``; a group of leftovers: its oldest
resource's), since when it is an orphan (``orphan_since``: its owner's end, never before its
creation; else its creation), its owner's name and, with the backend's ``prices``, what it
costs per hour (``core.costs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orphan_cleanup.core.costs import Prices, cost_per_hour, listed_creation, orphan_since, size_of

#: A backend is stale after this many intervals without a clean cycle (the stacks' alarm too).
STALE_INTERVALS = 6
#: Groups listed per kind in one digest (a message stays small); the counts say how many in all.
MAX_LISTED = 50
#: Orphans named in the Slack text.
SLACK_ORPHANS = 10


@dataclass(frozen=True)
class DigestGroup:
    """A group of the cycle as the digest lists it (``resources`` as the listing recorded
    them: ``kind``, ``id``, ``created_at``, ``details``), with its owner as the ledger has
    it: ``owner_name`` and ``owner_end`` (its termination or soft delete, the earlier; None
    for an owner that did not end or whose row is gone)."""

    provider_ref: str
    primary_id: str | None
    region: str
    reason: str
    first_seen: datetime | None
    resources: tuple[dict[str, Any], ...]
    owner_name: str | None = None
    owner_end: datetime | None = None
    # A kept group's (``DigestFacts.kept``): the operator's keep, (reason, end as ISO or None:
    # until released).
    keep: tuple[str | None, str | None] | None = None
    # A marked group's (``DigestFacts.marked``, SAFETY.md rule 23): when a later cycle may delete it.
    delete_after: datetime | None = None

    def created_at(self) -> datetime | None:
        """The primary's creation as the listing recorded it; a group without a listed primary
        (leftovers): its oldest resource's. None when the provider reported none."""
        times = {str(r.get("id")): t for r in self.resources if (t := _time(r.get("created_at"))) is not None}
        return listed_creation(times, self.primary_id)

    def doc(self, now: datetime, prices: Prices | None = None) -> dict[str, Any]:
        created = self.created_at()
        since = orphan_since(created, self.owner_end)
        size = size_of(self.resources)
        return {"provider_ref": self.provider_ref, "primary_id": self.primary_id, "region": self.region,
                "reason": self.reason, "first_seen": self.first_seen.isoformat() if self.first_seen else None,
                "resources": [{"kind": r.get("kind"), "id": r.get("id")} for r in self.resources],
                "size": size, "owner_name": self.owner_name,
                "created_at": created.isoformat() if created else None,
                "orphan_since": since.isoformat() if since else None,
                "age_seconds": _seconds(now, created), "orphan_seconds": _seconds(now, since),
                "cost_per_hour": _cost(size, prices),
                **({} if self.keep is None else {"keep_reason": self.keep[0], "kept_until": self.keep[1]}),
                **({} if self.delete_after is None else {"delete_after": self.delete_after.isoformat()})}


def _time(value: Any) -> datetime | None:
    """A listed ``created_at`` (ISO text, as the listing stored it); None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def _seconds(now: datetime, since: datetime | None) -> int | None:
    return None if since is None else max(0, int((now - since).total_seconds()))


def _cost(size: dict[str, Any], prices: Prices | None) -> float | None:
    """The group's cost per hour at ``prices``; None without a price table, or when the
    table prices nothing the group has (an unpriced VM is not a free one)."""
    if prices is None:
        return None
    facts = sum(1 for k in ("instance_type", "disk_gb", "addresses") if size.get(k))
    total, unpriced = cost_per_hour(size, prices)
    return round(total, 6) if facts > len(unpriced) else None


@dataclass(frozen=True)
class DigestFacts:
    """What the ledger says about a finished cycle, read after its STEP 7 committed."""

    backend: str
    provider: str | None
    account: str | None
    cycle_id: str
    mode: str
    outcome: str
    failures: tuple[dict[str, str], ...]
    error: str | None
    now: datetime
    since_clean_seconds: int | None  # since the backend's last clean cycle (or enrolment)
    open_orphans: int
    new_orphans: tuple[DigestGroup, ...] = ()
    deleted: tuple[DigestGroup, ...] = ()
    delete_failed: tuple[DigestGroup, ...] = ()
    # Groups a delete cycle marked (SAFETY.md rule 23), each with its delete_after: listed, news
    # only when new (``new_orphans``).
    marked: tuple[DigestGroup, ...] = ()
    # Groups the cycle found kept by the operator (SAFETY.md rule 23): listed, never news alone.
    kept: tuple[DigestGroup, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)  # per list (new_orphans, deleted, ...), in all
    notify_failures: int = 0  # digests of this backend no channel took since the last one delivered
    missed_cycles: tuple[str, ...] = ()  # the cycles whose digests those were
    prices: Prices | None = None  # the backend's ``settings.prices`` (None: not set, or not valid)


def digest(facts: DigestFacts, interval_seconds: int) -> dict[str, Any] | None:
    """The C6 document, or None for a cycle that deserves none."""
    stale = facts.since_clean_seconds if (
        facts.since_clean_seconds is not None and facts.since_clean_seconds > STALE_INTERVALS * interval_seconds) \
        else None
    eventful = facts.new_orphans or facts.deleted or facts.delete_failed or facts.outcome == "failed" or stale
    if not eventful:
        return None

    def docs(groups: tuple[DigestGroup, ...]) -> list[dict[str, Any]]:
        return [g.doc(facts.now, facts.prices) for g in groups[:MAX_LISTED]]

    return {"type": "orphan-cleanup.cycle", "backend": facts.backend, "provider": facts.provider,
            "account": facts.account, "cycle_id": facts.cycle_id, "mode": facts.mode, "outcome": facts.outcome,
            "new_orphans": docs(facts.new_orphans), "deleted": docs(facts.deleted),
            "delete_failed": docs(facts.delete_failed), "marked": docs(facts.marked), "kept": docs(facts.kept),
            "open_orphans": facts.open_orphans,
            "failures": [{"region": f.get("region"), "error": f.get("error")} for f in facts.failures],
            "stale_seconds": stale, "error": facts.error,
            "counts": {k: facts.counts.get(k, len(getattr(facts, k))) for k in ("new_orphans", "deleted",
                                                                                "delete_failed", "marked", "kept")},
            "notify_failures": facts.notify_failures, "missed_cycles": list(facts.missed_cycles),
            "at": facts.now.isoformat()}


def _span(seconds: int | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _size(size: dict[str, Any]) -> str:
    parts = [str(size["instance_type"])] if "instance_type" in size else []
    if size.get("gpus"):
        parts.append(f"{size['gpus']} GPU")
    if "disk_gb" in size:
        parts.append(f"{size['disk_gb']} GB disk")
    if size.get("addresses"):
        parts.append(f"{len(size['addresses'])} address(es)")
    return ", ".join(parts) or "size unknown"


def _money(value: float) -> str:
    """As ``orphans`` shows a cost: two decimals from 1 up, four below."""
    return f"{value:,.2f}" if value >= 1 else f"{value:.4f}"


def _e(value: Any) -> str:
    """Slack's escaping of a value in message text: ``&``, ``<`` and ``>`` (in this order)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def subject(d: dict[str, Any]) -> str:
    """A one-line summary (the SNS subject: at most 100 characters)."""
    c = d["counts"]
    text = (f"orphan-cleanup {d['backend']}: {d['outcome']}, {c['new_orphans']} new, {c['deleted']} deleted,"
            f" {c['delete_failed']} failed, {d['open_orphans']} open")
    return text[:100]


def slack_text(d: dict[str, Any]) -> str:
    """The digest as a short Slack text: backend, counts, up to ten orphans (ref, id,
    region, owner, age from its creation, how long an orphan, size, cost per hour when
    priced), the ``explain`` command to run, and how many more. Every value is
    escaped (``_e``: Slack's ``&``, ``<``, ``>``), so a name or type from a listing never
    becomes a mention or a link (SAFETY.md rule 22)."""
    c = d["counts"]
    lines = [f"*orphan-cleanup* `{_e(d['backend'])}` ({_e(d['provider'])} {_e(d['account'])}): {_e(d['mode'])} cycle"
             f" `{_e(d['cycle_id'])}` {_e(d['outcome'])}",
             f"{c['new_orphans']} new orphan(s), {c['deleted']} deleted, {c['delete_failed']} failed to delete,"
             f" {d['open_orphans']} open" + (f", {c['marked']} marked" if c.get("marked") else "")
             + (f", {c['kept']} kept by the operator" if c.get("kept") else "")]
    if d["stale_seconds"] is not None:
        lines.append(f"stale: no clean cycle for {_span(d['stale_seconds'])}")
    if d["failures"]:
        lines.append(f"{len(d['failures'])} region(s) failed: "
                     + _e("; ".join(f"{f['region']}: {f['error']}" for f in d["failures"][:3])[:300]))
    if d["notify_failures"]:
        lines.append(f"{d['notify_failures']} earlier digest(s) could not be delivered (orphan-cleanup events)")
    shown: list[tuple[str, dict[str, Any]]] = []
    seen: set[tuple[str, str]] = set()
    for label in ("delete_failed", "marked", "new_orphans", "deleted", "kept"):
        for g in d.get(label, ()):
            key = (g["provider_ref"], g["primary_id"] or g["region"])
            if key not in seen:
                seen.add(key)
                shown.append((label, g))
    tag = {"delete_failed": "failed to delete", "new_orphans": "new", "deleted": "deleted"}

    def why(label: str, g: dict[str, Any]) -> str:
        if label == "marked":
            return f"marked, deleted after {g['delete_after']}"
        if label != "kept":
            return tag[label]
        return f"kept until {g['kept_until'] or 'released'}" + (f": {g['keep_reason']}" if g["keep_reason"] else "")

    for label, g in shown[:SLACK_ORPHANS]:
        age = "age unknown" if g["age_seconds"] is None else f"{_span(g['age_seconds'])} old"
        orphan = "" if g["orphan_seconds"] is None else f", orphan for {_span(g['orphan_seconds'])}"
        cost = "" if g["cost_per_hour"] is None else f", est. {_money(g['cost_per_hour'])}/h"
        lines.append(f"• `{_e(g['provider_ref'])}` {_e(g['primary_id'] or '(leftovers)')} {_e(g['region'])},"
                     f" owner {_e(g['owner_name'] or 'unknown')}, {age}{orphan}, {_e(_size(g['size']))}{cost}:"
                     f" {_e(g['reason'])} ({_e(why(label, g))})")
    # Groups listed but not shown, and those the digest's lists left out (``MAX_LISTED``).
    more = max(0, len(shown) - SLACK_ORPHANS) + sum(max(0, c[k] - len(d.get(k, ()))) for k in c)
    if more:
        lines.append(f"…and {more} more: `orphan-cleanup orphans --backend {_e(d['backend'])}`")
    if shown:
        lines.append(f"why: `orphan-cleanup explain --backend {_e(d['backend'])} {_e(shown[0][1]['provider_ref'])}`")
    return "\n".join(lines)
