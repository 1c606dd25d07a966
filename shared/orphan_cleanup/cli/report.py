"""``orphan-cleanup report [--backend ID] [--since DURATION] [--json] [--html FILE]``: what
leaks cost and how fast they were cleaned over a period (C3; README, "What leaks cost").
Read-only: the figures are aggregated in the database (``ledger/leaks.py``) and priced here
with each backend's ``prices`` (``core.costs.cost_of_hours``: exact, a price being linear in
each size fact)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from orphan_cleanup.cli.events import parse_duration
from orphan_cleanup.cli.exits import EXIT_OK
from orphan_cleanup.cli.output import print_table
from orphan_cleanup.cli.report_figures import duration, hours_text, legend, money, price_tables, report_doc
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore


def print_report(doc: dict[str, Any], backend: str | None, since_text: str) -> None:
    print(f"report {doc['since'][:19].replace('T', ' ')} to {doc['until'][:19].replace('T', ' ')} UTC"
          f" ({since_text}), {f'backend {backend}' if backend else 'every backend'}")
    cost = "" if doc["cost"] is None else f"; est. cost {money(doc['cost'])} (settings.prices)"
    print(f"orphans: {doc['orphans_found']} found, {doc['orphans_deleted']} deleted, {doc['orphans_open']} open"
          f" now; {hours_text(doc['orphan_hours'])} orphan-hours{cost}")
    d, x = doc["time_to_detect_seconds"], doc["time_to_delete_seconds"]
    print(f"time to detect: p50 {duration(d['p50'])}, p90 {duration(d['p90'])};"
          f" time to delete: p50 {duration(x['p50'])}, p90 {duration(x['p90'])}")
    if not doc["by_reason"]:
        print("no orphan lived in this period")
        return
    print()
    print_table(["reason", "orphans", "orphan-hours", "cost"],
                [[r["reason"], str(r["count"]), hours_text(r["orphan_hours"]), money(r["cost"])]
                 for r in doc["by_reason"]])
    print()
    print_table(["backend", "orphans", "orphan-hours", "cost"],
                [[r["backend"], str(r["count"]), hours_text(r["orphan_hours"]), money(r["cost"])]
                 for r in doc["by_backend"]])
    print()
    print("what each reason stands for:")
    causes = legend(r["reason"] for r in doc["by_reason"])
    width = max(len(r) for r, _ in causes)
    for reason, cause in causes:
        print(f"  {reason.ljust(width)}  {cause}")


def show(db: Database, since: str = "30d") -> None:
    """The human report of every backend over ``since`` (the demo's last step)."""
    figures, _ = LedgerStore(db).leak_report(parse_duration(since), None, per_day=False)
    print_report(report_doc(figures, price_tables(figures.prices)), None, since)


def command(db: Database, args: argparse.Namespace) -> int:
    seconds = parse_duration(args.since)
    store = LedgerStore(db)
    figures, days = store.leak_report(seconds, args.backend, per_day=args.html is not None)
    if args.backend is not None and not figures.hours:
        store.backend_row(args.backend)  # a typo is bad input (exit 2); a removed backend's history still shows
    priced = price_tables(figures.prices)
    doc = report_doc(figures, priced)
    if args.html is not None:
        from orphan_cleanup.cli.report_html import write_page

        write_page(args.html, doc, days, priced, backend=args.backend, since_text=args.since)
        print(f"orphan-cleanup: report written to {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_report(doc, args.backend, args.since)
    return EXIT_OK
