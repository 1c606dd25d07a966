"""`orphan-cleanup explain` (issue #14 item 4) on real parts: the pipeline with the
in-memory cloud behind the real provider port, a real Postgres ledger, cycles
driven by ``runner.run_cycle`` (a manual run) or step by step. What each cycle
recorded is read back by ref and by resource id: the evidence behind the verdict,
the action, and what the deleter found on re-reading."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta

import pytest

from orphan_cleanup.cli import app as cli
from orphan_cleanup.cli import explain
from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY
from orphan_cleanup.core.errors import ConfigError, SchemaNotMigrated
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import drain, run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.explain import ExplainedGroup
from orphan_cleanup.ledger.migrate import available_migrations
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, add_volume, db_now, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

MARGIN = 300
BACKEND = "aws-a"
REGION = "us-east-1"
EVIDENCE_BUDGET = 600  # bytes of one group's stored evidence


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


@pytest.fixture
def cloud() -> MemoryCloud:
    return MemoryCloud()


def pipeline(db: Database, cloud: MemoryCloud) -> Pipeline:
    return Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=MARGIN,
                                       ORPHAN_CLEANUP_MAX_MODE="delete"), db=db,
                    provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def vm(cloud: MemoryCloud, ref: str, created_at: datetime, *, protect: bool = False,
       volume: bool = True) -> tuple[str, str | None]:
    tags = {"provider_ref": ref, **({DEFAULT_PROTECT_KEY: "yes"} if protect else {})}
    iid = cloud.create(ResourceKind.INSTANCE, REGION, tags, created_at=created_at)
    vol = cloud.create(ResourceKind.VOLUME, REGION, {"provider_ref": ref}, attached_to=iid,
                       created_at=created_at) if volume else None
    return iid, vol


def owner(db: Database, ref: str, *, status: str, primary: str, at: datetime,
          terminated_at: datetime | None = None, name: str = "train-7") -> str:
    _, owner_id = add_instance(db, ref=ref, name=name, status=status, backend_id=BACKEND, primary_id=primary,
                               region=REGION, issued_at=at, created_at=at, provisioned_at=at,
                               terminated_at=terminated_at)
    return owner_id


def stored_evidence(db: Database) -> dict[str, str]:
    """Each recorded group's evidence as the database holds it (JSON text), by group key."""
    with db.connection() as conn:
        return {k: e for k, e in conn.run("SELECT group_key, evidence::text FROM cycle_groups")}


def human(backend: str, query: str, groups: list[ExplainedGroup]) -> str:
    out = io.StringIO()
    explain.print_explained(backend, query, groups, stream=out)
    return out.getvalue()


def only(db: Database, query: str) -> dict:
    doc = explain.document(BACKEND, query, explain.explain(db, BACKEND, query))
    assert len(doc["cycles"]) == 1, doc
    return doc["cycles"][0]


# ---- a deleted orphan ---------------------------------------------------------------------------

def test_a_deleted_orphan_is_explained_by_its_terminated_owner_and_the_re_read(db, cloud):
    # given an owner terminated three hours before the listing, its VM and volume still there
    add_backend(db, BACKEND, mode="delete")
    start = db_now(db) - timedelta(hours=3)
    terminated_at = start + timedelta(minutes=10)
    ref = make_ref()
    iid, vol = vm(cloud, ref, start)
    owner_id = owner(db, ref, status="terminated", primary=iid, at=start, terminated_at=terminated_at)

    # when a delete cycle runs and the VM is explained by its id
    report = run_cycle(pipeline(db, cloud), BACKEND)
    got = only(db, iid)

    # then the verdict, its facts and the deletion are told
    assert not cloud.exists(iid) and not cloud.exists(vol)
    assert (got["cycle_id"], got["mode"]) == (report.cycle_id, "delete")
    assert (got["verdict"], got["reason"], got["action"]) == ("orphan", "owner_terminated", "deleted")
    ev = got["evidence"]
    assert ev["margin_seconds"] == MARGIN and ev["margin_applied"] is True
    assert ev["owner"] | {"times": None} == {
        "id": owner_id, "name": "train-7", "type": "instance", "row": "found", "status": "terminated",
        "backend_id": BACKEND, "backend_scope": "aws:123456789012", "this_backend_scope": None,
        "primary_id": iid, "times": None}
    term = ev["owner"]["times"]["terminated_at"]
    assert datetime.fromisoformat(term["at"]) == terminated_at and term["within_margin"] is False
    assert term["seconds_before_listed_at"] == pytest.approx((report.listed_at - terminated_at).total_seconds())
    assert [(r["id"], r["ref_tag"], r["protect_tag"]) for r in ev["resources"]] == [
        (iid, ref, False), (vol, ref, False)]
    assert got["detail"].startswith(f"owner {owner_id} terminated 2h50m before listing")
    assert got["delete"]["state"] == "done" and got["delete"]["result"]["status"] == "deleted"
    assert set(got["delete"]["result"]["deleted"]) == {iid, vol}
    assert "still an orphan" in got["delete"]["found"] and "same ref, no protect tag" in got["delete"]["found"]
    assert "termination confirmed" in got["delete"]["found"]
    # and the volume's id and the ref find the same group; the human block says it in words
    assert only(db, vol)["group"] == got["group"] == only(db, ref)["group"]
    text = human(BACKEND, iid, explain.explain(db, BACKEND, iid))
    assert "terminated_at  " in text and "before listed_at - margin: old enough" in text
    assert "delete    done: ledger re-read under the gate: still an orphan" in text


