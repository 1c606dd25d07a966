"""`orphan-cleanup` end to end against a real database (C3, C4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from orphan_cleanup.cli.app import main
from orphan_cleanup.core.classify import ClassifyContext
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.verdicts import Outcome
from orphan_cleanup.cycle.cycle_state import finish_if_complete, set_listed_at, start_cycle
from orphan_cleanup.ledger.migrate import available_migrations
from orphan_cleanup.ledger.store import LedgerStore
from tests.support.ledger_helpers import T0, add_ref, db_now, group, limits

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres?sslmode=disable"
STATUS_KEYS = {"backend", "provider", "mode", "clean_at", "last_outcome", "last_processed_at", "next_due_at",
               "open_orphans", "last_error", "last_failed_at"}
ADD_AWS = ["backend", "add", "aws-prod", "--provider", "aws", "--account", "123456789012",
           "--regions", "us-east-1,eu-west-1"]


# One migrated database for the module, emptied before each test.
@pytest.fixture
def db(emptied_db):
    return emptied_db


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("ORPHAN_CLEANUP_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("ORPHAN_CLEANUP_DATA_DIR", "/nonexistent/never-used")


@pytest.fixture
def cli(db, monkeypatch, capsys):
    """Run the CLI against the test database; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("DATABASE_URL", db.info.url())

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("orphan-cleanup: error:")
    return lines[0]


