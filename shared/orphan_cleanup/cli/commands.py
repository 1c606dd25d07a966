"""The CLI commands' bodies; ``cli.py`` parses and maps errors to exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orphan_cleanup.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from orphan_cleanup.cli.output import human_time, print_plan, print_table, verdict_style, write_json_document
from orphan_cleanup.cli.validation import validate_backend
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore

if TYPE_CHECKING:
    from orphan_cleanup.cycle.plan import Plan

# Commands that write: on the embedded database (no DATABASE_URL) they migrate it first,
# the quick start; on a DATABASE_URL only `migrate` runs DDL, they check the version.
WRITES = {("backend", "add"), ("backend", "update"), ("backend", "remove"), ("run", None)}


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from orphan_cleanup.demo import Terminal, run_demo

        # The demo ends with this module's `status`, passed in: the demo never imports the CLI.
        return run_demo(Terminal(show_status=lambda db, settings: print_status(status_rows(db, settings.mode)),
                                 print_table=print_table, verdict_style=verdict_style))
    action = getattr(args, "action", None)
    checked = validate_backend(args) if (args.command, action) == ("backend", "add") else None
    settings = bootstrap.load_settings()  # bad input is reported before any database is started
    if args.command == "migrate":
        from orphan_cleanup.ledger.migrate import migrate

        applied = migrate(bootstrap.open_database(settings))
        print(f"applied {len(applied)} migration(s)"
              + (f": {', '.join(applied)}" if applied else ", schema up to date"))
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
        return bc.show(db, args, settings.mode) if action == "show" else bc.list_(db, args)
    if args.command == "status":
        return status(db, args)
    if args.command == "run":
        return run(settings, db, args)
    raise ConfigError(f"unknown command {args.command}")


def is_embedded(settings: Settings) -> bool:
    """No DATABASE_URL (nor its secret): the CLI's own embedded Postgres."""
    return not (settings.database_url or settings.database_url_secret_arn)


def open_read_only(settings: Settings) -> Database:
    """The database of a read-only command (``status``, ``backend list|show``, ``explain``):
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


def status_rows(db: Database, global_mode: str) -> list[dict[str, Any]]:
    """``status --json``: one document per backend (its mode, else the global one), C3's keys
    and ``running``: the cycle holding the backend's live lease, or null."""
    from orphan_cleanup.cli.backends import running_json

    return [{"backend": r.backend, "provider": r.provider, "mode": r.mode or global_mode,
             "clean_at": _iso(r.clean_at), "last_outcome": r.last_outcome,
             "last_processed_at": _iso(r.last_processed_at), "next_due_at": _iso(r.next_due_at),
             "open_orphans": r.open_orphans, "running": running_json(r.running)} for r in LedgerStore(db).status()]


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
    """The status table, then one line per running cycle (holder, start, lease end)."""
    from orphan_cleanup.cli.backends import running_line

    print_table(["backend", "provider", "mode", "last outcome", "clean_at", "next due", "open orphans"],
                [[r["backend"], r["provider"], r["mode"], verdict_style(r["last_outcome"] or "-"),
                  human_time(r["clean_at"]), human_time(r["next_due_at"], never="-"), str(r["open_orphans"])]
                 for r in rows])
    running = [running_line(r["backend"], r["running"]) for r in rows if r.get("running")]
    if running:
        print("running now:")
        for line in running:
            print(f"  {line}")