def test_evidence_stays_small_even_for_a_long_owner_name(db, cloud):
    add_backend(db, BACKEND, mode="delete")
    start = db_now(db) - timedelta(hours=3)
    ref = make_ref()
    iid, _ = vm(cloud, ref, start)
    owner(db, ref, status="terminated", primary=iid, at=start, terminated_at=start, name="n" * 500)

    run_cycle(pipeline(db, cloud), BACKEND)

    [(key, text)] = stored_evidence(db).items()
    assert len(text.encode()) < EVIDENCE_BUDGET, text
    stored = json.loads(text)
    assert len(stored["on"]) == 64 and None not in stored.values()
    assert set(stored["t"]) == {"is", "cr", "pr", "te"}  # deleted_at is null: left out


# ---- a kept VM and a retry leak -----------------------------------------------------------------

def retry_leak(db: Database, cloud: MemoryCloud) -> tuple[str, str, str, str]:
    """A live owner whose first attempt leaked: (ref, owner, leaked VM, kept VM)."""
    provisioned = db_now(db) - timedelta(hours=2)
    ref = make_ref()
    leaked, _ = vm(cloud, ref, provisioned - timedelta(minutes=3), volume=False)
    kept, _ = vm(cloud, ref, provisioned, volume=False)
    return ref, owner(db, ref, status="busy", primary=kept, at=provisioned), leaked, kept


def test_a_manual_run_records_the_kept_vm_and_explains_both_groups_of_the_ref(db, cloud):
    add_backend(db, BACKEND)  # report mode
    ref, owner_id, leaked, kept = retry_leak(db, cloud)

    report = run_cycle(pipeline(db, cloud), BACKEND)

    tracked = only(db, kept)
    assert (tracked["verdict"], tracked["reason"], tracked["action"]) == ("tracked", "tracked", "none")
    assert tracked["evidence"]["owner"]["primary_id"] == kept and tracked["evidence"]["owner"]["status"] == "busy"
    assert tracked["evidence"]["margin_applied"] is False and tracked["delete"] is None
    assert tracked["detail"] is None  # a tracked VM has nothing to add to run --json
    by_ref = explain.document(BACKEND, ref, explain.explain(db, BACKEND, ref))["cycles"]
    assert {(c["cycle_id"], c["group"]["primary_id"], c["reason"]) for c in by_ref} == {
        (report.cycle_id, leaked, "primary_mismatch"), (report.cycle_id, kept, "tracked")}
    lost = next(c for c in by_ref if c["group"]["primary_id"] == leaked)
    assert lost["action"] == "reported"
    assert lost["evidence"]["copy_check"] == ("this VM was created 3m before the owner's provisioning"
                                              " (margin 5m): a lost attempt")
    assert lost["detail"] == f"owner {owner_id} records {kept}; {lost['evidence']['copy_check']}"


