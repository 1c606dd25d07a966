"""The CLI commands' bodies (``run``: ``cli/run.py``); ``cli/app.py`` parses and maps errors to exit codes."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from orphan_cleanup.cli.exits import EXIT_OK
from orphan_cleanup.cli.output import human_time, print_table, span, verdict_style
from orphan_cleanup.cli.validation import validate_backend
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore

# Commands that write: on the embedded database (no DATABASE_URL) they migrate it first,
# the quick start; on a DATABASE_URL only `migrate` runs DDL, they check the version.
WRITES = {("backend", "add"), ("backend", "update"), ("backend", "remove"), ("backend", "forget-coverage"),
          ("run", None), ("orphans", "keep"), ("orphans", "release")}


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from orphan_cleanup.cli import report
        from orphan_cleanup.demo import Terminal, run_demo

        # The demo ends with this module's `status` and `report`, passed in: the demo never imports the CLI.
        return run_demo(Terminal(show_status=lambda db, settings: print_status(
            status_rows(db, settings.mode, settings.stuck_pending_seconds, settings.mode_ceiling)),
                                 print_table=print_table, verdict_style=verdict_style,
                                 show_report=lambda db: report.show(db, "1d")),
                        verbose=args.verbose)
    action = getattr(args, "action", None)
    checked = validate_backend(args) if (args.command, action) == ("backend", "add") else None
    settings = bootstrap.load_settings()  # bad input is reported before any database is started
    if args.command == "migrate":
        from orphan_cleanup.ledger.grants import RoleNames
        from orphan_cleanup.ledger.migrate import migrate_and_grant

        roles = None if args.skip_grants else RoleNames(
            owner=args.owner_role, runtime=args.runtime_role, lister=args.lister_role,
            classifier=args.classifier_role, deleter=args.deleter_role, definer=args.definer_role)
        applied, granted = migrate_and_grant(bootstrap.open_database(settings), roles)
        print(f"applied {len(applied)} migration(s)"
              + (f": {', '.join(applied)}" if applied else ", schema up to date")
              + (f"; granted {', '.join(granted)} what they need (roles.sql's grants)" if granted else ""))
        return EXIT_OK
    if args.command == "psql":
        from orphan_cleanup.cli.psql import run_psql

        return run_psql(bootstrap.open_database(settings).info, args.psql_args)
    db = open_for_writing(settings) if (args.command, action) in WRITES else open_read_only(settings)
    if args.command == "backend":
        from orphan_cleanup.cli import backends as bc

        if checked is not None:
            return bc.add(db, args, *checked)
        if action == "update":
            return bc.update(db, args)
        if action == "remove":
            return bc.remove(db, args)
        if action == "forget-coverage":
            return bc.forget_coverage(db, args)
        return bc.show(db, args, settings) if action == "show" else bc.list_(db, args)
    if args.command == "status":
        return status(db, args)
    if args.command == "orphans":
        from orphan_cleanup.cli import orphans

        return orphans.command(db, args)
    if args.command == "events":
        from orphan_cleanup.cli import events

        return events.command(db, args)
    if args.command == "report":
        from orphan_cleanup.cli import report

        return report.command(db, args)
    if args.command == "run":
        from orphan_cleanup.cli import run

        return run.command(settings, db, args)
    raise ConfigError(f"unknown command {args.command}")


def is_embedded(settings: Settings) -> bool:
    """No DATABASE_URL (nor its secret): the CLI's own embedded Postgres."""
    return not (settings.database_url or settings.database_url_secret_arn)


def open_read_only(settings: Settings) -> Database:
    """The database of a read-only command (``status``, ``backend list|show``, ``explain``,
    ``orphans``, ``events``, ``report``):
    never migrated; ``SchemaNotMigrated`` (exit 2, one line) unless it has every migration."""
    from orphan_cleanup.ledger.migrate import require_current_schema

    db = bootstrap.open_database(settings)
    require_current_schema(db)
    return db


def open_for_writing(settings: Settings) -> Database:
    """The database of a command that writes (``backend add|update|remove``, ``run``): the
    embedded one is migrated (a quick start with nothing to set up; the product owns it);
    a DATABASE_URL is the platform's, where schema changes are the operator's explicit
    step (``migrate``, with the owner role): checked like a read-only command's."""
    if is_embedded(settings):
        return bootstrap.open_database(settings, run_migrations=True)
    return open_read_only(settings)


def _iso(v: datetime | None) -> str | None:
    return v.isoformat() if v else None


