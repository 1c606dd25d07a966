"""``orphan-cleanup demo`` as a new user runs it: a subprocess with no
DATABASE_URL and no AWS endpoint, which must bring its own Postgres and moto,
reach the expected verdicts, delete only the orphans and clean up after itself.

The expected verdicts are written out here, independently of the demo's own
self-check, and compared with the tables the demo prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# vm -> (verdict, reason) in the report and first delete cycles.
EXPECTED = {
    "tracked": ("tracked", "tracked"),
    "copy": ("protected", "suspected_copy"),
    "retry-lost": ("orphan", "primary_mismatch"),
    "retry-kept": ("tracked", "tracked"),
    "crash": ("orphan", "owner_deleted"),
    "failed-placeholder": ("orphan", "owner_deleted"),
    "gave-up": ("orphan", "owner_terminated"),
    "protected": ("protected", "protect_tag"),
    "foreign": ("ignored", "no_record"),
    "just-failed": ("skipped", "recent_owner_change"),
    "stuck-pending": ("skipped", "owner_pending"),
}
ORPHANS = {vm for vm, (verdict, _) in EXPECTED.items() if verdict == "orphan"}
ACTIONS = {"tracked": "none", "ignored": "none", "skipped": "none", "protected": "reported"}
ROW = re.compile(r"^\s*(?P<vm>[a-z-]+)\s+(?P<instance>i-[0-9a-f]+)\s+(?P<verdict>\w+)\s+(?P<reason>\w+)"
                 r"\s+(?P<action>\w+)(?:\s+(?P<after>\S+))?$")  # a delete cycle that marks: "deleted after"


def sections(stdout: str) -> dict[str, str]:
    """The text under each numbered heading ("1. ...", "2. ...", "3. ...", "4. ...")."""
    parts = re.split(r"^(\d)\. ", stdout, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def cycle_rows(text: str) -> dict[str, tuple[str, str, str, str]]:
    return {vm: row[:4] for vm, row in marked_rows(text).items()}


def marked_rows(text: str) -> dict[str, tuple[str, str, str, str, str | None]]:
    """Each row with its "deleted after" column (None: the table has none)."""
    rows = {}
    for line in text.splitlines():
        if m := ROW.match(line):
            rows[m["vm"]] = (m["instance"], m["verdict"], m["reason"], m["action"], m["after"])
    return rows


def outcome(text: str) -> str:
    m = re.search(r"^\s*outcome: (\w+)$", text, flags=re.M)
    assert m, text
    return m[1]


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "FORCE_COLOR") and not k.startswith("AWS_")}
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", "demo"], env=env, capture_output=True,
                          text=True, timeout=240, cwd=Path(__file__).parent)


def test_demo_succeeds_and_says_so(demo):
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "self-check: ok" in demo.stdout
    assert "\033[" not in demo.stdout  # piped: plain text


def test_report_cycle_reports_every_leak_and_deletes_nothing(demo):
    rows = cycle_rows(sections(demo.stdout)["1"])

    assert {vm: r[1:3] for vm, r in rows.items()} == EXPECTED
    for vm, (_, verdict, _, action) in rows.items():
        assert action == ("reported" if verdict == "orphan" else ACTIONS[verdict]), vm
    assert outcome(sections(demo.stdout)["1"]) == "unsettled"  # just-failed is inside the margin


def test_the_first_delete_cycle_marks_exactly_the_orphans_and_deletes_nothing(demo):
    text = sections(demo.stdout)["2"]
    rows = marked_rows(text)

    assert {vm: r[1:3] for vm, r in rows.items()} == EXPECTED
    assert {vm for vm, r in rows.items() if r[3] == "marked"} == ORPHANS
    for vm, (_, verdict, _, action, after) in rows.items():
        if vm in ORPHANS:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", after or ""), (vm, after)
        else:
            assert (action, after) == (ACTIONS[verdict], "-"), vm
    assert outcome(text) == "unsettled"


def test_the_next_delete_cycle_past_the_window_deletes_them_and_marks_the_new_orphans(demo):
    text = sections(demo.stdout)["3"]
    rows = cycle_rows(text)

    assert {vm for vm, r in rows.items() if r[3] == "deleted"} == ORPHANS
    assert {vm for vm, r in rows.items() if r[3] == "marked"} == {"just-failed", "stuck-pending"}
    assert outcome(text) == "unsettled"


def test_moto_still_runs_exactly_the_vms_that_were_not_deleted(demo):
    text = sections(demo.stdout)["3"]
    table = text.split("Still running on moto (describe_instances):", 1)[1]
    running = {m[1]: m[2] for m in re.finditer(r"^\s+([a-z-]+)\s+(i-[0-9a-f]+)\s+[a-z0-9]{12}$", table, re.M)}
    instances = {vm: r[0] for vm, r in cycle_rows(text).items()}

    assert set(running) == set(EXPECTED) - ORPHANS
    assert all(instances[vm] == iid for vm, iid in running.items())


def test_the_skipped_vm_is_marked_once_past_the_margin_and_deleted_past_the_window(demo):
    assert cycle_rows(sections(demo.stdout)["3"])["just-failed"][1:] == ("orphan", "owner_deleted", "marked")
    text = sections(demo.stdout)["4"]
    assert cycle_rows(text)["just-failed"][1:] == ("orphan", "owner_deleted", "deleted")
    assert outcome(text) == "clean"


def test_a_stuck_pending_owner_is_shown_by_status_and_its_log_line_then_reaped_and_deleted(demo):
    text = sections(demo.stdout)["2"]
    instance = cycle_rows(text)["stuck-pending"][0]
    ref = re.search(rf"^stuck-pending\s+{instance}\s+([a-z0-9]{{12}})\s", demo.stdout, re.M)[1]

    # status lists it, with its ref, owner and age, and says what to do
    status = text.split("$ orphan-cleanup status", 1)[1]
    assert "stuck pending owners" in status and 'Stale pending owners' in status
    row = next(line for line in status.splitlines() if ref in line)
    assert row.split()[:2] == ["demo-aws", ref] and f"inst-{ref}" in row and '"batch-9"' in row
    assert re.search(r"\s2h\s+us-east-1\s+" + instance, row), row
    # the log line names the ref, the owner and the instance, as the functions' JSON logs do
    logged = [line for line in demo.stderr.splitlines() if "pending owner's resources look stuck" in line]
    assert logged and all(f"provider_ref={ref}" in line and f"owner_id=inst-{ref}" in line
                          and f"primary_id={instance}" in line for line in logged), logged
    # the platform reaps the row; the next cycle marks what the crash left, the one after deletes it
    assert f"ledger.reap_pending(inst-{ref})" in text
    assert cycle_rows(sections(demo.stdout)["3"])["stuck-pending"][1:] == ("orphan", "owner_terminated", "marked")
    assert cycle_rows(sections(demo.stdout)["4"])["stuck-pending"][1:] == ("orphan", "owner_terminated", "deleted")


def test_progress_goes_to_stderr_and_the_demo_cleans_up(demo):
    assert "listing demo-aws" in demo.stderr and "deleted group" in demo.stderr
    assert "listing demo-aws" not in demo.stdout
    data_dir = re.search(r"starting an embedded Postgres in (\S+) \.\.\.", demo.stderr)
    assert data_dir, demo.stderr
    assert not Path(data_dir[1]).exists()
    assert "stopping moto" in demo.stderr


def test_the_self_check_catches_wrong_verdicts_missing_and_unexpected_groups(capsys):
    from orphan_cleanup.demo.platform import Scenario
    from orphan_cleanup.cli.output import print_table, verdict_style
    from orphan_cleanup.demo.story import Terminal, _show_cycle
    from orphan_cleanup.ledger.records import CycleReport, ReportGroup

    plan = [Scenario("gave-up", "", "orphan", "owner_terminated", "i-1", "aaaaaaaaaaaa"),
            Scenario("tracked", "", "tracked", "tracked", "i-2", "bbbbbbbbbbbb")]
    report = CycleReport(backend="demo-aws", cycle_id="c", mode="delete", listed_at=None, outcome="clean",
                         failures=(), blocked_reason=None, error=None, groups=(
        ReportGroup(provider_ref="aaaaaaaaaaaa", region="us-east-1", primary_id="i-1", resources=(),
                    verdict="orphan", reason="owner_terminated", action="reported"),
        ReportGroup(provider_ref="cccccccccccc", region="us-east-1", primary_id="i-3", resources=(),
                    verdict="ignored", reason="no_record", action="none")))

    out = Terminal(show_status=lambda db, settings: None, print_table=print_table, verdict_style=verdict_style)
    problems = _show_cycle(report, plan, "delete", out, expected_outcome="unsettled")

    assert len(problems) == 4, problems
    assert any("gave-up came out orphan owner_terminated reported" in p for p in problems)
    assert any("tracked (i-2) was not listed" in p for p in problems)
    assert any("unexpected group cccccccccccc/i-3" in p for p in problems)
    assert any("outcome clean, expected unsettled" in p for p in problems)


def test_the_demo_ends_with_the_report_of_its_history(demo):
    """`orphan-cleanup report` over the demo's day: every orphan found was deleted, each
    reason counted, priced with the demo's prices (settings.prices)."""
    text = demo.stdout.split("$ orphan-cleanup report --since 1d", 1)[1]
    orphans = len(ORPHANS) + 2  # and the two that became orphans in cycle 3 (stuck-pending, just-failed)
    assert re.search(rf"^orphans: {orphans} found, {orphans} deleted, 0 open now; [0-9.]+ orphan-hours;"
                     r" est\. cost [0-9.]+ \(settings\.prices\)$", text, re.M), text
    reasons = {m[1]: int(m[2]) for m in re.finditer(r"^([\w-]+)\s+(\d+)\s+[0-9.,]+\s+[0-9.,]+$", text, re.M)}
    assert reasons == {"owner_deleted": 3, "owner_terminated": 2, "primary_mismatch": 1, "demo-aws": orphans}
