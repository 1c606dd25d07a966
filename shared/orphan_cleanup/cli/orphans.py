"""``orphan-cleanup orphans [--backend ID] [--json]``: the open orphans across cycles, their
size as the listing read it and, with a backend's ``prices``, what they cost (README,
"Open orphans and what they cost"). Read-only.

``orphans keep REF --backend ID [--for DURATION] [--reason TEXT]`` and ``orphans release REF
--backend ID``: the operator keeps a ref's groups (protected, ``kept_by_operator``, never
deleted: SAFETY.md rule 23) or ends the keep. They write the ``orphan_keeps`` row and its event,
nothing else."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from orphan_cleanup.cli.events import parse_duration
from orphan_cleanup.cli.exits import EXIT_OK
from orphan_cleanup.cli.output import human_time, print_table, span
from orphan_cleanup.core.costs import Prices, accrued, cost_per_hour, size_of
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.listing import is_valid_ref
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.ledger.watch import OpenOrphan


def _prices(orphan: OpenOrphan, warned: set[str]) -> Prices | None:
    if orphan.prices is None:
        return None
    try:
        return Prices.model_validate(orphan.prices)
    except ValidationError as e:
        if orphan.backend not in warned:
            warned.add(orphan.backend)
            print(f"orphan-cleanup: warning: backend {orphan.backend}: settings.prices ignored:"
                  f" {e.errors()[0]['msg']}", file=sys.stderr)
        return None


def orphan_docs(orphans: list[OpenOrphan]) -> list[dict[str, Any]]:
    """The ``orphans --json`` list (C3): one object per open orphan; ``cost_per_hour`` and
    ``cost_so_far`` when its backend has ``prices`` (a type or kind without a price adds 0)."""
    warned: set[str] = set()
    docs = []
    for o in orphans:
        size = size_of(o.resources)
        doc: dict[str, Any] = {
            "backend": o.backend, "provider_ref": o.provider_ref, "primary_id": o.primary_id, "region": o.region,
            "resources": [{"kind": r.get("kind"), "id": r.get("id")} for r in o.resources], "size": size,
            "first_seen": o.first_seen.isoformat(), "last_seen": o.last_seen.isoformat(),
            "last_action": o.last_action, "reason": o.reason}
        prices = _prices(o, warned)
        if prices is not None:
            per_hour, _ = cost_per_hour(size, prices)
            doc.update(cost_per_hour=round(per_hour, 6), cost_so_far=round(accrued(per_hour, o.open_seconds), 6))
        docs.append(doc)
    return docs


def totals(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per backend: its open orphans, and their summed cost per hour and so far (priced backends)."""
    out: dict[str, dict[str, Any]] = {}
    for d in docs:
        t = out.setdefault(d["backend"], {"open_orphans": 0})
        t["open_orphans"] += 1
        if "cost_per_hour" in d:
            t["cost_per_hour"] = t.get("cost_per_hour", 0.0) + d["cost_per_hour"]
            t["cost_so_far"] = t.get("cost_so_far", 0.0) + d["cost_so_far"]
    return out


def size_text(size: dict[str, Any]) -> str:
    """``p3.2xlarge, 1 GPU, 108 GB disk, 1 address``; ``-`` when nothing is known."""
    parts = []
    if "instance_type" in size:
        parts.append(size["instance_type"])
    if size.get("gpus"):
        parts.append(f"{size['gpus']} GPU" + ("s" if size["gpus"] > 1 else ""))
    if "disk_gb" in size:
        parts.append(f"{size['disk_gb']} GB disk")
    if size.get("addresses"):
        parts.append(", ".join(size["addresses"]))
    return ", ".join(parts) or "-"


def money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}" if value >= 1 else f"{value:.4f}"


#: The longest ``--reason`` kept (it goes into events, digests and Slack texts).
MAX_REASON = 300


def _ref(text: str) -> str:
    if not is_valid_ref(text):
        raise ConfigError(f"{text!r} is not a provider_ref (12 characters, a-z and 0-9)")
    return text


def _until(until: datetime | None) -> str:
    return "released" if until is None else human_time(until)


def keep(db: Database, args: argparse.Namespace) -> int:
    """Keep a recorded ref (one line), and say so when a delete of it is in flight right now."""
    ref = _ref(args.ref)
    seconds = None if args.for_ is None else parse_duration(args.for_, "--for")
    reason = " ".join((args.reason or "").split()) or None
    if reason is not None and len(reason) > MAX_REASON:
        raise ConfigError(f"--reason: at most {MAX_REASON} characters")
    kept = LedgerStore(db).keep_ref(args.backend, ref, reason, seconds)
    print(f"kept ref {ref} of {args.backend} until {_until(kept.until)}" + (f": {reason}" if reason else ""))
    if kept.delete_in_flight_until is not None:
        # The deleter re-reads keeps right before its provider calls (SAFETY.md rule 23).
        gate = human_time(kept.delete_in_flight_until)
        print(f"a delete of ref {ref} is in flight now (its gate holds until {gate}):"
              " the keep protects what that delete has not reached; nothing can recall a provider call already sent")
    return EXIT_OK


def release(db: Database, args: argparse.Namespace) -> int:
    ref = _ref(args.ref)
    released = LedgerStore(db).release_ref(args.backend, ref)
    print(f"released ref {ref} of {args.backend}" + (f" (it was kept: {released.reason})" if released.reason else ""))
    return EXIT_OK


def command(db: Database, args: argparse.Namespace) -> int:
    if args.action == "keep":
        return keep(db, args)
    if args.action == "release":
        return release(db, args)
    if args.backend is not None:
        LedgerStore(db).backend_row(args.backend)  # an unknown backend is bad input (exit 2)
    orphans = LedgerStore(db).open_orphans(args.backend)
    docs = orphan_docs(orphans)
    if args.json:
        print(json.dumps(docs, indent=2))
        return EXIT_OK
    print_table(["backend", "ref", "region", "primary", "size", "first seen", "last action", "reason", "cost/h",
                 "so far"],
                [[d["backend"], d["provider_ref"], d["region"], d["primary_id"] or "-", size_text(d["size"]),
                  human_time(d["first_seen"]), d["last_action"], d["reason"], money(d.get("cost_per_hour")),
                  money(d.get("cost_so_far"))] for d in docs])
    for backend, t in totals(docs).items():
        cost = (f"; est. {money(t['cost_per_hour'])}/h, {money(t['cost_so_far'])} so far (settings.prices)"
                if "cost_per_hour" in t else "")
        print(f"{backend}: {t['open_orphans']} open orphan(s){cost}")
    if docs:
        print(f"why each is an orphan: orphan-cleanup explain --backend {docs[0]['backend']} REF"
              f" (e.g. {docs[0]['provider_ref']}); open for up to {span(int(max(o.open_seconds for o in orphans)))}")
    return EXIT_OK
