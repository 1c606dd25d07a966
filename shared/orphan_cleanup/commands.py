"""The CLI commands' bodies; ``cli.py`` parses and maps errors to exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import datetime
from typing import Any

from orphan_cleanup import bootstrap
from orphan_cleanup.cli import EXIT_FAILED, EXIT_OK, validate_backend
from orphan_cleanup.errors import ConfigError
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.models import BackendSettings
from orphan_cleanup.output import human_time, print_table, verdict_style
from orphan_cleanup.settings import Settings

SECRET_SETTINGS = {"credentials_json"}


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from orphan_cleanup.demo import run_demo

        # The demo ends with this module's `status`, passed in: the demo never imports the CLI.
        return run_demo(show_status=lambda db, settings: print_status(status_rows(db, settings.mode)))
    if args.command == "backend" and args.action == "add":
        validate_backend(args)  # bad input is reported before any database is started
    settings = bootstrap.load_settings()
    db = bootstrap.open_database(settings, run_migrations=args.command != "migrate")
    if args.command == "migrate":
        from orphan_cleanup.ledger.migrate import migrate

        applied = migrate(db)
        print(f"applied {len(applied)} migration(s)"
              + (f": {', '.join(applied)}" if applied else ", schema up to date"))
        return EXIT_OK
    if args.command == "backend":
        return backend_add(db, args) if args.action == "add" else backend_list(db, args)
    if args.command == "status":
        return status(db, args)
    if args.command == "run":
        return run(settings, db, args)
    raise ConfigError(f"unknown command {args.command}")


def backend_add(db: Database, args: argparse.Namespace) -> int:
    regions, settings = validate_backend(args)
    LedgerStore(db).add_backend(backend_id=args.id, provider=args.provider, account=args.account,
                                regions=regions, settings=BackendSettings.model_validate(settings), mode=args.mode)
    print(f"added backend {args.id} ({args.provider} {args.account}, regions {', '.join(regions)})")
    return EXIT_OK


def backend_list(db: Database, args: argparse.Namespace) -> int:
    backends = LedgerStore(db).backends()
    if args.json:
        print(json.dumps([b.model_dump(mode="json", exclude={"settings": SECRET_SETTINGS}) for b in backends],
                         indent=2))
        return EXIT_OK
    print_table(["backend", "provider", "account", "regions", "mode"],
                [[b.id, b.provider, b.account, ",".join(b.regions), b.mode or "(global)"] for b in backends])
    return EXIT_OK


def _iso(v: datetime | None) -> str | None:
    return v.isoformat() if v else None


def status_rows(db: Database, global_mode: str) -> list[dict[str, Any]]:
    """``status --json``: one document per backend (its mode, else the global one)."""
    return [{"backend": r.backend, "provider": r.provider, "mode": r.mode or global_mode,
             "clean_at": _iso(r.clean_at), "last_outcome": r.last_outcome,
             "last_processed_at": _iso(r.last_processed_at), "next_due_at": _iso(r.next_due_at),
             "open_orphans": r.open_orphans} for r in LedgerStore(db).status()]


def status(db: Database, args: argparse.Namespace) -> int:
    rows = status_rows(db, bootstrap.load_settings().mode)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no backends yet: orphan-cleanup backend add ID --provider aws|gcp --account A --regions r1,r2")
        return EXIT_OK
    print_status(rows)
    return EXIT_OK


def print_status(rows: list[dict[str, Any]]) -> None:
    print_table(["backend", "provider", "mode", "last outcome", "clean_at", "next due", "open orphans"],
                [[r["backend"], r["provider"], r["mode"], verdict_style(r["last_outcome"] or "-"),
                  human_time(r["clean_at"]), human_time(r["next_due_at"], never="-"), str(r["open_orphans"])]
                 for r in rows])


def run(settings: Settings, db: Database, args: argparse.Namespace) -> int:
    from orphan_cleanup.queues.memory import InProcessQueue
    from orphan_cleanup.runner import run_cycle

    pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                        delete_queue=InProcessQueue())

    def progress(msg: str) -> None:
        if sys.stderr.isatty() or not args.json:
            print(f"  {msg}", file=sys.stderr, flush=True)

    cycle = run_cycle(pipeline, args.backend, mode=args.mode, progress=progress)
    report = cycle.c3()
    notes = {"blocked_reason": cycle.blocked_reason, "error": cycle.error}
    for f in report["failures"]:
        if f["region"] == "*":  # the whole cycle failed (identity, ownership): say why on stderr too
            print(f"orphan-cleanup: error: {f['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_cycle(report, notes)
    return EXIT_FAILED if report["outcome"] == "failed" else EXIT_OK


def print_cycle(report: dict[str, Any], notes: dict[str, Any]) -> None:
    """The cycle as a table, then counts, the outcome and why (human output of ``run``)."""
    groups = report["groups"]
    print(f"backend {report['backend']}  mode {report['mode']}  listed at {human_time(report['listed_at'])}"
          f"  cycle {report['cycle_id']}")

    def others(g: dict[str, Any]) -> str:
        rest = [f"{r['kind']}:{r['id']}" for r in g["resources"] if r["id"] != g["primary_id"]]
        return ", ".join(rest) or "-"

    print_table(["ref", "region", "primary", "other resources", "verdict", "reason", "action"],
                [[_ref(g), g["region"], g["primary_id"] or "-", others(g), verdict_style(g["verdict"]),
                  g["reason"], g["action"]] for g in groups])
    counts = Counter(g["verdict"] for g in groups)
    print(f"{len(groups)} group(s)" + (": " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
                                       if counts else ""))
    for f in report["failures"]:
        print(f"region {f['region']} failed: {f['error']}")
    if notes.get("blocked_reason"):
        print(f"blast-radius cap: deleted nothing: {notes['blocked_reason']}")
    if notes.get("error"):
        print(f"error: {notes['error']}")
    print(f"outcome: {verdict_style(report['outcome'])}{_why(report, counts)}")
    if report["mode"] == "report" and counts.get("orphan"):
        print(f"report mode deleted nothing; to delete the orphans: "
              f"orphan-cleanup run --backend {report['backend']} --mode delete")


def _ref(g: dict[str, Any]) -> str:
    # A malformed value is shown quoted, so an empty or odd one is visible as such.
    return json.dumps(g["provider_ref"]) if g["reason"] == "malformed_ref" else g["provider_ref"]


def _why(report: dict[str, Any], counts: Counter[str]) -> str:
    if report["outcome"] == "clean":
        return " (clean_at advances to the listing time minus the margin)"
    reasons = []
    if counts.get("skipped"):
        reasons.append(f"{counts['skipped']} group(s) skipped, retried next cycle")
    deleting = sum(1 for g in report["groups"] if g["action"] == "deleting")
    if deleting:
        reasons.append(f"{deleting} deletion(s) still in progress")
    failed = sum(1 for g in report["groups"] if g["action"] == "delete_failed")
    if failed:
        reasons.append(f"{failed} deletion(s) failed")
    if report["failures"]:
        reasons.append(f"{len(report['failures'])} region(s) not listed")
    return f" ({'; '.join(reasons)})" if reasons else ""
