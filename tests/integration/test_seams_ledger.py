"""The audit trail against the functions' own database role, on real parts: Debian's PostgreSQL 15
(the tests' server), ``infra/postgres/roles.sql`` run with psql as an operator runs it, ``migrate``
as the owner role, and a real report cycle as the runtime role (as tests/integration/test_db_roles.py
does). The test reproduced a defect of the code before docs/SAFETY.md rule 19 (committed as a
strict xfail naming the failure it gave), and asserts the behaviour now."""

from __future__ import annotations

import pytest

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
                f" intent_id, call, target, blast, outcome, error, at) VALUES ('mem', :c, 'aws:123456789012', 'r1',"
                f" :ref, :k, '{phase}', CAST(:i AS bigint), 'ec2:TerminateInstances', :vm, '[]'::jsonb, {outcome},"
                f" NULL, now()) RETURNING id"
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
        settings = Settings.explicit(database_url=ledger.info(ledger.runtime).url(), margin_seconds=0)
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
