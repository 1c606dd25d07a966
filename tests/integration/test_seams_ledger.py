"""The audit trail against the functions' own database role, on real parts: Debian's PostgreSQL 15
(the tests' server), ``infra/postgres/roles.sql`` run with psql as an operator runs it, ``migrate``
as the owner role, and a real report cycle as the runtime role (as tests/integration/test_db_roles.py
does). The test reproduced a defect of the code before docs/SAFETY.md rule 19 (committed as a
strict xfail naming the failure it gave), and asserts the behaviour now."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.migrate import migrate
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_db_roles import PSQL, _drop, _new_ledger, denied, ok
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")

# A terminate's two journal rows (migration 0011's append-only table): its intent, then its result,
# which names the intent's id.
JOURNAL_ROWS = [f"INSERT INTO provider_journal (backend_id, cycle_id, scope, region, provider_ref, group_key, phase,"
                f" intent_id, call, target, blast, outcome, error) VALUES ('mem', :c, 'aws:123456789012', 'r1',"
                f" :ref, :k, '{phase}', CAST(:i AS bigint), 'ec2:TerminateInstances', :vm, '[]'::jsonb, {outcome},"
                f" NULL) RETURNING id"
                for phase, outcome in (("intent", "NULL"), ("result", "'ok'"))]


def test_the_runtime_role_cannot_rewrite_or_erase_the_audit_trail(pg_server):
    """Setup: roles.sql, migrate as the owner role, roles.sql again; a report cycle run by the
    runtime role (its events and cycle are the audit trail). Shows: as the runtime role,
    UPDATE/DELETE of events, DELETE of cycles, UPDATE/DELETE of provider_journal are refused
    (42501), while INSERT into events and provider_journal and DELETE FROM delete_gates (the
    product's own lock rows) are allowed."""
    ledger = _new_ledger(pg_server)
    try:
        ok(ledger.roles_sql(platform_role=ledger.platform))
        migrate(ledger.db(ledger.owner))
        ok(ledger.roles_sql(platform_role=ledger.platform))
        add_backend(ledger.db(ledger.owner))
        cloud = MemoryCloud()
        ref, _, vm = Platform(ledger.db(ledger.platform), cloud).placeholder_leak()
        settings = Settings.explicit(confirm_seconds=0,
                                     database_url=ledger.info(ledger.runtime).url(), margin_seconds=0)
        pipeline = bootstrap.build_pipeline(settings, listing_queue=InProcessQueue(), delete_queue=InProcessQueue(),
                                            provider_for=lambda b: MemoryProvider(b, cloud))
        report = run_cycle(pipeline, "mem", mode="report")
        pipeline.db.close()
        runtime = ledger.db(ledger.runtime)

        for sql in ("UPDATE events SET message = 'rewritten'", "DELETE FROM events", "DELETE FROM cycles"):
            denied(runtime, sql)
        with runtime.transaction() as conn:
            conn.run("INSERT INTO events (backend_id, cycle_id, kind, message) VALUES ('mem', :c, 'note', 'kept')",
                     c=report.cycle_id)
            intent = None
            for row in JOURNAL_ROWS:
                [[written]] = conn.run(row, c=report.cycle_id, ref=ref, k=f"{ref}/r1/{vm}", vm=vm, i=intent)
                intent = intent or written
            conn.run("DELETE FROM delete_gates")
        for sql in ("UPDATE provider_journal SET outcome = 'error'", "DELETE FROM provider_journal"):
            denied(runtime, sql)
        with ledger.db(ledger.owner).connection() as conn:
            assert conn.run("SELECT count(*) FROM cycles WHERE id = :c", c=report.cycle_id) == [[1]]
            assert conn.run("SELECT count(*) FROM events WHERE message = 'rewritten'") == [[0]]
            assert conn.run("SELECT count(*) FROM provider_journal") == [[2]]
    finally:
        _drop(ledger)


def test_the_runtime_role_cannot_rewrite_a_cycles_snapshot_nor_forge_a_journal_result(pg_server):
    """Setup: roles.sql, migrate, roles.sql; a cycle row and a journal intent written by the
    owner. Shows: as the runtime role, the cycle's backend snapshot, backend, fence and mode
    cannot be updated (SAFETY.md rule 18: its progress columns can); a journal result row
    must end an existing intent, is its only one, and takes its call, target and time from the
    database, not from the writer (rule 19)."""
    ledger = _new_ledger(pg_server)
    try:
        ok(ledger.roles_sql(platform_role=ledger.platform))
        migrate(ledger.db(ledger.owner))
        ok(ledger.roles_sql(platform_role=ledger.platform))
        add_backend(ledger.db(ledger.owner))
        with ledger.db(ledger.owner).connection() as conn:
            conn.run("INSERT INTO cleanup (backend_id, fence) VALUES ('mem', 1) ON CONFLICT DO NOTHING")
            conn.run("INSERT INTO cycles (id, backend_id, fence, mode, started_at, deadline, backend_snapshot)"
                     " VALUES ('c1', 'mem', 1, 'report', now(), now() + interval '1 hour',"
                     " '{\"id\": \"mem\", \"account\": \"123456789012\", \"settings\": {}}')")
            [[intent]] = conn.run("INSERT INTO provider_journal (backend_id, scope, phase, call, target)"
                                  " VALUES ('mem', 'aws:1', 'intent', 'ec2:TerminateInstances', 'i-1') RETURNING id")
        runtime = ledger.db(ledger.runtime)
        for sql in ("UPDATE cycles SET backend_snapshot = '{}' WHERE id = 'c1'",
                    "UPDATE cycles SET mode = 'delete' WHERE id = 'c1'",
                    "UPDATE cycles SET fence = 2 WHERE id = 'c1'",
                    "UPDATE cycles SET backend_id = 'other' WHERE id = 'c1'",
                    "INSERT INTO provider_journal (backend_id, scope, phase, call, target, at)"
                    " VALUES ('mem', 'aws:1', 'intent', 'x', 'y', now() - interval '30 days')"):
            denied(runtime, sql)
        with runtime.transaction() as conn:
            conn.run("UPDATE cycles SET open_deletes = 0 WHERE id = 'c1'")  # progress: allowed
            conn.run("INSERT INTO provider_journal (backend_id, scope, phase, intent_id, call, target, outcome)"
                     " VALUES ('x', 'x', 'result', :i, 'ec2:DeleteVolume', 'vol-forged', 'ok')", i=intent)
            [[call, target, backend]] = conn.run("SELECT call, target, backend_id FROM provider_journal"
                                                 " WHERE phase = 'result'")
        assert (call, target, backend) == ("ec2:TerminateInstances", "i-1", "mem")  # the intent's, not the writer's
        with pytest.raises(DatabaseError), runtime.transaction() as conn:  # no intent, no result
            conn.run("INSERT INTO provider_journal (backend_id, scope, phase, intent_id, call, target, outcome)"
                     " VALUES ('mem', 'aws:1', 'result', 424242, 'ec2:TerminateInstances', 'i-9', 'ok')")
        with pytest.raises(DatabaseError), runtime.transaction() as conn:  # one result per intent
            conn.run("INSERT INTO provider_journal (backend_id, scope, phase, intent_id, call, target, outcome)"
                     " VALUES ('x', 'x', 'result', :i, 'x', 'x', 'error')", i=intent)
    finally:
        _drop(ledger)