def run(settings: Settings, db: Database, args: argparse.Namespace) -> int:
    """One cycle now. On a terminal (stdin and stdout), delete mode shows its plan and
    deletes only once the operator types the backend id (not with ``--yes``/``--json``)."""
    import logging

    from orphan_cleanup.cycle.runner import run_cycle
    from orphan_cleanup.queues.memory import InProcessQueue

    # A manual run's deadline is a short lease that its heartbeat renews (runner.py): a
    # killed run frees its backend within ORPHAN_CLEANUP_LEASE_SECONDS.
    manual = settings.model_copy(update={"cycle_deadline_seconds": settings.lease_seconds})
    pipeline = bootstrap.build_pipeline(manual, db=db, listing_queue=InProcessQueue(),
                                        delete_queue=InProcessQueue())
    # botocore logs a failed credential refresh with its traceback, then raises it to us:
    # the cycle reports that failure in one line.
    logging.getLogger("botocore.credentials").setLevel(logging.ERROR)

    def progress(msg: str) -> None:
        if sys.stderr.isatty() or not args.json:
            print(f"  {msg}", file=sys.stderr, flush=True)

    confirm = _Confirmation(args.backend) if _asks(args) else None
    try:
        # --json streams the groups from the ledger as it prints them (flat memory at any size);
        # the table needs every group for its column widths.
        cycle = run_cycle(pipeline, args.backend, mode=args.mode, progress=progress, confirm=confirm,
                          groups=not args.json)
    except KeyboardInterrupt as e:  # runner.RunInterrupted says what became of the cycle
        print(f"orphan-cleanup: {e or 'interrupted'}", file=sys.stderr, flush=True)
        _leave_calls_in_flight(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    report = cycle.c3()
    notes = {"blocked_reason": cycle.blocked_reason, "error": cycle.error,
             "declined": confirm is not None and confirm.declined}
    for f in report["failures"]:
        if f["region"] == "*":  # the whole cycle failed (identity, ownership): say why on stderr too
            print(f"orphan-cleanup: error: {f['error']}", file=sys.stderr)
    if args.json:
        head = {k: v for k, v in report.items() if k != "groups"}
        write_json_document(head, "groups", pipeline.store.report_groups(cycle.cycle_id))
    else:
        print_cycle(report, notes)
    return EXIT_FAILED if report["outcome"] == "failed" else EXIT_OK




def _asks(args: argparse.Namespace) -> bool:
    """Whether a delete run asks before deleting: on a terminal, without --yes or --json."""
    return not args.json and not args.yes and sys.stdin.isatty() and sys.stdout.isatty()


class _Confirmation:
    """Shows the plan; accepts it only when the operator types the backend id exactly
    (anything else, an empty line or end of input, deletes nothing)."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self.declined = False

    def __call__(self, plan: Plan) -> bool:
        print_plan(plan)
        # On stdout, where the plan is (``input()`` would write its prompt to stderr).
        print(f"Type the backend id ({self.backend_id}) to delete these {len(plan.deletes)} group(s);"
              " anything else deletes nothing: ", end="", flush=True)
        line = sys.stdin.readline()
        if not line.endswith("\n"):
            print()  # end of input: the next output starts on a line of its own
        self.declined = line.rstrip("\n") != self.backend_id
        return not self.declined


def _leave_calls_in_flight(code: int) -> None:
    """Exit at once while provider calls are still in flight in worker threads (their
    cycle is failed, so nothing they bring back applies): the interpreter would join
    the SDK's thread pools (daemon or not) first, up to a read timeout per call.
    Exit handlers (the embedded Postgres, Sentry, logging) run first."""
    import atexit
    import os
    import threading

    if any(t.is_alive() for t in threading.enumerate() if t is not threading.current_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(code)


def print_cycle(report: dict[str, Any], notes: dict[str, Any]) -> None:
    """The cycle as a table, then counts, the outcome and why (human output of ``run``)."""
    groups = report["groups"]
    print(f"backend {report['backend']}  mode {report['mode']}  listed at {human_time(report['listed_at'])}"
          f"  cycle {report['cycle_id']}")

    def others(g: dict[str, Any]) -> str:
        rest = [f"{r['kind']}:{r['id']}" for r in g["resources"] if r["id"] != g["primary_id"]]
        return ", ".join(rest) or "-"

    # The C3 ``detail`` (a controller, a protection, a kept snapshot) gets a column when a group has one.
    details = any(g.get("detail") for g in groups)
    print_table(["ref", "region", "primary", "other resources", "verdict", "reason", "action"]
                + (["detail"] if details else []),
                [[_ref(g), g["region"], g["primary_id"] or "-", others(g), verdict_style(g["verdict"]),
                  g["reason"], g["action"]] + ([g.get("detail") or "-"] if details else []) for g in groups])
    counts = Counter(g["verdict"] for g in groups)
    print(f"{len(groups)} group(s)" + (": " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
                                       if counts else ""))
    for f in report["failures"]:
        print(f"region {f['region']} failed: {f['error']}")
    if notes.get("blocked_reason"):
        print(f"blast-radius cap: deleted nothing: {notes['blocked_reason']}")
    if notes.get("declined"):
        print("nothing deleted: the plan was not confirmed (delete_declined); the orphans stay open")
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
    left = sum(1 for g in report["groups"] if g["verdict"] == "orphan" and g["action"] == "reported")
    if report["mode"] == "delete" and left:
        reasons.append(f"{left} orphan(s) left in place, retried next cycle")
    if report["failures"]:
        reasons.append(f"{len(report['failures'])} region(s) not listed")
    return f" ({'; '.join(reasons)})" if reasons else ""