def test_migrate_twice(empty_db, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", empty_db.info.url())
    assert main(["migrate"]) == 0
    first = capsys.readouterr().out
    assert f"applied {len(available_migrations())} migration(s)" in first
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out.strip() == "applied 0 migration(s), schema up to date"


def test_backend_add_then_list(cli):
    code, out, err = cli(*ADD_AWS)
    assert (code, err) == (0, "")
    assert "aws-prod" in out
    assert cli("backend", "add", "gcp-main", "--provider", "gcp", "--account", "my-project-42",
               "--regions", "us-central1,europe-west4-b", "--mode", "delete",
               "--settings", '{"project": "other-project-7"}')[0] == 0
    code, out, _ = cli("backend", "list", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [(b["id"], b["provider"], b["account"], b["regions"], b["mode"]) for b in listed] == [
        ("aws-prod", "aws", "123456789012", ["us-east-1", "eu-west-1"], None),
        ("gcp-main", "gcp", "my-project-42", ["us-central1", "europe-west4-b"], "delete")]
    assert listed[1]["settings"]["project"] == "other-project-7"
    # the human table lists both
    code, out, _ = cli("backend", "list")
    assert code == 0 and "aws-prod" in out and "gcp-main" in out


def test_duplicate_backend_is_bad_input(cli):
    assert cli(*ADD_AWS)[0] == 0
    code, out, err = cli(*ADD_AWS)
    assert code == 2 and out == ""
    assert "already exists" in one_error_line(err)


@pytest.mark.parametrize("argv, mentions", [
    (["backend", "add", "b1", "--provider", "aws", "--account", "12345", "--regions", "us-east-1"], "12345"),
    (["backend", "add", "b1", "--provider", "gcp", "--account", "Bad_Project", "--regions", "us-central1"],
     "Bad_Project"),
    (["backend", "add", "b1", "--provider", "aws", "--account", "123456789012", "--regions", "us-east-1,mars-1"],
     "mars-1"),
    (["backend", "add", "b1", "--provider", "aws", "--account", "123456789012", "--regions", ","], "region"),
], ids=["short aws account", "malformed gcp project", "unknown region", "empty region list"])
def test_malformed_backend_is_bad_input(cli, db, argv, mentions):
    code, out, err = cli(*argv)
    assert code == 2 and out == ""
    assert mentions in one_error_line(err)
    code, out, _ = cli("backend", "list", "--json")
    assert json.loads(out) == []


def test_run_of_an_unknown_backend_is_bad_input(cli):
    code, out, err = cli("run", "--backend", "nope", "--json")
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert "unknown backend" in line and "'nope'" in line


def test_run_while_another_live_cycle_holds_the_backend_exits_3(cli, db):
    # given a backend whose lease a running cycle holds (a scheduled run in progress)
    assert cli("backend", "add", "held", "--provider", "aws", "--account", "123456789012",
               "--regions", "us-east-1")[0] == 0
    add_ref(db)  # enrollment needs an issued ref
    assert start_cycle(LedgerStore(db), "held", "report", limits(), manual=False).cycle is not None

    # when an operator runs it by hand
    code, out, err = cli("run", "--backend", "held", "--json")

    # then C3's exit 3, one line, nothing printed on stdout
    assert code == 3 and out == ""
    assert "another cycle of this backend is running" in one_error_line(err)


def _finish_report_cycle(db, backend_id, groups):
    """A report-mode cycle through the bookkeeping functions the lister and classifier use."""
    lim = limits()
    store = LedgerStore(db)
    cycle = start_cycle(store, backend_id, "report", lim, manual=True).cycle
    listed_at = db_now(db)
    set_listed_at(store, cycle.id, listed_at)
    batch = ListingBatch(cycle_id=cycle.id, backend=backend_id, seq=0, listed_at=listed_at, groups=tuple(groups),
                         last=True, batch_count=1)
    with store.session() as session:
        ctx = ClassifyContext(backend_id=backend_id, scope="aws:123456789012", listed_at=listed_at, margin=timedelta(0),
                              protect_key="orphan-cleanup-protect")
        session.apply(classify_batch(batch, session.load_records(backend_id, batch.groups), ctx,
                                    mode=batch.mode, record_all=batch.record_all))
    assert finish_if_complete(store, cycle.id, lim) is Outcome.CLEAN
    return listed_at


def test_status_json_matches_c3(cli, db, monkeypatch):
    # given a backend never processed and one with a finished cycle that reported an orphan
    assert cli(*ADD_AWS)[0] == 0
    assert cli("backend", "add", "aws-dev", "--provider", "aws", "--account", "210987654321",
               "--regions", "us-west-2", "--mode", "delete")[0] == 0
    ref = add_ref(db, issued_at=T0)
    listed_at = _finish_report_cycle(db, "aws-prod", [group(ref, "i-0abc", created_at=T0)])
    # when status is asked as JSON
    code, out, err = cli("status", "--json")
    assert code == 0
    rows = json.loads(out)
    # then one object per backend, with exactly the C3 keys and `running` (no cycle runs: null)
    assert isinstance(rows, list) and len(rows) == 2
    assert all(set(r) == STATUS_KEYS | {"running", "stuck_pending", "stale_seconds", "retired", "coverage",
                                        "account", "regions", "failing_since"}
               and r["running"] is None and r["retired"] is False and r["coverage"] is None for r in rows)
    dev, prod = sorted(rows, key=lambda r: r["backend"])
    # (aws-dev's row says delete; under the stack's default ceiling, report, it runs report: rule 8)
    assert dev == {"backend": "aws-dev", "provider": "aws", "mode": "report", "clean_at": None,
                   "last_outcome": None, "last_processed_at": None, "next_due_at": None, "open_orphans": 0,
                   "last_error": None, "last_failed_at": None, "running": None, "stuck_pending": [],
                   "stale_seconds": None,  # not enrolled: no staleness
                   "retired": False, "coverage": None, "account": "210987654321", "regions": ["us-west-2"],
                   "failing_since": None}
    assert (prod["provider"], prod["mode"], prod["last_outcome"], prod["open_orphans"]) == (
        "aws", "report", "clean", 1)
    assert isinstance(prod["stale_seconds"], int) and prod["stale_seconds"] >= 0  # since its clean_at
    assert datetime.fromisoformat(prod["clean_at"]) == listed_at
    assert datetime.fromisoformat(prod["next_due_at"]) > datetime.fromisoformat(prod["last_processed_at"])
    # and the global mode shows for backends without their own
    monkeypatch.setenv("ORPHAN_CLEANUP_MODE", "delete")
    rows = json.loads(cli("status", "--json")[1])
    assert {r["backend"]: r["mode"] for r in rows} == {"aws-dev": "delete", "aws-prod": "delete"}


def test_status_table(cli):
    assert cli(*ADD_AWS)[0] == 0
    code, out, _ = cli("status")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split()[0] == "backend" and row.split()[:3] == ["aws-prod", "aws", "report"]


@pytest.mark.parametrize("argv", [["migrate"], ["status", "--json"], ["backend", "list"], list(ADD_AWS),
                                  ["run", "--backend", "aws-prod"]], ids=lambda a: " ".join(a[:2]))
def test_unreachable_database_is_bad_input(argv, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "127.0.0.1:1" in one_error_line(err)


@pytest.mark.parametrize("url", ["mysql://u@h/db", "postgresql://u@h:port/db", "postgresql://u@h/db?sslmode=maybe"],
                         ids=["another scheme", "malformed port", "bad sslmode"])
def test_bad_database_url_is_bad_input(url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", url)
    assert main(["status"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "DATABASE_URL" in one_error_line(err)


def test_an_orphan_no_longer_listed_is_not_open(cli, db):
    # given an orphan reported by one cycle
    assert cli(*ADD_AWS)[0] == 0
    ref = add_ref(db, issued_at=T0)
    _finish_report_cycle(db, "aws-prod", [group(ref, "i-0abc", created_at=T0)])
    assert json.loads(cli("status", "--json")[1])[0]["open_orphans"] == 1
    # when its resources are gone (deleted by hand) and the next cycle lists nothing
    _finish_report_cycle(db, "aws-prod", [])
    # then it is no longer counted as open
    assert json.loads(cli("status", "--json")[1])[0]["open_orphans"] == 0


def test_bad_input_exit_codes_of_the_real_process():
    # the exit status seen by a shell, not only main()'s return value
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORPHAN_CLEANUP_")}
    env["DATABASE_URL"] = UNREACHABLE
    for argv in (["backend", "add", "b1", "--provider", "azure", "--account", "1", "--regions", "x"],
                 ["status"]):
        proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *argv], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        one_error_line(proc.stderr)


def test_a_price_table_is_a_setting_checked_at_add_and_shown(cli):
    prices = {"instance_hour": {"m5.large": 0.096, "p3.2xlarge": 3}, "disk_gb_month": 0.08, "address_hour": 0.005}
    assert cli(*ADD_AWS, "--settings", json.dumps({"prices": prices}))[0] == 0
    code, out, _ = cli("backend", "show", "aws-prod", "--json")
    assert code == 0 and json.loads(out)["settings"]["prices"] == prices
    code, out, _ = cli("backend", "show", "aws-prod")
    assert code == 0 and "prices" in out and "p3.2xlarge" in out
    code, out, err = cli("backend", "update", "aws-prod", "--settings", '{"prices": {"disk_gb_month": -1}}')
    assert code == 2 and out == "" and "prices" in one_error_line(err)


def test_the_stalest_backend_is_one_never_clean_before_one_clean_minutes_ago(cli, db):
    # README, "When one fires": a backend whose cycles were unsettled since its last clean one,
    # 162 s ago, and one enrolled 30 s ago whose only cycle failed: it was never clean
    assert cli("backend", "add", "gcp-main", "--provider", "gcp", "--account", "my-project",
               "--regions", "europe-west1")[0] == 0
    assert cli(*ADD_AWS)[0] == 0
    with db.transaction() as conn:
        conn.run("INSERT INTO cleanup (backend_id, created_at, clean_at, last_outcome) VALUES"
                 " ('aws-prod', oc_clock() - interval '1 hour', oc_clock() - interval '162 seconds', 'unsettled'),"
                 " ('gcp-main', oc_clock() - interval '30 seconds', NULL, 'failed')")
    # when status is asked
    rows = {r["backend"]: r for r in json.loads(cli("status", "--json")[1])}
    assert 162 <= rows["aws-prod"]["stale_seconds"] < 162 + 60  # since its clean_at
    assert 30 <= rows["gcp-main"]["stale_seconds"] < 30 + 60  # since it was enrolled
    code, out, _ = cli("status")
    # then the never-clean, failed backend is the stalest
    assert code == 0 and "stalest backend: gcp-main, never clean (failed, enrolled " in out, out