def test_a_leak_whose_owner_took_it_over_before_the_delete_is_left_in_place_and_says_why(db, cloud):
    # given a delete cycle that classified the leaked VM as an orphan and queued its delete
    add_backend(db, BACKEND, mode="delete")
    ref, owner_id, leaked, kept = retry_leak(db, cloud)
    p = pipeline(db, cloud)
    p.run_lister(BACKEND, manual=True)
    while (body := p.listing_queue.pop()) is not None:
        p.handle_batch(ListingBatch.model_validate_json(body))
    [request] = [DeleteRequest.model_validate_json(b) for b in p.delete_queue.items]
    # when the platform records the leaked VM as the owner's primary before the deleter runs
    with db.connection() as conn:
        conn.run("UPDATE instances SET primary_id = :p WHERE id = :i", p=leaked, i=owner_id)
    drain(p)

    # then the VM is kept, and explain tells the classification and the deleter's re-read apart
    assert cloud.exists(leaked) and request.group.primary_id == leaked
    got = only(db, leaked)
    assert (got["verdict"], got["reason"], got["action"]) == ("orphan", "primary_mismatch", "reported")
    assert got["delete"]["state"] == "skipped" and got["delete"]["skipped_reason"] == "owner_changed:tracked"
    assert got["delete"]["found"] == ("ledger re-read under the gate: the owner changed since the listing"
                                      " (now tracked): nothing deleted")


def test_a_copy_made_after_the_owners_provisioning_is_protected_and_shown_as_a_copy(db, cloud):
    add_backend(db, BACKEND, mode="delete")
    provisioned = db_now(db) - timedelta(hours=5)
    ref = make_ref()
    kept, _ = vm(cloud, ref, provisioned, volume=False)
    copy, _ = vm(cloud, ref, provisioned + timedelta(hours=2), volume=False)  # "launch more like this"
    owner(db, ref, status="idle", primary=kept, at=provisioned)

    run_cycle(pipeline(db, cloud), BACKEND)

    got = only(db, copy)
    assert cloud.exists(copy)
    assert (got["verdict"], got["reason"], got["action"], got["delete"]) == (
        "protected", "suspected_copy", "reported", None)
    assert got["evidence"]["copy_check"].endswith("created 2h after the owner's provisioning (margin 5m): a copy")


# ---- protected, skipped, not recorded -------------------------------------------------------------

def test_a_protect_tag_is_named_with_the_resource_that_carries_it(db, cloud):
    add_backend(db, BACKEND, mode="delete")
    start = db_now(db) - timedelta(hours=3)
    ref = make_ref()
    iid, vol = vm(cloud, ref, start, protect=True)
    owner(db, ref, status="terminated", primary=iid, at=start, terminated_at=start)

    run_cycle(pipeline(db, cloud), BACKEND)

    got = only(db, ref)
    assert cloud.exists(iid) and cloud.exists(vol)
    assert (got["verdict"], got["reason"], got["action"], got["delete"]) == (
        "protected", "protect_tag", "reported", None)
    assert got["evidence"]["protected"] == [iid]
    assert [r["protect_tag"] for r in got["evidence"]["resources"]] == [True, False]
    assert got["detail"] == f"{iid} carries {DEFAULT_PROTECT_KEY}"
    assert f"tags      provider_ref={ref} on every resource; {DEFAULT_PROTECT_KEY} on {iid}" in human(
        BACKEND, ref, explain.explain(db, BACKEND, ref))


def test_an_owner_terminated_within_the_margin_is_skipped_and_the_time_is_shown_as_recent(db, cloud):
    add_backend(db, BACKEND, mode="delete")
    start = db_now(db) - timedelta(hours=3)
    ref = make_ref()
    iid, _ = vm(cloud, ref, start, volume=False)
    owner(db, ref, status="terminated", primary=iid, at=start, terminated_at=db_now(db) - timedelta(seconds=30))

    run_cycle(pipeline(db, cloud), BACKEND)

    got = only(db, iid)
    assert cloud.exists(iid)
    assert (got["verdict"], got["reason"], got["action"]) == ("skipped", "recent_owner_change", "none")
    times = got["evidence"]["owner"]["times"]
    assert times["terminated_at"]["within_margin"] is True and times["issued_at"]["within_margin"] is False
    assert "terminated_at" in got["detail"] and "within the 5m margin" in got["detail"]
    text = human(BACKEND, iid, explain.explain(db, BACKEND, iid))
    assert "after listed_at - margin: within the margin" in text