def status_rows(db: Database, global_mode: str, stuck_after: int = 3600,
                ceiling: str = "delete") -> list[dict[str, Any]]:
    """``status --json``: one document per backend (its mode, else the global one, under the
    stack's ceiling ``ceiling``: SAFETY.md rule 8), C3's keys,
    ``running``: the cycle holding the backend's live lease, or null, ``stuck_pending``:
    owners pending longer than ``stuck_after`` seconds whose resources its latest cycle skipped,
    and ``stale_seconds``: the time since its last clean cycle (since it was enrolled when it
    never had one; null for a backend that is off or not enrolled)."""
    from orphan_cleanup.cli.backends import running_json

    store = LedgerStore(db)
    stuck: dict[str, list[dict[str, Any]]] = {}
    for p in store.stuck_pending(stuck_after):
        stuck.setdefault(p.backend_id, []).append(
            {"provider_ref": p.provider_ref, "owner_id": p.owner_id, "owner_name": p.owner_name,
             "created_at": _iso(p.created_at), "pending_seconds": p.pending_seconds, "region": p.region,
             "primary_id": p.primary_id, "cycle_id": p.cycle_id})
    stale = {s.backend: s.stale_seconds for s in store.staleness(global_mode)}

    def mode(row_mode: str | None) -> str:
        m = row_mode or global_mode
        return "report" if m == "delete" and ceiling == "report" else m

    return [{"backend": r.retired_from or r.backend, "retired": r.retired_from is not None,
             "coverage": r.backend if r.retired_from else None, "account": r.account, "regions": list(r.regions),
             "failing_since": _iso(r.failing_since), "provider": r.provider, "mode": mode(r.mode),
             "clean_at": _iso(r.clean_at), "last_outcome": r.last_outcome,
             "last_processed_at": _iso(r.last_processed_at), "next_due_at": _iso(r.next_due_at),
             "open_orphans": r.open_orphans, "last_error": r.last_error, "last_failed_at": _iso(r.last_failed_at),
             "running": running_json(r.running),
             "stuck_pending": stuck.get(r.backend, []), "stale_seconds": stale.get(r.backend)}
            for r in store.status()]


def status(db: Database, args: argparse.Namespace) -> int:
    settings = bootstrap.load_settings()
    rows = status_rows(db, settings.mode, settings.stuck_pending_seconds, settings.mode_ceiling)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no backends yet: orphan-cleanup backend add ID --provider aws|gcp --account A --regions r1,r2")
        return EXIT_OK
    print_status(rows)
    return EXIT_OK


def _row_name(row: dict[str, Any]) -> str:
    """A status row's name: the backend's id, or a retired coverage's own (SAFETY.md rule 24)."""
    return row["coverage"] if row.get("retired") else row["backend"]


def retired_line(row: dict[str, Any]) -> str:
    """Why a retired coverage (SAFETY.md rule 24) is still listed, in one line."""
    head = (f"{row['coverage']}: retired from {row['backend']} ({row['provider']} {row['account']},"
            f" {','.join(row['regions'])}): {row['open_orphans']} open orphan{'s' if row['open_orphans'] != 1 else ''}")
    if row["mode"] == "off":
        return (f"{head}; off (its backend's mode): not listed; drop it once nothing of {row['backend']} is left"
                f" there: orphan-cleanup backend forget-coverage {row['coverage']}")
    if row["last_outcome"] == "failed":
        return (f"{head}, cycles failing since {human_time(row['failing_since'], never='?')}"
                f" ({row.get('last_error') or 'no reason recorded'}); fix its credentials, or drop it:"
                f" orphan-cleanup backend forget-coverage {row['coverage']}")
    if row["last_outcome"] is None:
        return f"{head}, not listed yet; it stays until two clean cycles there find nothing of {row['backend']}"
    return f"{head}; it stays until two clean cycles in a row there find nothing of {row['backend']}"


def print_status(rows: list[dict[str, Any]]) -> None:
    """The status table, then why each backend whose latest cycle failed failed (C3), the
    open orphans and the stalest backend, one line per running cycle (holder, start, lease
    end), and the stuck pending owners."""
    from orphan_cleanup.cli.backends import running_line

    print_table(["backend", "provider", "mode", "last outcome", "clean_at", "next due", "open orphans"],
                [[_row_name(r), r["provider"], r["mode"], verdict_style(r["last_outcome"] or "-"),
                  human_time(r["clean_at"]), human_time(r["next_due_at"], never="-"), str(r["open_orphans"])]
                 for r in rows])
    for r in rows:
        if r["last_outcome"] == "failed" and r.get("last_error"):
            print(f"{_row_name(r)} failed {human_time(r['last_failed_at'], never='?')}: {r['last_error']}")
    for r in rows:
        if r["retired"]:
            print(retired_line(r))
    # The stalest: a backend never clean (failed, unsettled) before any that was clean once,
    # then the longest without a clean cycle (README, "When one fires").
    stale = [r for r in rows if r.get("stale_seconds") is not None]
    stalest = max(stale, key=lambda r: (r["clean_at"] is None, r["stale_seconds"]), default=None)
    total = sum(r["open_orphans"] for r in rows)
    if total or stalest:  # nothing to say before any backend is enrolled
        print(f"open orphans: {total} (orphan-cleanup orphans)" + ("" if stalest is None else (
            f"; stalest backend: {_row_name(stalest)}, "
            + (f"no clean cycle for {span(stalest['stale_seconds'])}" if stalest["clean_at"] else
               f"never clean ({stalest['last_outcome'] or 'no cycle yet'}, enrolled"
               f" {span(stalest['stale_seconds'])} ago)"))))
    running = [running_line(_row_name(r), r["running"]) for r in rows if r.get("running")]
    if running:
        print("running now:")
        for line in running:
            print(f"  {line}")
    stuck = [(_row_name(r), p) for r in rows for p in r.get("stuck_pending", [])]
    if stuck:
        print("stuck pending owners (their resources are skipped every cycle, so clean_at cannot advance;"
              " reap them: README, \"Stale pending owners\"):")
        print_table(["backend", "ref", "owner", "pending for", "region", "primary"],
                    [[b, p["provider_ref"], p["owner_id"] + (f" {json.dumps(p['owner_name'])}" if p["owner_name"]
                                                           else ""),
                      span(p["pending_seconds"]), p["region"], p["primary_id"] or "-"] for b, p in stuck], indent=2)
