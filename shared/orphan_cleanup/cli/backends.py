"""``backend add|list|show|update|remove|forget-coverage``: the bodies; ``cli.py`` parses, ``commands.dispatch``
opens the database (read-only for list and show) and calls them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from orphan_cleanup.cli import validation
from orphan_cleanup.cli.exits import EXIT_BAD_INPUT, EXIT_OK
from orphan_cleanup.cli.output import human_time, print_fields, print_table, verdict_style
from orphan_cleanup.core.backends import BackendSettings
from orphan_cleanup.core.errors import BackendBusy, ConfigError
from orphan_cleanup.core.policy import effective_mode, environment_variable, ignored_settings, setting_sources
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.reports import BackendRow, RunningCycle
from orphan_cleanup.ledger.store import LedgerStore

SECRET_SETTINGS = {"credentials_json"}
HIDDEN = "(set, hidden)"


def add(db: Database, args: argparse.Namespace, regions: list[str], settings: dict[str, Any]) -> int:
    LedgerStore(db).add_backend(backend_id=args.id, provider=args.provider, account=args.account,
                                regions=regions, settings=BackendSettings.from_input(settings), mode=args.mode)
    print(f"added backend {args.id} ({args.provider} {args.account}, regions {', '.join(regions)})")
    return EXIT_OK


def _unused(settings: dict[str, Any]) -> dict[str, Any]:
    """The keys a platform stored for itself: kept, never read by orphan-cleanup."""
    return {k: v for k, v in settings.items() if k not in BackendSettings.model_fields}


def _hide(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: HIDDEN if k in SECRET_SETTINGS and v is not None else v for k, v in settings.items()}


def _row_json(row: BackendRow) -> dict[str, Any]:
    if row.backend is not None:
        return {**row.backend.model_dump(mode="json", exclude={"settings": SECRET_SETTINGS}), "error": None}
    return {"id": row.id, "provider": row.provider, "account": row.account, "regions": list(row.regions),
            "settings": {k: v for k, v in row.settings.items() if k not in SECRET_SETTINGS}, "mode": row.mode,
            "error": row.error}


def list_(db: Database, args: argparse.Namespace) -> int:
    """Every backend; a misconfigured row is listed too, marked, and named on stderr."""
    rows = LedgerStore(db).backend_rows()
    for row in rows:
        if row.error:
            print(f"orphan-cleanup: warning: {row.error}", file=sys.stderr)
    if args.json:
        print(json.dumps([_row_json(r) for r in rows], indent=2))
        return EXIT_OK
    headers = ["backend", "provider", "account", "regions", "mode"]
    bad = any(r.error for r in rows)
    print_table(headers + (["config"] if bad else []),
                [[r.id, r.provider, r.account, ",".join(r.regions), r.mode or "(global)"]
                 + (["misconfigured" if r.error else "ok"] if bad else []) for r in rows])
    return EXIT_OK


def show(db: Database, args: argparse.Namespace, process: Settings) -> int:
    """One backend: its row, effective settings (and where each comes from), the platform's
    own keys, status (with the latest failed cycle's reason and the last cycle's region
    failures), running cycle."""
    store = LedgerStore(db)
    row = store.backend_row(args.id)
    status = store.status(args.id)[0]
    sources = _of_provider(row.provider, setting_sources(process, row.backend, row.settings)) if row.backend \
        else None
    effective = None if sources is None else _hide(
        {k: _json_value(v) for k, (v, _) in sources.items()})
    # the row's limits that would loosen the stack's: kept as stored, not used (SAFETY.md rule 8)
    ignored = ignored_settings(process, row.backend) if row.backend else {}
    doc = {"id": row.id, "provider": row.provider, "account": row.account, "regions": list(row.regions),
           "mode": row.mode, "effective_mode": _effective_mode(process, row),
           "settings": _hide({k: v for k, v in row.settings.items() if k in BackendSettings.model_fields}),
           "effective_settings": effective,
           "setting_sources": None if sources is None else {k: src for k, (_, src) in sources.items()},
           "ignored_settings": {k: {"value": i.value, "stack": i.stack, "why": i.why} for k, i in ignored.items()},
           "unused_settings": _unused(row.settings),
           "status": {"clean_at": _iso(status.clean_at), "last_outcome": status.last_outcome,
                      "last_processed_at": _iso(status.last_processed_at), "next_due_at": _iso(status.next_due_at),
                      "open_orphans": status.open_orphans, "last_error": status.last_error,
                      "last_failed_at": _iso(status.last_failed_at),
                      "failures": [f.model_dump() for f in status.failures]},
           "running": running_json(status.running), "error": row.error}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_show(doc, row)
    if row.error:
        print(f"orphan-cleanup: error: {row.error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _print_show(doc: dict[str, Any], row: BackendRow) -> None:
    own = "its own" if doc["mode"] else "ORPHAN_CLEANUP_MODE: the backend has none of its own"
    if "mode" in doc["ignored_settings"]:
        own = doc["ignored_settings"]["mode"]["why"]
    print_fields([("backend", doc["id"]), ("provider", doc["provider"]), ("account", doc["account"]),
                  ("regions", ", ".join(doc["regions"]) or "(none)"), ("mode", f"{doc['effective_mode']} ({own})")])
    print("settings:")
    if doc["effective_settings"] is None:  # the model refuses the row: the known keys as stored
        print_fields([(k, json.dumps(v)) for k, v in doc["settings"].items()] or [("(none set)", "")], indent=2)
    else:
        sources, ignored = doc["setting_sources"], doc["ignored_settings"]
        print_fields([(k, f"{_shown(v)}  ({_source(k, sources[k])}"
                          + (f"; {ignored[k]['why']}" if k in ignored else "") + ")")
                      for k, v in doc["effective_settings"].items()], indent=2)
        if "environment" in sources.values():
            print("  (environment: this shell's variables; the deployed functions read their own)")
    if doc["unused_settings"]:
        print("not used by orphan-cleanup (the platform's own keys, kept as stored):")
        print_fields([(k, json.dumps(v)) for k, v in doc["unused_settings"].items()], indent=2)
    s, run = doc["status"], doc["running"]
    print("status:")
    print_fields([("last outcome", verdict_style(s["last_outcome"] or "-")), ("clean_at", human_time(s["clean_at"])),
                  ("next due", human_time(s["next_due_at"], never="-")), ("open orphans", str(s["open_orphans"])),
                  ("running", _running_text(run) if run else "no cycle")]
                 + ([("last failure", f"{human_time(s['last_failed_at'], never='?')}: {s['last_error']}")]
                    if s["last_error"] else []), indent=2)
    said = s["last_error"] if s["last_outcome"] == "failed" else None
    unsaid = [f for f in s["failures"] if not said or " ".join(f["error"].split()) not in said]
    if unsaid:  # the region failures the last failure line does not already say
        print("the last cycle's region failures:")
        print_fields([(f["region"], f["error"]) for f in unsaid], indent=2)
    if row.error:
        print(f"problem: {row.error}")


#: Settings only one provider reads (README.md, "Per-backend settings": "AWS: ...", "GCP: ...").
PROVIDER_ONLY = {"aws": frozenset({"role_arn", "delete_role_arn", "external_id", "max_concurrency",
                                   "controller_tag_keys"}),
                 "gcp": frozenset({"project", "credentials_json", "credentials_file"})}


def _of_provider(provider: str, sources: dict[str, tuple[Any, str]]) -> dict[str, tuple[Any, str]]:
    """The settings of ``provider``'s backends: another provider's keys are left out, unless
    the row sets one (shown as stored, so nothing the row holds is hidden)."""
    foreign = frozenset().union(*(keys for p, keys in PROVIDER_ONLY.items() if p != provider))
    return {k: v for k, v in sources.items() if k not in foreign or v[1] == "backend"}


def _effective_mode(process: Settings, row: BackendRow) -> str:
    """The mode a scheduled cycle of this row runs in: the row's or the stack's, under the
    stack's ceiling (SAFETY.md rule 8); a row the model refuses, as stored."""
    if row.backend is None:
        return row.mode or process.mode
    return effective_mode(process, row.backend)


