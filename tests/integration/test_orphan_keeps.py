"""An operator's keep (``orphans keep REF --backend ID``, ``orphans release``; C3, SAFETY.md
rule 23): a kept ref's groups are protected (``kept_by_operator``), never deleted, by the
classifier and by the deleter's re-check right before the provider calls; the keep ends when
released or when its time is up. Real Postgres, the real pipeline on the in-memory cloud, the
CLI in process."""

from __future__ import annotations

import json

import pytest

from orphan_cleanup import cli
from orphan_cleanup.core.digest import digest
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.records import CycleReport
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend

BACKEND = "mem"
SCOPE = "aws:123456789012"  # add_backend's account: the delete gate's scope


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


@pytest.fixture
def cloud() -> MemoryCloud:
    return MemoryCloud()


@pytest.fixture
def platform(db: Database, cloud: MemoryCloud) -> Platform:
    add_backend(db, BACKEND)
    return Platform(db, cloud, backend_id=BACKEND)


def pipeline(db: Database, cloud: MemoryCloud) -> Pipeline:
    return Pipeline(settings=Settings(), db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def verdicts(report: CycleReport) -> dict[str, tuple[str, str, str]]:
    return {g.primary_id or g.provider_ref: (g.verdict, g.reason, g.action) for g in report.groups}


def run_cli(db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("DATABASE_URL", db.info.url())
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def sql(db: Database, statement: str, **params) -> list[list]:
    with db.transaction() as conn:
        return conn.run(statement, **params)


def recorded_leak(db: Database, cloud: MemoryCloud, platform: Platform) -> tuple[str, str]:
    """A terminated owner's VM that a report cycle recorded as an orphan: (ref, VM id)."""
    ref, _, vm = platform.terminated_leak()
    assert verdicts(run_cycle(pipeline(db, cloud), BACKEND, mode="report"))[vm][0] == "orphan"
    return ref, vm


def test_a_kept_ref_is_protected_and_never_deleted_by_a_delete_cycle(db, cloud, platform, monkeypatch, capsys):
    # given a recorded orphan and another one, the first kept by the operator
    ref, vm = recorded_leak(db, cloud, platform)
    _, _, other = platform.terminated_leak()
    code, out, err = run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND,
                             "--reason", "debugging the crash")
    assert (code, err) == (0, "")
    assert out == f"kept ref {ref} of {BACKEND} until released: debugging the crash\n"

    # when a delete cycle runs
    report = run_cycle(pipeline(db, cloud), BACKEND, mode="delete")

    # then the kept group is protected and reported, the other orphan deleted
    v = verdicts(report)
    assert v[vm] == ("protected", "kept_by_operator", "reported")
    assert v[other][2] == "deleted"
    assert cloud.exists(vm) and not cloud.exists(other)
    assert report.outcome == "clean"
    assert sql(db, "SELECT state, reason FROM orphans WHERE primary_id = :p", p=vm) == [
        ["protected", "kept_by_operator"]]
    # and the C3 detail says by whom and why
    [g] = [g for g in report.c3()["groups"] if g["primary_id"] == vm]
    assert "debugging the crash" in g["detail"] and "until released" in g["detail"]


def test_a_keep_written_after_dispatch_wins_over_the_delete(db, cloud, platform, monkeypatch, capsys):
    # given a delete cycle classified and dispatched (the request queued, nothing deleted yet)
    ref, _, vm = platform.terminated_leak()
    p = pipeline(db, cloud)
    p.run_lister(BACKEND, mode="delete", manual=True)
    while (body := p.listing_queue.pop()) is not None:
        p.handle_batch(ListingBatch.model_validate_json(body))
    [request] = [DeleteRequest.model_validate_json(x) for x in p.delete_queue.items]
    assert request.group.primary_id == vm

    # when the operator keeps the ref before the deleter runs
    code, out, err = run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND)
    assert code == 0 and out.startswith(f"kept ref {ref} of {BACKEND} until released")

    # then the deleter's re-check finds the keep: nothing is deleted, the group is recorded kept
    assert p.handle_delete(request) == "protected"
    assert cloud.exists(vm) and cloud.deleted == []
    assert sql(db, "SELECT verdict, reason, action FROM cycle_groups WHERE cycle_id = :c AND primary_id = :p",
               c=request.cycle_id, p=vm) == [["protected", "kept_by_operator", "reported"]]
    assert sql(db, "SELECT state, verdict, reason FROM orphans WHERE primary_id = :p", p=vm) == [
        ["protected", "protected", "kept_by_operator"]]
    assert LedgerStore(db).cycle_report(request.cycle_id).outcome == "clean"
    assert sql(db, "SELECT count(*) FROM provider_journal WHERE provider_ref = :r", r=ref) == [[0]]


