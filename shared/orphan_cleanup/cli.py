"""`orphan-cleanup`: migrate, backend add|list, run, status, demo (DESIGN C3).

Exit codes: 0 success (a cycle that finished clean or unsettled), 1 a failed
cycle, 2 bad input (arguments, settings, unknown backend, unreachable database).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from orphan_cleanup.errors import ConfigError, DatabaseError, OrphanCleanupError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUSY = 0, 1, 2, 3
BACKEND_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
AWS_ACCOUNT = re.compile(r"^\d{12}$")
GCP_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
AWS_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
GCP_LOCATION = re.compile(r"^[a-z]+-[a-z]+\d(-[a-z])?$")

EPILOG = """examples:
  orphan-cleanup demo         # the whole product on a fake AWS: no account, no database, ~30 s
  orphan-cleanup migrate      # create or upgrade the tables in $DATABASE_URL
  orphan-cleanup backend add aws-prod --provider aws --account 123456789012 --regions us-east-1,eu-west-1
  orphan-cleanup run --backend aws-prod                  # one cycle in the backend's mode (report by default)
  orphan-cleanup run --backend aws-prod --mode delete --json
  orphan-cleanup status

exit codes:
  0  ok; for run: the cycle finished clean or unsettled
  1  run: the cycle failed (listing raised, credentials reach another account, a deletion failed);
     demo: its self-check failed
  2  bad input: arguments, settings, unknown backend, a backend whose mode is off, database unreachable
  3  run: another live cycle holds the backend's lease

environment: DATABASE_URL (unset: embedded Postgres in ./.orphan-cleanup), ORPHAN_CLEANUP_MODE,
  ORPHAN_CLEANUP_MARGIN_SECONDS, ORPHAN_CLEANUP_INTERVAL_SECONDS, ORPHAN_CLEANUP_MAX_DELETES,
  ORPHAN_CLEANUP_MAX_DELETE_SHARE, AWS_ENDPOINT_URL, ORPHAN_CLEANUP_GCP_ENDPOINT, SENTRY_DSN
  (all of them, with defaults: README.md, "Configuration")"""
RAW = argparse.RawDescriptionHelpFormatter
MIGRATE_EPILOG = """Safe to run twice and from several processes at once.

example:
  DATABASE_URL=postgresql://cleanup@db.internal/platform orphan-cleanup migrate"""
ADD_EPILOG = """examples:
  orphan-cleanup backend add aws-prod --provider aws --account 123456789012 --regions us-east-1,eu-west-1
  orphan-cleanup backend add aws-team --provider aws --account 210987654321 --regions us-east-1 \\
      --mode delete --settings '{"role_arn": "arn:aws:iam::210987654321:role/orphan-cleanup"}'
  orphan-cleanup backend add gcp-main --provider gcp --account my-project --regions us-central1,europe-west4-a

settings keys: tag_key, protect_tag_key, role_arn, external_id, project, credentials_secret,
  margin_seconds, interval_seconds, max_deletes, max_delete_share, max_concurrency"""
RUN_EPILOG = """Lists every region of the backend, joins the listing with the ledger, classifies each
resource group and, in delete mode, deletes the orphans; synchronous. The table goes to
stdout, progress to stderr. --json prints one document (README.md, "Running it by hand").

examples:
  orphan-cleanup run --backend aws-prod                 # report: nothing is deleted
  orphan-cleanup run --backend aws-prod --mode delete
  orphan-cleanup run --backend aws-prod --json | jq '.groups[] | select(.verdict == "orphan")'

exit codes: 0 clean or unsettled, 1 failed, 2 bad input (an off backend included), 3 another cycle holds the backend"""
STATUS_EPILOG = """Per backend: effective mode, last outcome, clean_at (everything before it is known clean),
when the next scheduled cycle is due, and orphans found but not deleted yet.

examples:
  orphan-cleanup status
  orphan-cleanup status --json"""
