"""``orphan-cleanup events [--backend ID] [--since DURATION] [--json]``: the ``events`` table
(README, "The events table"), oldest first. Read-only."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from orphan_cleanup.cli.exits import EXIT_OK
from orphan_cleanup.cli.output import human_time, print_table
from orphan_cleanup.core.backends import MAX_SECONDS
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.ledger.watch import Event

_DURATION = re.compile(r"^\s*(\d{1,9})\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str = "--since") -> int:
    """``90s``, ``30m``, ``6h``, ``7d`` in seconds; anything else (or more than 366 days) is a
    ``ConfigError`` (exit 2) naming ``option``."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{option} {text!r}: not a duration (a number and a unit: 90s, 30m, 6h, 7d)")
    seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if not 0 < seconds <= MAX_SECONDS:
        raise ConfigError(f"{option} {text!r}: must be more than 0 and at most 366d")
    return seconds


def event_doc(e: Event) -> dict[str, Any]:
    """One event as ``events --json`` prints it: the table's columns."""
    return {"id": e.id, "backend": e.backend, "cycle_id": e.cycle_id, "at": e.at.isoformat(), "kind": e.kind,
            "message": e.message, "provider_ref": e.provider_ref, "owner_type": e.owner_type, "owner_id": e.owner_id,
            "owner_name": e.owner_name, "details": e.details}


def command(db: Database, args: argparse.Namespace) -> int:
    since = parse_duration(args.since)
    store = LedgerStore(db)
    found = store.events(since, args.backend)
    if args.backend is not None and not found:
        store.backend_row(args.backend)  # a typo is bad input (exit 2); a removed backend's events still show
    if args.json:
        print(json.dumps([event_doc(e) for e in found], indent=2))
        return EXIT_OK
    print_table(["at", "backend", "kind", "ref", "message"],
                [[human_time(e.at), e.backend, e.kind, e.provider_ref or "-", e.message] for e in found])
    return EXIT_OK
