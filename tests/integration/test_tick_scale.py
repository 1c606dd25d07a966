"""The tick at 1,000 enrolled backends: one statement to select, one to mark every idle
backend processed, whatever the count (issue #17 item 5). Statements are counted at
pg8000's ``Connection.run`` (pg8000's class wrapped; our code untouched)."""

from __future__ import annotations

import pg8000.native
import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.queues.memory import InProcessQueue

N = 1_000


def enroll(db, n: int, *, active_accounts: int = 0) -> None:
    """``n`` backends over 10 accounts, cleaned an hour ago and due; ledger activity after
    the clean in the first ``active_accounts`` accounts only."""
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " SELECT 'proj-' || lpad(i::text, 5, '0'), 'aws', (100000000000 + i % 10)::text, '{r1}', '{}',"
                 " 'report' FROM generate_series(0, :n - 1) AS i", n=n)
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id, issued_at)"
                 " SELECT lpad(i::text, 12, '0'), 'inst-' || i, now() - interval '2 hours'"
                 " FROM generate_series(0, 9) AS i")
        conn.run("UPDATE ledger_activity SET at = now() - interval '2 hours'")
        conn.run("INSERT INTO ledger_activity (backend_id, at, kind)"
                 " SELECT 'proj-' || lpad(i::text, 5, '0'), now(), 'instances'"
                 " FROM generate_series(0, :a - 1) AS i", a=active_accounts)
        conn.run("INSERT INTO cleanup (backend_id, clean_at, clean_mode, next_due_at)"
                 " SELECT id, now() - interval '1 hour', 'report', now() - interval '1 second' FROM backends")


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    real = pg8000.native.Connection.run

    def run(self, sql, *a, **kw):
        sent.append(" ".join(sql.split())[:60])
        return real(self, sql, *a, **kw)

    monkeypatch.setattr(pg8000.native.Connection, "run", run)
    return sent


def tick(db):
    jobs = InProcessQueue()
    pipeline = Pipeline(settings=Settings(), db=db, provider_for=lambda b: None, listing_queue=InProcessQueue(),
                        delete_queue=InProcessQueue(), jobs_queue=jobs)
    return pipeline.run_tick()


def test_the_tick_of_1000_idle_backends_is_two_statements(db, statements):
    enroll(db, N)
    statements.clear()
    result = tick(db)
    # every backend idle (no activity since its clean): marked processed in one statement
    assert not result.jobs and set(result.skipped.values()) == {"no_activity"} and len(result.skipped) == N
    assert [s.split()[0] for s in statements if not s.startswith("SET statement_timeout")] == ["WITH", "UPDATE"]
    with db.connection() as conn:
        assert conn.run("SELECT count(*) FROM cleanup WHERE last_processed_at IS NOT NULL")[0][0] == N


def test_activity_in_an_account_makes_its_backends_due_and_only_those(db, statements):
    enroll(db, N, active_accounts=2)  # accounts ...00 and ...01: their 200 backends
    statements.clear()
    result = tick(db)
    assert len(result.due) == 200 and all(int(b[-5:]) % 10 in (0, 1) for b in result.due)
    assert len(result.skipped) == N - 200
    assert len([s for s in statements if not s.startswith("SET statement_timeout")]) == 2


def test_the_ticks_document_decodes_to_the_rows_pg8000_decodes(db):
    import json

    from orphan_cleanup.ledger import queries

    enroll(db, 20, active_accounts=1)
    with db.connection() as conn:
        conn.run("UPDATE cleanup SET lease_owner = 'c', lease_expires_at = now() + interval '1 minute',"
                 " retry_delay_seconds = 60, clean_at = NULL WHERE backend_id = 'proj-00003'")
        conn.run("UPDATE cleanup SET next_due_at = now() + interval '1 hour' WHERE backend_id = 'proj-00004'")
        now, rows = queries.tick_rows_from_json(
            conn.run(queries.TICK_SQL, horizon=queries.TICK_HORIZON_SECONDS)[0][0])
        # the same columns, one row per backend, as pg8000 decodes them
        plain = conn.run(f"SELECT {queries.BACKEND_COLUMNS}, c.clean_at, c.clean_mode, c.lease_owner IS NOT NULL,"
                         " c.lease_expires_at, coalesce(c.retry_delay_seconds, 0), c.next_due_at, oc_clock()"
                         " FROM backends b JOIN cleanup c ON c.backend_id = b.id ORDER BY b.id")
    assert len(rows) == len(plain) == 20
    # (and a seventh: no backend is a retired coverage, docs/SAFETY.md rule 24)
    assert [json.loads(bytes(raw)) for raw, _ in rows] == [[*r[:6], None] for r in plain]
    facts = {r[0]: f for (_, f), r in zip(rows, plain, strict=True)}
    assert facts["proj-00004"] is None  # due in an hour: no facts
    sent = [(f, r) for (_, f), r in zip(rows, plain, strict=True) if f is not None]
    assert len(sent) == 19 and all(f[0] for f, _ in sent)  # enrolled
    assert [f[1:7] for f, _ in sent] == [list(r[6:12]) for _, r in sent]
    assert [[type(v) for v in f[1:7]] for f, _ in sent] == [[type(v) for v in r[6:12]] for _, r in sent]
    assert type(now) is type(plain[0][12]) and now <= plain[0][12]  # one clock reading, the database's
    assert sum(1 for f, _ in sent if f[7]) == 2  # activity in account ...00: its two backends