def test_scheduled_cycles_record_no_tracked_group_and_only_the_latest_five_cycles_are_shown(db, cloud):
    add_backend(db, BACKEND)
    ref, _, leaked, kept = retry_leak(db, cloud)
    p = pipeline(db, cloud)

    def cycles_of(query: str) -> list[str]:
        return [c["cycle_id"] for c in explain.document(BACKEND, query, explain.explain(db, BACKEND, query))["cycles"]]

    # a scheduled cycle (never cleaned: it lists) records the orphan, not the tracked VM
    scheduled = p.run_lister(BACKEND)
    drain(p)
    assert scheduled.cycle_id and cycles_of(leaked) == [scheduled.cycle_id] and cycles_of(kept) == []
    # manual runs record every group; explain shows the latest five, newest first
    manual = [run_cycle(p, BACKEND).cycle_id for _ in range(6)]
    assert cycles_of(kept) == cycles_of(leaked) == manual[::-1][:5]
    assert len(cycles_of(ref)) == 10  # five cycles, two groups of the ref in each


def test_a_row_classified_before_migration_0008_is_shown_without_evidence(db, cloud):
    add_backend(db, BACKEND)
    ref, _, leaked, _ = retry_leak(db, cloud)
    run_cycle(pipeline(db, cloud), BACKEND)
    with db.connection() as conn:
        conn.run("UPDATE cycle_groups SET evidence = NULL")

    got = only(db, leaked)
    assert (got["reason"], got["evidence"], got["detail"]) == ("primary_mismatch", None, None)
    assert "evidence  not recorded (classified before migration 0008)" in human(
        BACKEND, leaked, explain.explain(db, BACKEND, leaked))


def test_an_unknown_backend_is_bad_input_and_nothing_recorded_is_an_empty_answer(db, cloud):
    add_backend(db, BACKEND)
    with pytest.raises(ConfigError, match="unknown backend 'nope'"):
        explain.explain(db, "nope", "i-1")
    assert explain.explain(db, BACKEND, "i-never-listed") == []
    assert explain.explain(db, BACKEND, make_ref()) == []


def test_a_removed_backends_recorded_history_is_still_explained(db, cloud):
    # given a backend whose cycles recorded a leak, then removed (its history stays for audit)
    add_backend(db, BACKEND)
    _, _, leaked, _ = retry_leak(db, cloud)
    cycle_id = run_cycle(pipeline(db, cloud), BACKEND).cycle_id
    with db.connection() as conn:
        conn.run("DELETE FROM backends WHERE id = :b", b=BACKEND)

    got = only(db, leaked)
    assert (got["cycle_id"], got["reason"]) == (cycle_id, "primary_mismatch")


# ---- the command: exit codes, read-only ------------------------------------------------------------