DEMO_EPILOG = """Starts an embedded Postgres in a temp dir and moto (a fake AWS) on 127.0.0.1, lets a small
platform provision and leak VMs, then runs a report cycle, a delete cycle and one more after
the margin, and checks that only the orphans were deleted. Cleans up after itself.
Needs the dev extras (moto): pip install -e '.[dev]'. Exit 0 when every verdict came out
as expected, 1 otherwise."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # Exit 2 (C3: bad input) with one line; SystemExit(str) would exit 1.
        self.exit(EXIT_BAD_INPUT, f"orphan-cleanup: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orphan-cleanup", description="Find and remove cloud resources your platform lost track of.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("migrate", help="create or upgrade the schema (idempotent)", epilog=MIGRATE_EPILOG,
                   formatter_class=RAW)
    b = sub.add_parser("backend", help="manage backends").add_subparsers(dest="action", required=True,
                                                                         parser_class=_Parser)
    add = b.add_parser("add", help="register a provider account", epilog=ADD_EPILOG, formatter_class=RAW)
    add.add_argument("id", help="your name for it, e.g. aws-prod")
    add.add_argument("--provider", required=True, choices=["aws", "gcp"])
    add.add_argument("--account", required=True, help="AWS account id (12 digits) or GCP project id")
    add.add_argument("--regions", required=True, help="comma-separated regions (GCP: regions or zones)")
    add.add_argument("--mode", choices=["report", "delete", "off"], default=None,
                     help="override ORPHAN_CLEANUP_MODE for this backend")
    add.add_argument("--settings", default=None, help="JSON object of backend settings (tag_key, role_arn, ...)")
    ls = b.add_parser("list", help="list backends", epilog="example: orphan-cleanup backend list --json")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    run = sub.add_parser("run", help="run one full cycle of one backend now", epilog=RUN_EPILOG,
                         formatter_class=RAW)
    run.add_argument("--backend", required=True, help="a backend id (see backend list)")
    run.add_argument("--mode", choices=["report", "delete"], default=None,
                     help="this run only (default: the backend's mode, else ORPHAN_CLEANUP_MODE)")
    run.add_argument("--json", action="store_true", help="print the cycle as one JSON document")
    st = sub.add_parser("status", help="per-backend cleanup state", epilog=STATUS_EPILOG, formatter_class=RAW)
    st.add_argument("--json", action="store_true", help="print a JSON list, one object per backend")
    sub.add_parser("demo", help="see it work: a self-contained demo on moto and an embedded Postgres",
                   epilog=DEMO_EPILOG, formatter_class=RAW)
    return p


def validate_backend(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    if not BACKEND_ID.match(args.id):
        raise ConfigError(f"backend id {args.id!r} must be 1-100 letters, digits, '-', '_', '.', ':'")
    if args.provider == "aws" and not AWS_ACCOUNT.match(args.account):
        raise ConfigError(f"AWS account {args.account!r} must be 12 digits")
    if args.provider == "gcp" and not GCP_PROJECT.match(args.account):
        raise ConfigError(f"GCP project id {args.account!r} is malformed")
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    pattern = AWS_REGION if args.provider == "aws" else GCP_LOCATION
    bad = [r for r in regions if not pattern.match(r)]
    if not regions or bad or len(set(regions)) != len(regions):
        raise ConfigError(f"bad region list {args.regions!r}" + (f": {', '.join(bad)}" if bad else ""))
    settings: dict[str, Any] = {}
    if args.settings:
        try:
            settings = json.loads(args.settings)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--settings is not JSON: {e.msg}") from e
        if not isinstance(settings, dict):
            raise ConfigError("--settings must be a JSON object")
        from pydantic import ValidationError

        from orphan_cleanup.models import BackendSettings
        try:
            BackendSettings.model_validate(settings)
        except ValidationError as e:
            raise ConfigError(f"--settings: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}") from e
    return regions, settings


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        from orphan_cleanup import commands
        return commands.dispatch(args)
    except (ConfigError, DatabaseError) as e:
        print(f"orphan-cleanup: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OrphanCleanupError as e:
        print(f"orphan-cleanup: error: {e}", file=sys.stderr)
        return EXIT_BUSY if getattr(e, "reason", None) == "busy" else EXIT_FAILED
    except KeyboardInterrupt:
        print("orphan-cleanup: interrupted", file=sys.stderr)
        return 130