def _json_value(v: Any) -> Any:
    if hasattr(v, "model_dump"):  # a nested model (``prices``)
        return v.model_dump(mode="json", exclude_defaults=True)
    return list(v) if isinstance(v, tuple) else v


def _shown(v: Any) -> str:
    if v is None:
        return "none"
    return json.dumps(v) if isinstance(v, (list, bool, dict)) else str(v)


def _source(key: str, source: str) -> str:
    if source == "environment":
        return f"environment: {environment_variable(key)}"
    if source == "default" and key == "delete_role_arn":
        return "default: role_arn"
    if source == "default" and key == "project":
        return "default: the account"
    if source == "default" and environment_variable(key):
        return f"default of {environment_variable(key)}"
    return source


def update(db: Database, args: argparse.Namespace) -> int:
    """Change what is given, checked as a whole by the model; only ``--mode`` while a cycle runs."""
    patch = validation.parse_settings(args.settings) if args.settings is not None else None
    replacement = validation.parse_settings(args.settings_replace, "--settings-replace") \
        if args.settings_replace is not None else None
    if args.account is None and args.regions is None and args.mode is None and patch is None \
            and replacement is None:
        raise ConfigError("nothing to update: give --account, --regions, --mode, --settings or --settings-replace")
    if args.regions is not None:
        validation.known_aws_regions()  # botocore's data loads once, before the row is locked
    before: list[BackendRow] = []

    def edit(current: BackendRow, running: RunningCycle | None) -> BackendRow:
        before.append(current)
        provider = current.provider
        account = current.account if args.account is None else validation.check_account(provider, args.account)
        regions = current.regions if args.regions is None else tuple(validation.parse_regions(provider, args.regions))
        mode = current.mode if args.mode is None else (None if args.mode == "none" else args.mode)
        settings = replacement if replacement is not None else \
            validation.merge_settings(current.settings, patch) if patch is not None else current.settings
        validation.checked_backend(current.id, provider, account, regions, settings, mode)
        if running is not None and (account, regions, settings) != (current.account, current.regions,
                                                                    current.settings):
            raise BackendBusy(f"backend {current.id}: cycle {running.cycle_id} is running (lease until"
                              f" {human_time(running.lease_expires_at)}): only --mode may change now;"
                              " retry when it ends")
        return dataclasses.replace(current, account=account, regions=regions, settings=settings, mode=mode,
                                   backend=None, error=None)

    after = LedgerStore(db).update_backend(args.id, edit)
    changes = _changes(before[0], after)
    print(f"updated backend {args.id}: {'; '.join(changes)}" if changes else f"backend {args.id}: nothing changed")
    dropped = sorted(set(_unused(before[0].settings)) - set(after.settings))
    if dropped:
        print(f"dropped keys not used by orphan-cleanup: {', '.join(dropped)}")
    return EXIT_OK


