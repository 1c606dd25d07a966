"""One database role per function (infra/postgres/roles.sql, docs/DATABASE.md "One role per
function"), on a real Postgres: roles.sql, migrate as the owner, roles.sql again; then the
pipeline with the lister, the classifier and the deleter each connected as its own role.
Each role is refused the writes its function does not make, and a whole delete cycle still
completes. The grants table of DATABASE.md is compared with pg_catalog.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import delete_all, in_process_queues
from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_db_roles import PLATFORM_DDL, PSQL, Ledger, _drop, _new_ledger, denied, ok
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")
DATABASE_MD = Path(__file__).resolve().parents[2] / "docs" / "DATABASE.md"
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")


@pytest.fixture(scope="module")
def ledger(pg_server) -> Iterator[Ledger]:
    ledger = _new_ledger(pg_server)
    try:
        ledger.admin_run(*PLATFORM_DDL, role=ledger.platform)
        vars_ = dict(platform_role=ledger.platform, c1_owner=ledger.platform, revoke_public="on")
        ok(ledger.roles_sql(**vars_))
        migrate(ledger.db(ledger.owner))
        ok(ledger.roles_sql(**vars_))
        yield ledger
    finally:
        _drop(ledger)


def role(ledger: Ledger, fn: str) -> Database:
    return ledger.db(ledger.functions[fn])


def test_each_function_runs_as_its_own_role_and_a_delete_cycle_completes(ledger):
    cloud = MemoryCloud()
    # given a backend (the operator's) and a ledger the platform writes as its own role
    add_backend(ledger.db(ledger.owner))
    platform = Platform(ledger.db(ledger.platform), cloud)
    _, _, tracked = platform.tracked()
    _, _, leaked = platform.terminated_leak()
    _, _, placeholder = platform.placeholder_leak(region="r2")
    # and three functions sharing the queues, each on its own role's connection:
    # when the lister lists, the classifier classifies and the deleter deletes
    pipelines, started, requests = classified_delete_cycle(ledger, cloud, "mem")
    assert started.started
    assert len(requests) == 2
    outcomes = list(delete_all(pipelines["deleter"], requests))

    # then exactly the orphans are gone, and the cycle finished clean (its STEP 7 applied)
    assert len(outcomes) == 2
    assert cloud.exists(tracked) and not cloud.exists(leaked) and not cloud.exists(placeholder)
    report = LedgerStore(ledger.db(ledger.owner)).cycle_report(started.cycle_id)
    assert report.outcome == "clean"
    with ledger.db(ledger.owner).connection() as conn:
        # the definer wrote the region baselines the finishing function may not write
        assert conn.run("SELECT count(*) FROM region_listings WHERE clean_cycle_id = :c", c=started.cycle_id) \
            == [[2]]
        assert conn.run("SELECT count(*) FROM provider_journal WHERE cycle_id = :c", c=started.cycle_id)[0][0] >= 4
    # and a finished cycle adds no known orphan resources, not even under the group it deleted
    with ledger.db(ledger.owner).connection() as conn:
        keys = dict(conn.run("SELECT verdict, group_key FROM cycle_groups WHERE cycle_id = :c"
                             " AND verdict IN ('orphan', 'tracked')", c=started.cycle_id))
    with role(ledger, "deleter").transaction() as conn:
        def record(key: str) -> int:
            return conn.run("SELECT oc_record_orphan_resources(:c, :k, ARRAY['vol-0seen'])",
                            c=started.cycle_id, k=key)[0][0]

        assert record(keys["tracked"]) == 0 and record("no-such-group") == 0
        assert record(keys["orphan"]) == 0
    for p in pipelines.values():
        p.db.close()


def classified_delete_cycle(ledger: Ledger, cloud: MemoryCloud, backend: str) -> tuple[dict, Any, list]:
    """A manual delete cycle of ``backend`` listed by the lister's role and classified by the
    classifier's, each function on its own connection: the pipelines, the lister's result and the
    delete requests the classifier queued (none handled yet)."""
    listing, deletes = InProcessQueue(), InProcessQueue()
    pipelines = {fn: Pipeline(settings=Settings.explicit(confirm_seconds=0), db=role(ledger, fn), listing_queue=listing,
                              delete_queue=deletes, provider_for=lambda b: MemoryProvider(b, cloud))
                 for fn in ("lister", "classifier", "deleter")}
    started = pipelines["lister"].run_lister(backend, mode="delete", manual=True)
    lq, dq = in_process_queues(pipelines["classifier"])
    while (body := lq.pop()) is not None:
        pipelines["classifier"].handle_batch(ListingBatch.model_validate_json(body))
    requests = []
    while (body := dq.pop()) is not None:
        requests.append(DeleteRequest.model_validate_json(body))
    return pipelines, started, requests


def _open_delete_cycle(ledger: Ledger, backend: str) -> dict:
    """A delete cycle of ``backend`` run by the three roles, the deleter having handled one of
    its two requests (a terminated owner's VM, with its volume): the cycle is still open."""
    cloud = MemoryCloud()
    add_backend(ledger.db(ledger.owner), backend_id=backend)
    platform = Platform(ledger.db(ledger.platform), cloud, backend_id=backend)
    _, _, live_vm = platform.tracked()
    [live_volume] = [r.id for r in cloud.resources.values() if r.attached_to == live_vm]
    cloud.detach(live_volume)  # a live owner's detached volume
    leak_ref, _, leak_vm = platform.terminated_leak()
    [leak_volume] = [r.id for r in cloud.resources.values() if r.attached_to == leak_vm]
    platform.placeholder_leak(region="r2")
    pipelines, started, requests = classified_delete_cycle(ledger, cloud, backend)
    [leak] = [r for r in requests if r.group.primary_id == leak_vm]
    [other] = [r for r in requests if r is not leak]
    assert list(delete_all(pipelines["deleter"], [leak])) and not cloud.exists(leak_vm)
    with ledger.db(ledger.owner).connection() as conn:
        tracked_key = conn.run("SELECT group_key FROM cycle_groups WHERE cycle_id = :c AND verdict = 'tracked'",
                               c=started.cycle_id)[0][0]
    return dict(cloud=cloud, pipelines=pipelines, cycle=started.cycle_id, backend=backend, leak=leak, other=other,
                leak_ref=leak_ref, leak_volume=leak_volume, live_volume=live_volume, tracked_key=tracked_key)


def test_the_deleter_adds_known_orphan_resources_only_as_its_open_cycles_journal_shows(ledger):
    # docs/DATABASE.md, "One role per function"; SAFETY.md rule 12: only what the deleter's
    # re-read showed attached to an orphan VM it deleted, in its own cycle, while it is open
    s = _open_delete_cycle(ledger, "mem-known")
    owner = ledger.db(ledger.owner)

    def known() -> list[list[str]]:
        with owner.connection() as conn:
            return conn.run("SELECT provider_ref, resource_id FROM orphan_resources WHERE backend_id = :b",
                            b=s["backend"])

    def forget() -> None:
        with owner.transaction() as conn:
            conn.run("DELETE FROM orphan_resources WHERE backend_id = :b", b=s["backend"])

    def record(key: str, rid: str) -> int:
        with role(ledger, "deleter").transaction() as conn:
            return conn.run("SELECT oc_record_orphan_resources(:c, :k, ARRAY[CAST(:r AS text)])",
                            c=s["cycle"], k=key, r=rid)[0][0]

    # the real deletion recorded the leak VM's volume, through the definer's function
    assert known() == [[s["leak_ref"], s["leak_volume"]]]
    # a live owner's detached volume, or an id its journal never saw, is not the leak's
    assert record(s["leak"].group.key, s["live_volume"]) == 0
    assert record(s["leak"].group.key, "vol-0notinthejournal") == 0
    # nor anything under a group not deleted yet (its request is still queued)
    assert record(s["other"].group.key, s["leak_volume"]) == 0
    # the real id, after the real delete, while the cycle is open
    forget()
    assert record(s["leak"].group.key, s["leak_volume"]) == 1
    # once the cycle finished, nothing more, not even that id
    assert list(delete_all(s["pipelines"]["deleter"], [s["other"]]))
    assert LedgerStore(owner).cycle_report(s["cycle"]).outcome == "clean"
    forget()
    assert record(s["leak"].group.key, s["leak_volume"]) == 0
    assert record(s["leak"].group.key, s["live_volume"]) == 0
    assert known() == []
    for p in s["pipelines"].values():
        p.db.close()


def test_the_deleter_sets_no_verdict_but_protected_and_requeues_no_request(ledger):
    # docs/DATABASE.md, "One role per function": a verdict other than protected, or a request
    # queued again, would make the deleter delete what the classifier never asked it to
    s = _open_delete_cycle(ledger, "mem-verdict")
    c, b, leak, tracked = s["cycle"], s["backend"], s["leak"].group.key, s["tracked_key"]
    for sql in [f"UPDATE cycle_groups SET verdict = 'orphan' WHERE cycle_id = '{c}' AND group_key = '{tracked}'",
                f"UPDATE cycle_groups SET reason = 'x' WHERE cycle_id = '{c}' AND group_key = '{leak}'",
                f"UPDATE delete_requests SET state = 'queued' WHERE cycle_id = '{c}' AND group_key = '{leak}'",
                f"UPDATE orphans SET reason = 'x' WHERE backend_id = '{b}' AND group_key = '{leak}'"]:
        denied(role(ledger, "deleter"), sql)
    # what its code does: a protection found during the deletion; the classifier's verdict again
    allowed = [f"UPDATE cycle_groups SET verdict = 'protected', reason = 'x' WHERE cycle_id = '{c}'"
               f" AND group_key = '{leak}'",
               f"UPDATE orphans SET verdict = 'protected', reason = 'x' WHERE backend_id = '{b}'"
               f" AND group_key = '{leak}'",
               f"UPDATE orphans o SET verdict = g.verdict, reason = g.reason FROM cycle_groups g"
               f" WHERE o.backend_id = '{b}' AND o.group_key = '{leak}' AND g.cycle_id = '{c}'"
               f" AND g.group_key = o.group_key"]
    requeue = [f"UPDATE delete_requests SET state = 'queued' WHERE cycle_id = '{c}' AND group_key = '{leak}'",
               f"UPDATE cycle_groups SET verdict = 'orphan' WHERE cycle_id = '{c}' AND group_key = '{tracked}'"]
    # the runtime role may also do what the classifier's inserts and a manual run do
    for who, sqls in (("deleter", allowed), ("runtime", allowed + requeue)):
        conn = connect(ledger.info(ledger.runtime if who == "runtime" else ledger.functions[who]))
        try:
            conn.run("BEGIN")
            for sql in sqls:
                assert conn.run(sql + " RETURNING 1") == [[1]], (who, sql)
            conn.run("ROLLBACK")
        finally:
            conn.close()
    for p in s["pipelines"].values():
        p.db.close()


# What each role may not write: the forgeries the deleter would trust, the audit trail.
REFUSED = {
    "lister": [
        "INSERT INTO orphan_resources (backend_id, resource_id) VALUES ('mem', 'vol-0forged')",
        "INSERT INTO delete_requests (cycle_id, group_key) VALUES ('x', 'y')",
        "INSERT INTO cycle_groups (cycle_id, group_key) VALUES ('x', 'y')",
        "UPDATE orphans SET reason = 'x'",
        "DELETE FROM delete_gates",
        "INSERT INTO provider_journal (phase, call, target) VALUES ('intent', 'x', 'y')",
        "SELECT oc_apply_batch('{}'::jsonb)",
    ],
    "classifier": [
        "INSERT INTO cycles (id, backend_id, fence, mode) VALUES ('x', 'mem', 1, 'delete')",
        "UPDATE cycles SET mode = 'delete'",
        "DELETE FROM delete_gates",
        "UPDATE delete_requests SET state = 'done'",
        "INSERT INTO provider_journal (phase, call, target) VALUES ('intent', 'x', 'y')",
        "INSERT INTO region_listings (backend_id, region) VALUES ('mem', 'x')",
        "INSERT INTO orphan_resources (backend_id, provider_ref, resource_id) VALUES ('mem', 'x', 'vol-0forged')",
        "UPDATE cycles SET region_groups = '{}'::jsonb",
        "UPDATE cycle_groups SET provider_ref = 'x'",
    ],
    "deleter": [
        "INSERT INTO orphan_resources (backend_id, resource_id) VALUES ('mem', 'vol-0forged')",
        "INSERT INTO delete_requests (cycle_id, group_key) VALUES ('x', 'y')",
        "INSERT INTO cycle_groups (cycle_id, group_key) VALUES ('x', 'y')",
        "INSERT INTO orphans (backend_id, provider_ref) VALUES ('mem', 'aaaaaaaaaaaa')",
        "INSERT INTO cycles (id, backend_id, fence, mode) VALUES ('x', 'mem', 1, 'delete')",
        "UPDATE cycles SET backend_snapshot = '{}'::jsonb",
        "INSERT INTO region_listings (backend_id, region) VALUES ('mem', 'x')",
        "SELECT oc_apply_batch('{}'::jsonb)",
        "UPDATE cycles SET region_groups = '{}'::jsonb",
        "UPDATE cycle_groups SET provider_ref = 'x'",
        "UPDATE cycle_groups SET resources = '[]'::jsonb",
        "UPDATE orphans SET resources = '[]'::jsonb",
        "UPDATE delete_requests SET cycle_id = 'x'",
        "UPDATE cleanup SET fence = fence + 1",
        "UPDATE delete_gates SET provider_ref = 'x'",
    ],
}
NOBODY = ["UPDATE events SET kind = 'x'", "DELETE FROM events", "UPDATE provider_journal SET outcome = 'ok'",
          "DELETE FROM provider_journal", "DELETE FROM orphan_resources", "UPDATE cycle_batches SET seq = 0",
          "UPDATE backends SET mode = 'delete'", "INSERT INTO provider_refs (provider_ref) VALUES ('zzzzzzzzzzzz')",
          "DELETE FROM ledger_activity", "TRUNCATE delete_gates", "CREATE TABLE oc_intruder (id int)"]


def _cycle_failed(ledger: Ledger, cycle_id: str) -> list[list[str]]:
    with ledger.db(ledger.owner).connection() as conn:
        return conn.run("SELECT backend_id, message FROM events WHERE kind = 'cycle_failed' AND cycle_id = :c",
                        c=cycle_id)


def test_every_path_that_fails_a_cycle_records_why_as_the_function_that_fails_it(ledger):
    # README, "When one fires": `events` tells why a cycle failed (a `cycle_failed` row with the
    # one-line reason that `status` shows), whichever function failed it, under its own role

    from orphan_cleanup.core.listing import RegionFailure
    from orphan_cleanup.core.verdicts import Outcome
    from orphan_cleanup.cycle.cycle_state import fail_cycle, record_delete, start_cycle
    from tests.support.ledger_helpers import limits

    lim = limits()
    lister = LedgerStore(role(ledger, "lister"))
    add_backend(ledger.db(ledger.owner), backend_id="mem-fails")
    # a listing that failed in its only region: the reason names the region and its error
    now = datetime.now(UTC)
    cycle = start_cycle(lister, "mem-fails", "report", lim, manual=True, now=now).cycle
    assert fail_cycle(lister, cycle.id, "no region could be listed", lim, now,
                      failures=[RegionFailure(region="r1", error="AccessDenied: no\nsecond line")]) is Outcome.FAILED
    assert _cycle_failed(ledger, cycle.id) == [["mem-fails", "no region could be listed: r1: AccessDenied: no"
                                                              " second line"]]
    # a cycle whose lease expired, failed by the next scheduled start
    stuck = start_cycle(lister, "mem-fails", "report", lim, manual=True, now=now).cycle
    later = start_cycle(lister, "mem-fails", "report", lim, manual=True,
                        now=now + timedelta(seconds=lim.cycle_deadline_seconds + 1)).cycle
    assert later is not None and later.id != stuck.id
    assert _cycle_failed(ledger, stuck.id) == [["mem-fails", "cycle did not complete before its deadline"]]
    # a deletion that failed, recorded by the deleter: the reason names the ref and the region
    s = _open_delete_cycle(ledger, "mem-delete-fails")
    group = s["other"].group
    assert record_delete(LedgerStore(role(ledger, "deleter")), s["cycle"], group, lim,
                         error="AccessDenied: not allowed") is Outcome.FAILED
    assert _cycle_failed(ledger, s["cycle"]) == [[
        "mem-delete-fails", f"delete of {group.provider_ref} in {group.region} failed: AccessDenied: not allowed"]]
    for p in s["pipelines"].values():
        p.db.close()


@pytest.mark.parametrize("fn, sql", [(fn, sql) for fn, sqls in REFUSED.items() for sql in sqls]
                         + [(fn, sql) for fn in REFUSED for sql in NOBODY])
def test_each_role_is_refused_the_writes_its_function_does_not_make(ledger, fn, sql):
    denied(role(ledger, fn), sql)


def documented_grants() -> dict[str, dict[str, set[str]]]:
    """DATABASE.md's grants table: table -> role column -> privileges."""
    text = DATABASE_MD.read_text(encoding="utf-8").split("<!-- grants table -->", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.strip().splitlines()]
    header, body = rows[0], rows[2:]
    out: dict[str, dict[str, set[str]]] = {}
    for cells in body:
        table = cells[0].strip("`")
        out[table] = {who: {p.strip() for p in cell.split(",") if p.strip() and p.strip() != "-"}
                      for who, cell in zip(header[1:], cells[1:], strict=True)}
    return out


FUNCTIONS = ("oc_clock", "coverages", "oc_apply_batch", "oc_record_orphan_resources")


def test_the_grants_table_of_database_md_is_what_pg_catalog_says(ledger):
    documented = documented_grants()
    roles = {"runtime": ledger.runtime, **ledger.functions}
    with ledger.db(ledger.owner).connection() as conn:
        tables = [r[0] for r in conn.run("SELECT c.relname FROM pg_class c"
                                         " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'"
                                         " ORDER BY 1")]
        assert set(documented) == set(tables) | {f"{f}()" for f in FUNCTIONS}

        def executes(who: str, fn: str) -> set[str]:
            oids = conn.run("SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = :f", f=fn)
            assert len(oids) == 1, fn
            return {"EXECUTE"} if conn.run("SELECT has_function_privilege(:r, :f, 'EXECUTE')", r=who,
                                           f=oids[0][0])[0][0] else set()

        # PUBLIC executes none of the product's functions but the clock, and the definer's are SECURITY DEFINER
        public = conn.run("SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace"
                          " AND (p.proname LIKE 'oc\\_%' OR p.proname LIKE 'orphan\\_cleanup\\_%')"
                          " AND p.proname <> 'oc_clock'"
                          " AND (p.proacl IS NULL OR EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0))")
        assert public == []
        definer = conn.run("SELECT p.proname, p.prosecdef, pg_get_userbyid(p.proowner), p.proconfig FROM pg_proc p"
                           " WHERE p.proname IN ('oc_record_orphan_resources', 'orphan_cleanup_region_baseline')"
                           " ORDER BY 1")
        assert definer == [[name, True, ledger.definer, ["search_path=public, pg_temp"]]
                           for name in ("oc_record_orphan_resources", "orphan_cleanup_region_baseline")]
        assert conn.run("SELECT rolcanlogin FROM pg_roles WHERE rolname = :r", r=ledger.definer) == [[False]]

        def held(who: str, table: str) -> set[str]:
            out = set()
            for p in PRIVILEGES:
                if conn.run("SELECT has_table_privilege(:r, :t, :p)", r=who, t=table, p=p)[0][0]:
                    out.add(p)
                elif p in ("INSERT", "UPDATE") and conn.run(
                        "SELECT has_any_column_privilege(:r, :t, :p)", r=who, t=table, p=p)[0][0]:
                    out.add(f"{p} (columns)")
            return out

        actual = {t: {name: held(r, t) for name, r in roles.items()} for t in tables}
        actual |= {f"{f}()": {name: executes(r, f) for name, r in roles.items()} for f in FUNCTIONS}
    assert actual == documented


def test_roles_sql_as_a_non_superuser_admin_hands_the_definer_its_functions(pg_server):
    # given the shape of the RDS master user / Cloud SQL's postgres: CREATEROLE CREATEDB, owning the database
    ledger = _new_ledger(pg_server)
    admin = f"oc_admin_{ledger.owner.rsplit('_', 1)[1]}"
    try:
        ledger.admin_run(f"CREATE ROLE {admin} LOGIN CREATEROLE CREATEDB PASSWORD 'admin-pw-1'",
                         f'ALTER DATABASE "{ledger.admin.database}" OWNER TO {admin}',
                         f"ALTER SCHEMA public OWNER TO {admin}")
        as_admin = replace(ledger, admin=replace(ledger.admin, user=admin, password="admin-pw-1"))
        ok(as_admin.roles_sql(platform_role=ledger.platform))
        migrate(ledger.db(ledger.owner))
        ok(as_admin.roles_sql(platform_role=ledger.platform))
        with ledger.db(ledger.owner).connection() as conn:
            owners = conn.run("SELECT p.proname, pg_get_userbyid(p.proowner), p.prosecdef FROM pg_proc p"
                              " WHERE p.proname IN ('oc_record_orphan_resources', 'orphan_cleanup_region_baseline')"
                              " ORDER BY 1")
            assert owners == [["oc_record_orphan_resources", ledger.definer, True],
                              ["orphan_cleanup_region_baseline", ledger.definer, True]]
            assert conn.run("SELECT has_schema_privilege(:r, 'public', 'CREATE')", r=ledger.definer) == [[False]]
        denied(role(ledger, "deleter"), "INSERT INTO orphan_resources (backend_id, provider_ref, resource_id)"
                                        " VALUES ('x', 'y', 'z')")
    finally:
        _drop(ledger)
        conn = connect(ledger.admin.with_database("postgres"))
        try:
            conn.run(f"DROP ROLE IF EXISTS {admin}")
        finally:
            conn.close()
