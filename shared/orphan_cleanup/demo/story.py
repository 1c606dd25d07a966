"""The demo's story: the platform provisions and leaks, three cycles run
through the real pipeline, and the self-check compares what came out with the
plan (see the package docstring)."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from orphan_cleanup.core.backends import BackendSettings, Mode
from orphan_cleanup.core.costs import Prices
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.demo.platform import DemoPlatform, Scenario, running_instances
from orphan_cleanup.demo.world import CONFIRM_SECONDS, MARGIN_SECONDS, REGION, DemoWorld, demo_world
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import CycleReport
from orphan_cleanup.ledger.store import LedgerStore

BACKEND, ACCOUNT = "demo-aws", "123456789012"
StatusPrinter = Callable[[Database, Settings], None]


@dataclass(frozen=True)
class Terminal:
    """How the demo prints, handed in by the CLI (the demo never imports the CLI): its
    ``status`` command, its table printer and its verdict colors."""

    show_status: StatusPrinter
    print_table: Callable[..., None]
    verdict_style: Callable[[str], str]
    # ``orphan-cleanup report`` of this database over the last day (None: not shown).
    show_report: Callable[[Database], None] | None = None
"""Prints what ``orphan-cleanup status`` prints for this database and settings."""
# moto stamps VMs with the wall clock, so the demo cannot backdate them: it uses a short
# margin (world.MARGIN_SECONDS, its stack's) and waits it out instead of the default 300 s.
#: The operator's prices (``settings.prices``, never fetched) the report costs the leaks with.
DEMO_PRICES = {"instance_hour": {"t3.micro": 0.0104}, "disk_gb_month": 0.08}

REMOVED_BECAUSE = {
    "owner_deleted": "the owner's row was deleted and its ref stayed behind: nothing can still be creating it",
    "owner_terminated": "the owner was marked terminated longer than the margin ago: termination gave up",
    "primary_mismatch": "the owner is live but records another VM, provisioned after this one: a lost attempt",
}
KEPT_BECAUSE = {
    "tracked": "the ledger records it as its owner's VM",
    "suspected_copy": "same ref as a live owner, launched after its provisioning (+ margin): someone copied it"
                      " on purpose; reported, never deleted",
    "protect_tag": "tagged orphan-cleanup-protect: reported every cycle, never deleted",
    "no_record": "its ref is not in this ledger: not ours, never touched",
    "recent_owner_change": "its owner changed within the margin, so the listing may predate the change:"
                           " skipped, and the cycle stays unsettled until a later one decides",
    "owner_pending": "its owner is still pending two hours after its ref was issued: the create call may"
                     " be in flight, so it is skipped every cycle (clean_at cannot advance) and listed by"
                     " status as stuck, until the platform reaps the row",
}


def say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


STUCK_NOTE = ("the cycles log \"ERROR pending owner's resources look stuck\" for stuck-pending: expected, the"
              " demo leaks it on purpose (README.md, \"Stale pending owners\")")


def run_demo(out: Terminal, *, verbose: bool = False) -> int:
    """Run the demo; 0 when every verdict and the final fleet are as expected, else 1.

    ``out`` prints as the CLI does; the demo ends with the CLI's ``status``. On a terminal
    the log lines go to a file (named at the end) unless ``verbose``: the narrative stays
    readable; piped, they stay on stderr with the progress."""
    started = time.monotonic()
    with _log_lines(aside=sys.stderr.isatty() and not verbose) as logged:
        with demo_world(say) as world:
            problems = _play(world, out)
    if logged is not None:
        count, path = logged()
        say(f"{count} log lines of the cycles (warnings, and the expected ERROR for stuck-pending) are in {path};"
            " --verbose shows them here")
    say(f"done in {time.monotonic() - started:.0f} s")
    if problems:
        print("\nself-check: FAILED")
        for p in problems:
            print(f"  - {p}")
        return 1
    return 0


@contextmanager
def _log_lines(*, aside: bool) -> Iterator[Callable[[], tuple[int, str]] | None]:
    """With ``aside``, the log records this process writes to stderr go to a log file
    instead (the handlers keep their format); yields ``() -> (records, path)``."""
    if not aside:
        yield None
        return
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr]
    fd, path = tempfile.mkstemp(prefix="orphan-cleanup-demo-", suffix=".log")
    count = [0]

    def counted(record: logging.LogRecord) -> bool:
        count[0] += 1
        return True

    with open(fd, "w", encoding="utf-8") as log:
        for h in handlers:
            h.setStream(log)
            h.addFilter(counted)
        try:
            yield lambda: (count[0], path)
        finally:
            for h in handlers:
                h.removeFilter(counted)
                h.setStream(sys.stderr)


def _play(world: DemoWorld, out: Terminal) -> list[str]:
    """Provision and leak, run the three cycles, return what differed from the plan."""
    _register_backend(world)
    ec2 = world.client("ec2")
    platform = DemoPlatform(world.db, ec2, BACKEND, REGION)
    fleet = _provision(platform, out)
    run = _runner(world)

    problems: list[str] = []
    print(textwrap.fill(f"({STUCK_NOTE}.)", width=100))
    print("\n1. Report cycle: list, classify, report; delete nothing.\n")
    problems += _show_cycle(run("report"), fleet, "report", out, expected_outcome="unsettled")
    print("   The skipped group keeps the cycle unsettled: clean_at does not move.")

    orphans = {s.key for s in fleet if s.is_orphan}
    print("\n" + textwrap.fill(
        "2. Delete cycle: the same verdicts; the orphans are marked, not deleted yet: a later delete cycle"
        f" deletes them once {CONFIRM_SECONDS} s have passed (ORPHAN_CLEANUP_CONFIRM_SECONDS, the interval by"
        " default), unless an operator keeps one (orphan-cleanup orphans keep REF).", width=100) + "\n")
    problems += _show_cycle(run("delete"), fleet, "delete", out, expected_outcome="unsettled", marked=orphans)
    problems += _check_running(ec2, fleet, out, show=False, gone=set())

    print("\n$ orphan-cleanup status")
    out.show_status(world.db, world.settings)
    # The platform reaps its stale pending rows (README, "Stale pending owners"); once the
    # margin has passed, the reaped owner's VM and the skipped one are judged like any other.
    reaped = platform.reap_stale_pending()
    print(f"\n   The platform reaps its stale pending rows: ledger.reap_pending({', '.join(reaped)}) marks them"
          " terminated.")
    recent = [s.key for s in fleet if s.later]
    fleet = [replace(s, verdict=s.later[0], reason=s.later[1]) if s.later else s for s in fleet]
    wait = max(MARGIN_SECONDS, CONFIRM_SECONDS) + 1.0
    say(f"waiting {wait:.0f} s for the window of the marked orphans and the margin of {', '.join(recent)}"
        " to pass ...")
    time.sleep(wait)
    print("\n" + textwrap.fill(
        f"3. {wait:.0f} s later, the next delete cycle: the marked orphans are deleted; {', '.join(recent)}"
        " are past the margin now, orphans, and marked in their turn.", width=100) + "\n")
    problems += _show_cycle(run("delete"), fleet, "delete", out, expected_outcome="unsettled", marked=set(recent))
    _explain(fleet, marked=set(recent))
    problems += _check_running(ec2, fleet, out, gone=orphans)

    wait = CONFIRM_SECONDS + 1.0
    say(f"waiting {wait:.0f} s for the window of {', '.join(recent)} to pass ...")
    time.sleep(wait)
    print(f"\n4. {wait:.0f} s later, the next delete cycle: {', '.join(recent)} are deleted"
          " (the other VMs come out as before).\n")
    still_listed = [s for s in fleet if s.key in recent or not s.is_orphan]
    problems += _show_cycle(run("delete"), still_listed, "delete", out, expected_outcome="clean",
                            show=set(recent))
    print("   Clean: clean_at advances to the listing time minus the margin.")
    problems += _check_running(ec2, fleet, out, show=False)

    print("\n$ orphan-cleanup status")
    out.show_status(world.db, world.settings)
    if out.show_report is not None:
        print("\n$ orphan-cleanup report --since 1d")
        out.show_report(world.db)
    if not problems:
        deleted = sum(1 for s in fleet if s.is_orphan)
        print(f"\nself-check: ok ({deleted} orphans marked, then deleted, {len(fleet) - deleted} VMs kept, "
              "every verdict as expected)")
    return problems


def _register_backend(world: DemoWorld) -> None:
    backend_settings = json.dumps({"margin_seconds": MARGIN_SECONDS, "prices": DEMO_PRICES})
    say(f"orphan-cleanup backend add {BACKEND} --provider aws --account {ACCOUNT} --regions {REGION} \\\n"
        f"        --settings '{backend_settings}'")
    LedgerStore(world.db).add_backend(backend_id=BACKEND, provider="aws", account=ACCOUNT, regions=[REGION],
                                      settings=BackendSettings(margin_seconds=MARGIN_SECONDS,
                                                               prices=Prices.model_validate(DEMO_PRICES)))


def _provision(platform: DemoPlatform, out: Terminal) -> list[Scenario]:
    say("the platform provisions its fleet through the ledger, and leaks ...")
    fleet = platform.play_history()
    wait = MARGIN_SECONDS + 1.5
    say(f"waiting {wait:.0f} s so that history is older than the {MARGIN_SECONDS} s margin ...")
    time.sleep(wait)
    fleet.append(platform.play_just_now())
    print(f"A platform ran {len(fleet)} VMs on a fake AWS (moto) through its ledger, and leaked some.")
    print(f"Backend {BACKEND}: aws account {ACCOUNT}, region {REGION}, margin {MARGIN_SECONDS} s"
          " (300 s by default; short here to fit in a minute).\n")
    out.print_table(["vm", "instance", "ref", "what happened"],
                [[s.key, s.instance_id, s.provider_ref, s.story] for s in fleet])
    return fleet


def _runner(world: DemoWorld) -> Callable[[Mode], CycleReport]:
    """``run(mode)``: one full cycle through the real pipeline, like ``orphan-cleanup run``."""
    from orphan_cleanup.cycle.runner import run_cycle
    from orphan_cleanup.entrypoints import bootstrap
    from orphan_cleanup.queues.memory import InProcessQueue

    def run(mode: Mode) -> CycleReport:
        say(f"orphan-cleanup run --backend {BACKEND} --mode {mode}")
        pipeline = bootstrap.build_pipeline(
            world.settings, db=world.db, listing_queue=InProcessQueue(), delete_queue=InProcessQueue(),
            provider_for=bootstrap.provider_factory(world.settings, aws_session=world.aws_session))
        return run_cycle(pipeline, BACKEND, mode=mode, progress=lambda m: say(f"  {m}"))

    return run


def _show_cycle(report: CycleReport, listed: list[Scenario], mode: str, out: Terminal, *, expected_outcome: str,
                show: set[str] | None = None, marked: Set[str] = frozenset()) -> list[str]:
    """Print the cycle's groups in fleet order and compare them with the plan:
    exactly the ``listed`` scenarios, each with its verdict, reason and action (``marked``:
    the orphans this cycle finds for the first time, and marks)."""
    problems: list[str] = []
    by_id = {s.instance_id: s for s in listed}
    groups = {g.primary_id: g for g in report.groups}
    for extra in report.groups:
        if extra.primary_id not in by_id:
            problems.append(f"{mode} cycle: unexpected group {extra.provider_ref}/{extra.primary_id}: "
                            f"{extra.verdict} {extra.reason} {extra.action}")
    rows = []
    for s in listed:
        g = groups.get(s.instance_id)
        if g is None:
            problems.append(f"{mode} cycle: {s.key} ({s.instance_id}) was not listed")
            continue
        got = (g.verdict, g.reason, g.action)
        want = (s.verdict, s.reason, s.expected_action(mode, marked=s.key in marked))
        if got != want:
            problems.append(f"{mode} cycle: {s.key} came out {' '.join(got)}, expected {' '.join(want)}")
        if show is None or s.key in show:
            rows.append([s.key, s.instance_id, out.verdict_style(g.verdict), g.reason, g.action]
                        + ([_when(g.detail)] if marked else []))
    out.print_table(["vm", "instance", "verdict", "reason", "action"] + (["deleted after"] if marked else []),
                    rows, indent=3)
    problems += [f"{mode} cycle: region {f.region} failed: {f.error}" for f in report.failures]
    if report.error:
        problems.append(f"{mode} cycle: {report.error}")
    print(f"\n   outcome: {out.verdict_style(report.outcome)}")
    if report.outcome != expected_outcome:
        problems.append(f"{mode} cycle: outcome {report.outcome}, expected {expected_outcome}")
    return problems


def _when(detail: str | None) -> str:
    """A marked group's time to go, from its C3 detail (``deleted after T; ...``)."""
    head = (detail or "").split(";")[0]
    return head.removeprefix("deleted after ") if head.startswith("deleted after ") else "-"


