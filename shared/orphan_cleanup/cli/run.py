"""``orphan-cleanup run --backend ID [--mode report|delete] [--json] [--yes]``: one cycle now.

Consent before deletion (README, "Running it by hand"): a run whose effective mode is
``delete`` deletes only with consent. With stdin on a terminal (whatever stdout is:
``run ... | tee log`` still asks) it shows its plan on stderr and deletes only once the
operator types the backend id; otherwise it needs ``--yes``, and without it exits 2
before listing. ``--json`` is an output format, never consent. The question waits
``--confirm-timeout`` seconds (10 minutes by default): unanswered, it is declined, so the
cycle ends and frees the backend's lease that its heartbeat would otherwise hold for as long
as the prompt waits, and the run exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from orphan_cleanup.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from orphan_cleanup.cli.output import human_time, print_plan, print_table, verdict_style, write_json_document
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.locked import NO_REASON
from orphan_cleanup.ledger.store import LedgerStore

if TYPE_CHECKING:
    from orphan_cleanup.cycle.plan import Plan


def command(settings: Settings, db: Database, args: argparse.Namespace) -> int:
    """One cycle now; in delete mode only with consent (the module docstring)."""
    from orphan_cleanup.cycle.runner import run_cycle
    from orphan_cleanup.queues.memory import InProcessQueue

    # A removed backend's id runs its retired coverage (SAFETY.md rule 24); unknown: exit 2.
    args.backend, own_mode, retired = LedgerStore(db).run_target(args.backend)
    if retired and args.mode == "delete" and not ((own_mode or settings.mode) == "delete"
                                                    and settings.mode_ceiling == "delete"):
        raise ConfigError(f"run --backend {args.backend} --mode delete: a retired coverage is report-only unless its"
                          " backend's last mode and the stack's ceiling (ORPHAN_CLEANUP_MAX_MODE) both said delete"
                          " (docs/SAFETY.md rule 24): nothing listed")
    confirm = consent(settings, db, args)  # exit 2 here, before anything is listed, without consent
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

    said_once = _SaidByTheRun(args.backend)
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(said_once)
    try:
        # --json streams the groups from the ledger as it prints them (flat memory at any size);
        # the table needs every group for its column widths.
        cycle = run_cycle(pipeline, args.backend, mode=args.mode, progress=progress, confirm=confirm,
                          groups=not args.json)
    except KeyboardInterrupt as e:  # runner.RunInterrupted says what became of the cycle
        print(f"orphan-cleanup: {e or 'interrupted'}", file=sys.stderr, flush=True)
        _leave_calls_in_flight(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    finally:
        for handler in handlers:
            handler.removeFilter(said_once)
    report = cycle.c3()
    notes = {"blocked_reason": cycle.blocked_reason, "error": cycle.error,
             "declined": confirm is not None and confirm.declined}
    if report["outcome"] == "failed":  # why, once, as every error of the CLI: on stderr
        print(f"orphan-cleanup: error: {cycle.error or NO_REASON}", file=sys.stderr)
    if args.json:
        head = {k: v for k, v in report.items() if k != "groups"}
        write_json_document(head, "groups", pipeline.store.report_groups(cycle.cycle_id))
    else:
        print_cycle(report, notes)
    if isinstance(confirm, _Confirmation) and confirm.timed_out:
        return EXIT_BAD_INPUT
    return EXIT_FAILED if report["outcome"] == "failed" else EXIT_OK


def consent(settings: Settings, db: Database, args: argparse.Namespace) -> _Confirmation | _NoConsent | None:
    """How this run may delete: ``None`` with ``--yes``; the operator's answer when stdin
    is a terminal; else nothing at all: a run whose effective mode is ``delete`` is bad
    input (``ConfigError``, exit 2, before listing), and any other run gets a refusal, so
    that a backend switched to delete after this check deletes nothing either."""
    if args.yes:
        return None
    if sys.stdin.isatty():
        return _Confirmation(args.backend, getattr(args, "confirm_timeout", 600))
    why = _deletes_because(settings, db, args)
    if why is not None:
        raise ConfigError(f"run --backend {args.backend} would delete ({why}) and stdin is not a terminal to ask"
                          " on: nothing listed, nothing deleted; add --yes to delete without a prompt")
    return _NoConsent(args.backend)


def _deletes_because(settings: Settings, db: Database, args: argparse.Namespace) -> str | None:
    """Why the run's effective mode is ``delete`` (the flag, the row, the environment),
    or None when it is not (an ``off`` backend is refused by the cycle itself)."""
    own_mode = LedgerStore(db).run_target(args.backend)[1]  # an unknown backend: ConfigError, exit 2
    base = own_mode or settings.mode
    if base == "off":
        return None
    if args.mode is not None:
        return "--mode delete" if args.mode == "delete" else None
    if base != "delete" or settings.mode_ceiling != "delete":
        return None  # a row's (or the stack's) delete under a report ceiling runs report (SAFETY.md rule 8)
    return f"backend {args.backend}'s mode is delete" if own_mode else "ORPHAN_CLEANUP_MODE=delete"


class _SaidByTheRun(logging.Filter):
    """Drops the cycle's own log line of why its listing failed: the run prints that reason
    itself, once (the cycle's ``error``, as ``orphan-cleanup: error:`` on stderr)."""

    MESSAGES = frozenset({"listing failed", "identity check failed"})

    def __init__(self, backend_id: str) -> None:
        super().__init__()
        self.backend_id = backend_id

    def filter(self, record: logging.LogRecord) -> bool:
        details = getattr(record, "details", None)
        return not (record.levelno >= logging.ERROR and record.getMessage() in self.MESSAGES
                    and isinstance(details, dict) and details.get("backend") == self.backend_id)


class _Confirmation:
    """Shows the plan on stderr (the terminal, also when stdout is piped) and accepts it only
    when the operator types the backend id exactly on stdin (anything else, an empty line,
    end of input or no answer within ``timeout`` seconds, deletes nothing)."""

    def __init__(self, backend_id: str, timeout: float = 600) -> None:
        self.backend_id, self.timeout = backend_id, timeout
        self.declined = self.timed_out = False

    def __call__(self, plan: Plan) -> bool:
        print_plan(plan, stream=sys.stderr)
        print(f"Type the backend id ({self.backend_id}) to delete these {len(plan.deletes)} group(s);"
              " anything else deletes nothing: ", end="", file=sys.stderr, flush=True)
        line = self._answer()
        if line is None:
            self.declined = self.timed_out = True
            print(f"\norphan-cleanup: no answer within {self.timeout}s: nothing deleted; the backend"
                  f" {self.backend_id} is free again (--confirm-timeout)", file=sys.stderr, flush=True)
            return False
        if not line.endswith("\n"):
            print(file=sys.stderr)  # end of input: the next output starts on a line of its own
        self.declined = line.rstrip("\n") != self.backend_id
        return not self.declined

    def _answer(self) -> str | None:
        """The line typed on stdin, or None when none came within ``timeout`` seconds (a
        terminal in canonical mode is readable once a whole line, or end of input, is typed)."""
        import select
        import time

        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([sys.stdin], [], [], min(left, 1.0))
            if readable:
                return sys.stdin.readline()


class _NoConsent:
    """A run without a terminal and without ``--yes`` whose cycle came out in delete mode
    anyway (the backend's mode changed after ``consent`` read it): deletes nothing."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self.declined = False

    def __call__(self, plan: Plan) -> bool:
        self.declined = True
        print(f"orphan-cleanup: the cycle of {self.backend_id} runs in delete mode, but this run has no consent"
              " (no terminal, no --yes): nothing deleted", file=sys.stderr, flush=True)
        return False


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
    """The cycle as a table, then counts, the outcome and why (human output of ``run``). A
    failed cycle with no group prints no table; its reason (the cycle's ``error``, which names
    its failed regions) is ``command``'s one stderr line, so no region line repeats it."""
    groups = report["groups"]
    print(f"backend {report['backend']}  mode {report['mode']}  listed at {human_time(report['listed_at'])}"
          f"  cycle {report['cycle_id']}")
    counts = Counter(g["verdict"] for g in groups)
    if groups or report["outcome"] != "failed":
        _print_groups(groups, counts)
    said = " ".join((notes.get("error") or "").split())
    for f in report["failures"]:
        if " ".join(f["error"].split()) not in said:
            print(f"region {f['region']} failed: {f['error']}")
    if notes.get("blocked_reason"):
        print(f"blast-radius cap: deleted nothing: {notes['blocked_reason']}")
    if notes.get("declined"):
        print("nothing deleted: the plan was not confirmed (delete_declined); the orphans stay open")
    print(f"outcome: {verdict_style(report['outcome'])}{_why(report, counts)}")
    if report["mode"] == "report" and counts.get("orphan"):
        print(f"report mode deleted nothing; to delete the orphans: "
              f"orphan-cleanup run --backend {report['backend']} --mode delete")


def _print_groups(groups: list[dict[str, Any]], counts: Counter[str]) -> None:
    """The cycle's groups as a table, then their count by verdict."""

    def others(g: dict[str, Any]) -> str:
        rest = [f"{r['kind']}:{r['id']}" for r in g["resources"] if r["id"] != g["primary_id"]]
        return ", ".join(rest) or "-"

    # The C3 ``detail`` (a controller, a protection, a kept snapshot) gets a column when a group has one.
    details = any(g.get("detail") for g in groups)
    print_table(["ref", "region", "primary", "other resources", "verdict", "reason", "action"]
                + (["detail"] if details else []),
                [[_ref(g), g["region"], g["primary_id"] or "-", others(g), verdict_style(g["verdict"]),
                  g["reason"], g["action"]] + ([g.get("detail") or "-"] if details else []) for g in groups])
    print(f"{len(groups)} group(s)" + (": " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
                                       if counts else ""))


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
    marked = sum(1 for g in report["groups"] if g["action"] == "marked")
    if marked:
        reasons.append(f"{marked} orphan(s) marked, deleted by a cycle after their time (see detail)")
    left = sum(1 for g in report["groups"] if g["verdict"] == "orphan" and g["action"] == "reported")
    if report["mode"] == "delete" and left:
        reasons.append(f"{left} orphan(s) left in place, retried next cycle")
    if report["failures"]:
        reasons.append(f"{len(report['failures'])} region(s) not listed")
    return f" ({'; '.join(reasons)})" if reasons else ""