def test_a_keep_ends_when_its_time_is_up(db, cloud, platform, monkeypatch, capsys):
    ref, vm = recorded_leak(db, cloud, platform)
    code, out, _ = run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND, "--for", "1h")
    assert code == 0 and f"kept ref {ref} of {BACKEND} until " in out and "until released" not in out
    [[until_in]] = sql(db, "SELECT until - oc_clock() FROM orphan_keeps WHERE provider_ref = :r", r=ref)
    assert 3500 < until_in.total_seconds() <= 3600
    assert verdicts(run_cycle(pipeline(db, cloud), BACKEND, mode="report"))[vm][:2] == (
        "protected", "kept_by_operator")

    # when the keep's end is before the next cycle's listing time (by the database's clock)
    sql(db, "UPDATE orphan_keeps SET until = oc_clock() - interval '1 minute' WHERE provider_ref = :r", r=ref)
    report = run_cycle(pipeline(db, cloud), BACKEND, mode="delete")

    # then the group is an orphan again, and deleted
    assert verdicts(report)[vm] == ("orphan", "owner_terminated", "deleted")
    assert not cloud.exists(vm)


def test_release_ends_a_keep_and_writes_its_event(db, cloud, platform, monkeypatch, capsys):
    ref, vm = recorded_leak(db, cloud, platform)
    assert run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND, "--reason", "r1")[0] == 0
    # keeping again replaces the keep (one row per backend and ref)
    assert run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND, "--for", "2d",
                   "--reason", "r2")[0] == 0
    assert sql(db, "SELECT reason, until IS NOT NULL FROM orphan_keeps") == [["r2", True]]

    code, out, err = run_cli(db, monkeypatch, capsys, "orphans", "release", ref, "--backend", BACKEND)
    assert (code, err) == (0, "") and out == f"released ref {ref} of {BACKEND} (it was kept: r2)\n"
    assert sql(db, "SELECT count(*) FROM orphan_keeps") == [[0]]
    events = sql(db, "SELECT kind, provider_ref, details FROM events WHERE kind IN ('orphan_kept', 'orphan_released')"
                     " ORDER BY id")
    assert [(k, r) for k, r, _ in events] == [("orphan_kept", ref), ("orphan_kept", ref), ("orphan_released", ref)]
    assert events[0][2] == {"reason": "r1", "until": None}
    assert events[1][2]["reason"] == "r2" and events[1][2]["until"] is not None
    assert events[2][2]["reason"] == "r2"
    # and the next delete cycle deletes the orphan
    assert verdicts(run_cycle(pipeline(db, cloud), BACKEND, mode="delete"))[vm][2] == "deleted"


def test_refusals_exit_2_with_one_line_and_write_nothing(db, cloud, platform, monkeypatch, capsys):
    ref, _ = recorded_leak(db, cloud, platform)
    before = sql(db, "SELECT count(*) FROM events")

    def refused(*args: str) -> str:
        code, out, err = run_cli(db, monkeypatch, capsys, "orphans", *args)
        assert (code, out) == (2, "") and err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "unknown backend 'nope'" in refused("keep", ref, "--backend", "nope")
    assert "no cycle of mem recorded ref zzzzzzzzzzzz" in refused("keep", "zzzzzzzzzzzz", "--backend", BACKEND)
    assert "not a provider_ref" in refused("keep", "NOT-A-REF", "--backend", BACKEND)
    assert "not kept" in refused("release", ref, "--backend", BACKEND)
    assert "--for" in refused("keep", ref, "--backend", BACKEND, "--for", "soon")
    assert sql(db, "SELECT count(*) FROM orphan_keeps") == [[0]]
    assert sql(db, "SELECT count(*) FROM events") == before


def test_keep_says_when_a_delete_of_the_ref_is_in_flight(db, cloud, platform, monkeypatch, capsys):
    ref, _ = recorded_leak(db, cloud, platform)
    sql(db, "INSERT INTO delete_gates (backend_id, provider_ref, holder, expires_at)"
            " VALUES (:s, :r, 'a-deleter', now() + interval '5 minutes')", s=SCOPE, r=ref)
    code, out, _ = run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND)
    assert code == 0
    first, second = out.splitlines()
    assert first.startswith(f"kept ref {ref}")
    assert "in flight" in second and "already sent" in second


def test_orphans_without_an_action_still_lists(db, cloud, platform, monkeypatch, capsys):
    ref, vm = recorded_leak(db, cloud, platform)
    code, out, _ = run_cli(db, monkeypatch, capsys, "orphans", "--backend", BACKEND, "--json")
    assert code == 0 and [d["primary_id"] for d in json.loads(out)] == [vm]