def run_cli(db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("DATABASE_URL", db.info.url())
    code = cli.main(["explain", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_exits_0_found_1_nothing_recorded_2_unknown_backend(db, cloud, monkeypatch, capsys):
    add_backend(db, BACKEND)
    _, _, leaked, _ = retry_leak(db, cloud)
    run_cycle(pipeline(db, cloud), BACKEND)

    code, out, err = run_cli(db, monkeypatch, capsys, "--backend", BACKEND, leaked, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) == {"backend", "query", "cycles", "journal", "ignored_settings", "keep"} and (doc["backend"], doc["query"]) == (BACKEND, leaked)
    assert set(doc["cycles"][0]) == {"cycle_id", "listed_at", "mode", "group", "verdict", "reason", "action",
                                     "detail", "evidence", "delete"}

    code, out, err = run_cli(db, monkeypatch, capsys, "--backend", BACKEND, "i-never-listed")
    assert (code, out) == (1, "") and err.startswith("orphan-cleanup: nothing recorded") and "never listed" in err

    code, out, err = run_cli(db, monkeypatch, capsys, "--backend", "nope", leaked)
    assert (code, out) == (2, "") and err == ("orphan-cleanup: error: unknown backend 'nope'"
                                              " (see `orphan-cleanup backend list`)\n")


# ---- an id no cycle recorded: exit 1 with the reason that is true --------------------------------

def nothing_recorded(db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                     query: str) -> str:
    code, out, err = run_cli(db, monkeypatch, capsys, "--backend", BACKEND, query)
    assert (code, out) == (1, ""), err
    assert err.startswith(f"orphan-cleanup: nothing recorded for {query!r} by the cycles of backend {BACKEND}:")
    assert "Traceback" not in err
    return err


def test_an_untagged_vm_after_a_manual_run_was_never_listed_and_the_message_says_so(db, cloud, monkeypatch, capsys):
    # given a manual run (it records every group it lists) and a VM without the ref tag
    add_backend(db, BACKEND)
    retry_leak(db, cloud)
    untagged = cloud.create(ResourceKind.INSTANCE, REGION, {"Name": "by-hand"})
    manual = run_cycle(pipeline(db, cloud), BACKEND).cycle_id

    err = nothing_recorded(db, monkeypatch, capsys, untagged)

    assert f"never listed: the latest manual run (cycle {manual}" in err
    assert "a resource without a 'provider_ref' tag is never listed" in err
    assert f"the ledger: no owner records {untagged} as its primary_id" in err
    # not the untrue reason: a manual run records tracked and ignored groups too
    assert "scheduled cycles record only" not in err and "manual runs only" not in err


def test_a_tracked_vm_that_only_scheduled_cycles_listed_is_said_to_be_unrecorded_by_them(db, cloud, monkeypatch,
                                                                                        capsys):
    # given only a scheduled cycle: it records the leak, not the tracked VM
    add_backend(db, BACKEND)
    ref, owner_id, leaked, kept = retry_leak(db, cloud)
    p = pipeline(db, cloud)
    p.run_lister(BACKEND)
    drain(p)

    err = nothing_recorded(db, monkeypatch, capsys, kept)

    assert "scheduled cycles record only orphan, protected and skipped groups: 1 of them listed so far" in err
    assert f"no manual run of {BACKEND} has listed yet" in err
    assert f"owner {owner_id} \"train-7\" (status busy, primary_id {kept}, backend {BACKEND}) records {kept}" in err
    assert "never listed" not in err  # nothing says so: no manual run listed everything


def test_an_unrecorded_volume_id_names_its_volume_owner(db, cloud, monkeypatch, capsys):
    # given volume owners (README, C1): one active recording vol-0kept, one whose volumes row is gone
    add_backend(db, BACKEND)
    ref, owner_id = add_volume(db, name="dataset-7", backend_id=BACKEND, primary_id="vol-0kept", region=REGION)
    gone_ref, gone_owner = add_volume(db)
    with db.connection() as conn:
        conn.run("DELETE FROM volumes WHERE id = :i", i=gone_owner)

    # then explain of the volume's id and of the gone owner's ref name them from the volumes table
    err = nothing_recorded(db, monkeypatch, capsys, "vol-0kept")
    assert f"owner {owner_id} \"dataset-7\" (status active, primary_id vol-0kept, backend {BACKEND})" \
           f" records vol-0kept as its primary_id (ref {ref})" in err
    err = nothing_recorded(db, monkeypatch, capsys, gone_ref)
    assert f"the ledger: ref {gone_ref} belongs to owner {gone_owner}, whose volumes row is gone (hard-deleted)" in err


def test_a_ref_the_ledger_never_issued_and_a_backend_that_never_listed_say_so(db, cloud, monkeypatch, capsys):
    add_backend(db, BACKEND)
    foreign = make_ref()

    err = nothing_recorded(db, monkeypatch, capsys, foreign)

    assert f"no cycle of {BACKEND} has finished a listing yet: `orphan-cleanup run --backend {BACKEND}`" in err
    assert f"the ledger has no ref {foreign} (provider_refs)" in err


def test_a_manual_run_that_could_not_list_a_region_says_that_region_was_not_seen(db, cloud, monkeypatch, capsys):
    add_backend(db, BACKEND, regions=(REGION, "eu-west-1"))
    retry_leak(db, cloud)
    cloud.failing_regions = {"eu-west-1"}
    run_cycle(pipeline(db, cloud), BACKEND)

    err = nothing_recorded(db, monkeypatch, capsys, "i-elsewhere")

    assert "that run could not list eu-west-1: what is there was not seen" in err


def test_created_lines_keep_every_id_shape_apart_from_its_date(db, cloud):
    # given a group whose resources carry a long AWS id, a GCP numeric id and a GCP name
    add_backend(db, BACKEND)
    at = db_now(db) - timedelta(hours=2)
    ref = make_ref()
    ids = ["i-0123456789abcdef0", "8412390582343123456", "a-rather-long-gcp-disk-name-of-a-job"]
    made = [cloud.create(ResourceKind.INSTANCE, REGION, {"provider_ref": ref}, created_at=at)]
    made += [cloud.create(ResourceKind.VOLUME, REGION, {"provider_ref": ref}, attached_to=made[0], created_at=at)
             for _ in ids[1:]]
    for old, new in zip(made, ids, strict=True):
        res = cloud.resources.pop(old)
        res.id = new
        res.attached_to = ids[0] if res.attached_to else None
        cloud.resources[new] = res
    owner(db, ref, status="terminated", primary=ids[0], at=at, terminated_at=at)
    run_cycle(pipeline(db, cloud), BACKEND)

    text = human(BACKEND, ids[0], explain.explain(db, BACKEND, ids[0]))

    dated = [line for line in text.splitlines() if re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ is ", line)
             and not line.startswith("  margin")]
    for rid in ids:
        assert re.search(rf"{re.escape(rid)}  +\d{{4}}-\d\d-\d\d ", text), text  # two spaces at least
    columns = {line.index(re.search(r"\d{4}-\d\d-\d\d \d\d", line).group(0)) for line in dated}
    assert len(dated) >= 4 and len(columns) == 1, text  # every time, owner's and resources', starts in one column


NOT_MIGRATED = f"orphan-cleanup: error: {SchemaNotMigrated.MESSAGE}\n"


def test_the_command_never_migrates_an_empty_database(empty_db, monkeypatch, capsys):
    code, out, err = run_cli(empty_db, monkeypatch, capsys, "--backend", BACKEND, "i-1")

    assert (code, out, err) == (2, "", NOT_MIGRATED)
    with empty_db.connection() as conn:  # no DDL ran: not even schema_migrations exists
        assert conn.run("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [[0]]


def test_a_database_without_migration_0008_is_not_migrated_for_explain(empty_db, monkeypatch, capsys):
    # given a ledger migrated by the previous version (up to 0007: no evidence column)
    with empty_db.transaction() as conn:
        conn.run("CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                 " applied_at timestamptz NOT NULL DEFAULT now())")
        for version, name, sql in available_migrations():
            if version < 8:
                conn.run(sql)
                conn.run("INSERT INTO schema_migrations (version, name) VALUES (:v, :n)", v=version, n=name)
    add_backend(empty_db, BACKEND)

    # then explain says so, through the command and through the read itself
    assert run_cli(empty_db, monkeypatch, capsys, "--backend", BACKEND, "i-1") == (2, "", NOT_MIGRATED)
    with pytest.raises(SchemaNotMigrated):
        explain.explain(empty_db, BACKEND, "i-1")
    with empty_db.connection() as conn:
        assert conn.run("SELECT max(version) FROM schema_migrations") == [[7]]


def test_a_leak_the_provider_dates_otherwise_than_its_listing_is_left_in_place_and_says_why(db, cloud):
    # given a delete cycle that classified the leaked VM as an orphan and queued its delete
    add_backend(db, BACKEND, mode="delete")
    ref, owner_id, leaked, kept = retry_leak(db, cloud)
    p = pipeline(db, cloud)
    p.run_lister(BACKEND, manual=True)
    while (body := p.listing_queue.pop()) is not None:
        p.handle_batch(ListingBatch.model_validate_json(body))
    # when the provider reports another creation time than the listing recorded (SAFETY.md rule 17)
    cloud.resources[leaked].created_at += timedelta(hours=2)
    drain(p)

    # then the VM is kept, and explain says the deleter's re-read found another time
    assert cloud.exists(leaked)
    got = only(db, leaked)
    assert (got["verdict"], got["reason"]) == ("orphan", "primary_mismatch")
    assert got["delete"]["skipped_reason"] == "owner_changed:created_at_changed"
    assert got["delete"]["found"] == ("re-read by id under the gate: the provider does not report the VM created"
                                      " when the listing says (gone, or another time): nothing deleted")
