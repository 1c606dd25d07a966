"""The stack's limits are ceilings (SAFETY.md rule 8): a backend row may lower the count
and share caps and lengthen the margin, never the other way. Whole cycles on real Postgres
with the in-memory cloud behind the provider port; the CLI's `backend show` and `explain`
run as an operator runs them, in-process.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from orphan_cleanup.cli import app as cli
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend


def pipeline(db: Database, cloud: MemoryCloud, **stack) -> Pipeline:
    return Pipeline(settings=Settings.explicit(confirm_seconds=0,
                                               **stack), db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def three_orphans(db: Database, cloud: MemoryCloud, settings: dict) -> list[str]:
    add_backend(db, settings=json.dumps(settings))
    platform = Platform(db, cloud)
    return [platform.terminated_leak(region=r)[2] for r in ("r1", "r1", "r2")]


def test_a_row_cannot_raise_the_stack_cap(emptied_db):
    # given a stack capped at 1 group per cycle, a row that says 100, and three orphans
    db, cloud = emptied_db, MemoryCloud()
    orphans = three_orphans(db, cloud, {"max_deletes": 100})

    # when a delete cycle runs
    report = run_cycle(pipeline(db, cloud, max_deletes=1), "mem", mode="delete")

    # then the stack's cap holds: the cycle would delete 3 > 1, so it deletes nothing and says why
    assert all(cloud.exists(i) for i in orphans) and cloud.deleted == []
    assert report.blocked_reason is not None and "1" in report.blocked_reason
    assert {g.action for g in report.groups if g.verdict == "orphan"} == {"reported"}


def test_a_row_may_lower_the_stack_cap(emptied_db):
    # given the product's cap (100) and a row that says 2: the row's tighter value applies
    db, cloud = emptied_db, MemoryCloud()
    orphans = three_orphans(db, cloud, {"max_deletes": 2})

    report = run_cycle(pipeline(db, cloud), "mem", mode="delete")

    assert all(cloud.exists(i) for i in orphans)
    assert report.blocked_reason is not None and "2" in report.blocked_reason


def test_a_row_cannot_raise_the_stack_share(emptied_db):
    # given 12 orphans among 24 listed groups: above 10 deletes the share applies;
    # the stack allows 0.25 of the listed groups, the row says 1.0
    db, cloud = emptied_db, MemoryCloud()
    add_backend(db, settings=json.dumps({"max_delete_share": 1.0}))
    platform = Platform(db, cloud)
    orphans = [platform.terminated_leak()[2] for _ in range(12)]
    for _ in range(12):
        platform.tracked()

    report = run_cycle(pipeline(db, cloud, max_delete_share=0.25), "mem", mode="delete")

    assert all(cloud.exists(i) for i in orphans) and cloud.deleted == []
    assert report.blocked_reason is not None


def ended_a_minute_ago(db: Database, cloud: MemoryCloud, settings: dict) -> str:
    add_backend(db, settings=json.dumps(settings))
    platform = Platform(db, cloud)
    _, owner, vm = platform.tracked()
    platform.ledger.mark_terminated(owner)
    platform.age(owner, timedelta(seconds=60))
    return vm


def test_a_row_cannot_shorten_the_stack_margin(emptied_db):
    # given a stack margin of 600 s, a row that says 0, and an owner that ended 60 s ago
    db, cloud = emptied_db, MemoryCloud()
    vm = ended_a_minute_ago(db, cloud, {"margin_seconds": 0})

    report = run_cycle(pipeline(db, cloud, margin_seconds=600), "mem", mode="delete")

    # then the stack's margin holds: the VM is skipped as too recent, not deleted
    assert cloud.exists(vm)
    group = next(g for g in report.groups if g.primary_id == vm)
    assert (group.verdict, group.action) == ("skipped", "none"), group


def test_a_stack_margin_shorter_than_the_owners_end_deletes_it(emptied_db):
    # the counterpart: with a stack margin of 30 s the same VM is an orphan and goes
    db, cloud = emptied_db, MemoryCloud()
    vm = ended_a_minute_ago(db, cloud, {"margin_seconds": 0})

    report = run_cycle(pipeline(db, cloud, margin_seconds=30), "mem", mode="delete")

    assert not cloud.exists(vm)
    assert next(g for g in report.groups if g.primary_id == vm).action == "deleted"


def test_a_row_may_lengthen_the_margin(emptied_db):
    # the row's 600 s is tighter than the stack's 30 s: it applies
    db, cloud = emptied_db, MemoryCloud()
    vm = ended_a_minute_ago(db, cloud, {"margin_seconds": 600})

    run_cycle(pipeline(db, cloud, margin_seconds=30), "mem", mode="delete")

    assert cloud.exists(vm)


@pytest.fixture
def operator(emptied_db: Database, monkeypatch: pytest.MonkeyPatch) -> Database:
    for name in ("ORPHAN_CLEANUP_MODE", "ORPHAN_CLEANUP_MAX_DELETE_SHARE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", emptied_db.info.url())
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("ORPHAN_CLEANUP_MAX_DELETES", "1")
    monkeypatch.setenv("ORPHAN_CLEANUP_MARGIN_SECONDS", "600")
    return emptied_db


def test_backend_show_reports_the_looser_values_it_ignores(operator, capsys):
    # given a row looser than the stack on the cap and the margin, tighter on the share
    add_backend(operator, settings=json.dumps({"max_deletes": 100, "margin_seconds": 0, "max_delete_share": 0.1}))

    assert cli.main(["backend", "show", "mem", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)

    # then the effective values are the stack's, their source the environment, and the row's are named as ignored
    effective, sources, ignored = doc["effective_settings"], doc["setting_sources"], doc["ignored_settings"]
    assert (effective["max_deletes"], sources["max_deletes"]) == (1, "environment")
    assert (effective["margin_seconds"], sources["margin_seconds"]) == (600, "environment")
    assert (effective["max_delete_share"], sources["max_delete_share"]) == (0.1, "backend")
    assert ignored == {
        "max_deletes": {"value": 100, "stack": 1, "why": "the backend's 100 ignored: higher than the stack's 1"},
        "margin_seconds": {"value": 0, "stack": 600, "why": "the backend's 0 ignored: shorter than the stack's 600"}}
    assert doc["settings"]["max_deletes"] == 100  # the row is shown as stored

    assert cli.main(["backend", "show", "mem"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ") and line.split()}
    assert lines["max_deletes"].split(None, 1)[1] == \
        "1  (environment: ORPHAN_CLEANUP_MAX_DELETES; the backend's 100 ignored: higher than the stack's 1)"
    assert "ignored" not in lines["max_delete_share"]


def test_explain_reports_the_looser_values_it_ignores(operator, capsys):
    # given a reported orphan of a backend whose row sets a looser cap than the stack
    cloud = MemoryCloud()
    add_backend(operator, settings=json.dumps({"max_deletes": 100}))
    ref, _, _ = Platform(operator, cloud).terminated_leak()
    run_cycle(pipeline(operator, cloud), "mem", mode="report")
    assert LedgerStore(operator).backend_row("mem").settings == {"max_deletes": 100}

    assert cli.main(["explain", "--backend", "mem", ref, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ignored_settings"] == {
        "max_deletes": {"value": 100, "stack": 1, "why": "the backend's 100 ignored: higher than the stack's 1"}}

    assert cli.main(["explain", "--backend", "mem", ref]) == 0
    assert "settings: max_deletes: the backend's 100 ignored: higher than the stack's 1" in capsys.readouterr().out


# ---- the mode is a ceiling too (SAFETY.md rule 8; ORPHAN_CLEANUP_MAX_MODE, C4) --------------

@pytest.mark.parametrize("stack, row, runs", [
    (dict(), "delete", "report"),                             # the default ceiling: the stack's mode, report
    (dict(mode="delete", max_mode="report"), None, "report"),  # the stack's own default under its ceiling
    (dict(mode="delete", max_mode="report"), "delete", "report"),
    (dict(mode="off"), "delete", "report"),                   # off: the ceiling is report
    (dict(mode="report", max_mode="delete"), "delete", "delete"),
    (dict(mode="delete"), "report", "report"),                # a row may always say report
])
def test_a_row_cannot_raise_the_stack_mode(emptied_db, stack, row, runs):
    # given a terminated owner's leaked VM, and a row's mode under the stack's ceiling
    db, cloud = emptied_db, MemoryCloud()
    add_backend(db, mode=row)
    _, _, leaked = Platform(db, cloud).terminated_leak()

    # when a scheduled cycle runs (no operator's one-off mode)
    report = run_cycle(pipeline(db, cloud, **stack), "mem", mode=None)

    # then it runs in the mode the ceiling allows, and deletes only under a delete ceiling
    assert report.mode == runs
    assert cloud.exists(leaked) is (runs == "report")


def test_an_operators_one_off_mode_is_not_a_row_and_not_capped(emptied_db):
    db, cloud = emptied_db, MemoryCloud()
    add_backend(db, mode="delete")
    _, _, leaked = Platform(db, cloud).terminated_leak()

    report = run_cycle(pipeline(db, cloud, max_mode="report"), "mem", mode="delete")

    assert report.mode == "delete" and not cloud.exists(leaked)


def test_an_off_row_stays_off_under_any_ceiling(emptied_db):
    db, cloud = emptied_db, MemoryCloud()
    add_backend(db, mode="off")
    Platform(db, cloud).terminated_leak()

    result = pipeline(db, cloud, mode="delete", max_mode="delete").run_lister("mem", mode="delete", manual=True)

    assert not result.started and result.reason == "off"


def test_backend_show_and_explain_name_the_ignored_mode(operator, capsys, monkeypatch):
    # given a stack deployed in report mode, and a row the platform set to delete
    cloud = MemoryCloud()
    monkeypatch.setenv("ORPHAN_CLEANUP_MODE", "report")
    add_backend(operator, mode="delete")
    ref, _, leaked = Platform(operator, cloud).terminated_leak()
    run_cycle(pipeline(operator, cloud, mode="report"), "mem", mode=None)
    assert cloud.exists(leaked)
    why = "the backend's delete ignored: the stack's ceiling is report (ORPHAN_CLEANUP_MAX_MODE)"

    assert cli.main(["backend", "show", "mem", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["mode"], doc["effective_mode"]) == ("delete", "report")
    assert doc["ignored_settings"]["mode"] == {"value": "delete", "stack": "report", "why": why}
    assert cli.main(["backend", "show", "mem"]) == 0
    [mode_line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mode")]
    assert mode_line.split(None, 1)[1] == f"report ({why})"

    assert cli.main(["explain", "--backend", "mem", ref, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ignored_settings"]["mode"]["why"] == why
    assert cli.main(["explain", "--backend", "mem", ref]) == 0
    assert f"settings: mode: {why}" in capsys.readouterr().out

    # and `status` shows the mode the cycles run in
    assert cli.main(["status", "--json"]) == 0
    assert [r["mode"] for r in json.loads(capsys.readouterr().out)] == ["report"]
    # while a stack whose ceiling allows delete shows the row's delete, and ignores nothing
    monkeypatch.setenv("ORPHAN_CLEANUP_MAX_MODE", "delete")
    assert cli.main(["backend", "show", "mem", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["effective_mode"] == "delete" and "mode" not in doc["ignored_settings"]