def test_explain_and_the_digest_show_the_keep(db, cloud, platform, monkeypatch, capsys):
    ref, vm = recorded_leak(db, cloud, platform)
    _, _, other = platform.terminated_leak()  # a new orphan: the cycle deserves a digest
    run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND, "--reason", "post-mortem")
    report = run_cycle(pipeline(db, cloud), BACKEND, mode="report")

    code, out, _ = run_cli(db, monkeypatch, capsys, "explain", "--backend", BACKEND, ref, "--json")
    assert code == 0
    keep = json.loads(out)["keep"]
    assert keep["reason"] == "post-mortem" and keep["until"] is None and keep["kept_at"]
    code, out, _ = run_cli(db, monkeypatch, capsys, "explain", "--backend", BACKEND, ref)
    assert "kept by the operator" in out and "post-mortem" in out and "until released" in out
    code, out, _ = run_cli(db, monkeypatch, capsys, "explain", "--backend", BACKEND, other, "--json")
    assert json.loads(out)["keep"] is None

    facts = LedgerStore(db).digest_facts(report.cycle_id)
    d = digest(facts, 900)
    assert [g["provider_ref"] for g in d["kept"]] == [ref]
    assert d["kept"][0]["keep_reason"] == "post-mortem" and d["kept"][0]["kept_until"] is None
    assert d["kept"][0]["primary_id"] == vm and set(d["new_orphans"][0]) <= set(d["kept"][0])
    from orphan_cleanup.core.digest import slack_text

    assert "post-mortem" in slack_text(d)


def test_step_3_reads_the_keeps_in_force_in_its_one_statement(db):
    from datetime import timedelta

    from orphan_cleanup.ledger.session import LedgerSession
    from tests.support.ledger_helpers import CountingConnection, group, make_ref

    # given keeps: forever, until later, ended, of another backend, and of a ref no ledger row has
    add_backend(db, BACKEND)
    add_backend(db, "other")
    client = Platform(db, MemoryCloud()).ledger
    forever, later, ended, elsewhere = (client.issue_ref(owner_name=n).provider_ref for n in "abcd")
    unknown = make_ref()
    [[now]] = sql(db, "SELECT oc_clock()")
    for backend, ref, until in ((BACKEND, forever, None), (BACKEND, later, now + timedelta(hours=1)),
                                (BACKEND, ended, now - timedelta(seconds=1)), ("other", elsewhere, None),
                                (BACKEND, unknown, None)):
        sql(db, "INSERT INTO orphan_keeps (backend_id, provider_ref, reason, until) VALUES (:b, :r, 'x', :u)",
            b=backend, r=ref, u=until)
    groups = [group(r, f"i-{r}") for r in (forever, later, ended, elsewhere, unknown, make_ref())]

    # when a batch listed now is joined with the ledger
    with db.connection() as conn:
        counting = CountingConnection(conn)
        records, keeps = LedgerSession(counting).load_ledger(BACKEND, groups, now)

    # then one statement gave the records and the keeps in force at the listing time
    assert len(counting.statements) == 1
    assert set(records) == {forever, later, ended, elsewhere}
    assert set(keeps) == {forever, later, unknown, elsewhere}  # "other" is of the same account: a keep holds account-wide
    assert keeps[forever].until is None and keeps[later].until == now + timedelta(hours=1)
    assert keeps[forever].reason == "x" and keeps[forever].kept_at >= now


def test_the_end_of_a_keep_is_step_1_activity(db, cloud, platform, monkeypatch, capsys):
    """A released keep, or one whose time is up, makes the next scheduled run list (SAFETY.md
    rule 9): the group is judged again, not left until other activity comes."""
    ref, vm = recorded_leak(db, cloud, platform)
    assert run_cli(db, monkeypatch, capsys, "orphans", "keep", ref, "--backend", BACKEND, "--for", "1h")[0] == 0
    [[ends_in]] = sql(db, "SELECT at - oc_clock() FROM ledger_activity WHERE kind = 'keep_ends'")
    assert 3500 < ends_in.total_seconds() <= 3600
    sql(db, "DELETE FROM ledger_activity WHERE kind = 'keep_ends'")  # a keep without an end, as far as STEP 1 knows
    # margin 0: clean_at is the listing time, after every write so far
    scheduled = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=0), db=db, listing_queue=InProcessQueue(),
                         provider_for=lambda b: MemoryProvider(b, cloud), delete_queue=InProcessQueue())
    assert run_cycle(scheduled, BACKEND, mode="report").outcome == "clean"
    sql(db, "UPDATE cleanup SET next_due_at = oc_clock() - interval '1 s'")
    assert scheduled.run_lister(BACKEND).reason == "no_activity"

    assert run_cli(db, monkeypatch, capsys, "orphans", "release", ref, "--backend", BACKEND)[0] == 0
    sql(db, "UPDATE cleanup SET next_due_at = oc_clock() - interval '1 s'")
    started = scheduled.run_lister(BACKEND)
    assert started.reason == "activity" and started.cycle_id is not None