def _changes(old: BackendRow, new: BackendRow) -> list[str]:
    out = []
    if old.account != new.account:
        out.append(f"account {old.account} -> {new.account}")
    if old.regions != new.regions:
        out.append(f"regions {','.join(old.regions)} -> {','.join(new.regions)}")
    if old.mode != new.mode:
        out.append(f"mode {old.mode or '(global)'} -> {new.mode or '(global)'}")
    keys = sorted(set(old.settings) | set(new.settings))
    edits = [("+" if k not in old.settings else "-" if k not in new.settings else "~") + k
             for k in keys if old.settings.get(k, _MISSING) != new.settings.get(k, _MISSING)]
    if edits:
        out.append(f"settings {' '.join(edits)}")
    return out


_MISSING = object()


def remove(db: Database, args: argparse.Namespace) -> int:
    removal = LedgerStore(db).remove_backend(args.id, force=args.force)
    print(f"removed backend {args.id}: no cycle of it runs any more"
          + (f"; its running cycle {removal.fenced_cycle} was stopped (nothing of it applies now)"
             if removal.fenced_cycle else ""))
    cov = removal.coverage
    if cov is not None:
        print(f"still listed: retired coverage {cov.id} ({cov.provider} {cov.account}, {','.join(cov.regions)},"
              f" mode {cov.mode or 'of the stack'}, never loosened) until clean cycles there find nothing of"
              f" {args.id} (docs/SAFETY.md rule 24); to stop it now: orphan-cleanup backend forget-coverage {cov.id}")
    print(f"kept for audit: {removal.cycles_kept} cycle(s), {removal.orphans_kept} orphan record(s), its events")
    if removal.owners_naming_it:
        print(f"note: {removal.owners_naming_it} live owner(s) in instances or volumes still name {args.id}:"
              + (f" they are judged in {removal.coverage.account} as before while {removal.coverage.id} lasts;"
                 if removal.coverage else "")
              + " with no coverage of it left, other backends skip their resources (never delete them) until"
              " they name a known backend")
    return EXIT_OK


def forget_coverage(db: Database, args: argparse.Namespace) -> int:
    """Drop a retired coverage (SAFETY.md rule 24) with the operator's consent: typed on a
    terminal, else ``--yes`` (exit 2 without either, before anything changes)."""
    store = LedgerStore(db)
    cov = store.retired_coverage(args.id)  # unknown: ConfigError, exit 2
    what = (f"retired coverage {cov.id} of backend {cov.backend_id} ({cov.provider} {cov.account},"
            f" regions {','.join(cov.regions)})")
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"backend forget-coverage {args.id} would stop listing {what} and stdin is not a"
                              " terminal to ask on: nothing changed; add --yes to drop it without a prompt")
        print(f"{what}: nothing will list it for that backend any more. Type {cov.id} to drop it: ",
              end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip() != cov.id:
            print("not dropped: nothing changed", file=sys.stderr)
            return EXIT_OK
    store.forget_coverage(cov.id)
    print(f"dropped {what}: no longer listed (its history stays; an event records it)")
    return EXIT_OK


def running_json(run: RunningCycle | None) -> dict[str, Any] | None:
    """``status --json``'s ``running``: the cycle holding the live lease, or null."""
    if run is None:
        return None
    return {"cycle_id": run.cycle_id, "started_at": _iso(run.started_at),
            "lease_expires_at": _iso(run.lease_expires_at)}


def _running_text(run: dict[str, Any]) -> str:
    return (f"cycle {run['cycle_id']} since {human_time(run['started_at'])},"
            f" lease until {human_time(run['lease_expires_at'], never='-')}")


def running_line(backend: str, run: dict[str, Any]) -> str:
    return f"{backend}: {_running_text(run)}"


def _iso(v: Any) -> str | None:
    return v.isoformat() if v else None