def _explain(fleet: list[Scenario], *, marked: set[str]) -> None:
    for title, legend, members in (("Deleted", REMOVED_BECAUSE, [s for s in fleet if s.is_orphan
                                                                 and s.key not in marked]),
                                   ("Kept", KEPT_BECAUSE, [s for s in fleet if not s.is_orphan])):
        print(f"\n   {title}, because:")
        for reason, text in legend.items():
            names = [s.key for s in members if s.reason == reason]
            if names:
                print(textwrap.fill(f"{', '.join(names)} ({reason}): {text}", width=100,
                                    initial_indent="   - ", subsequent_indent="     "))


def _check_running(ec2: Any, fleet: list[Scenario], out: Terminal, *, show: bool = True,
                   gone: set[str] | None = None) -> list[str]:
    """Ask moto which instances still run: exactly all but the ``gone`` ones (default: the
    orphans) must."""
    running = running_instances(ec2)
    if show:
        print(f"\n   Still running on moto (describe_instances): {len(running)}")
        out.print_table(["vm", "instance", "ref"], [[s.key, s.instance_id, running[s.instance_id]]
                                               for s in fleet if s.instance_id in running], indent=3)
    gone = {s.key for s in fleet if s.is_orphan} if gone is None else gone
    expected = {s.instance_id for s in fleet if s.key not in gone}
    if set(running) == expected:
        return []
    return [f"running VMs differ: still running {sorted(set(running) - expected)}, "
            f"gone {sorted(expected - set(running))}"]
