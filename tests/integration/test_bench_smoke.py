"""The classifier benchmark runs on a tiny ledger and keeps its promises.

Behaviour only (rows produced, statements per batch, the "before" code agreeing
with the shipped one); timings are the benchmark's business, never a test's.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from bench import classifier, legacy
from bench import ledger_data as data
from bench.common import PgServer
from orphan_cleanup import classify
from orphan_cleanup.models import LedgerRecord
from orphan_cleanup.messages import ListingBatch
from orphan_cleanup.ledger.store import apply_payload
from orphan_cleanup.pipeline import build_payload


def test_quick_classifier_bench_produces_rows_within_three_statements_per_batch(pg_server):
    # given a 1,000-ref ledger and 100-group batches
    cfg = classifier.Config(ledgers=(1_000,), batch_sizes=(100,), reps={100: 2}, message_batch=False)
    # when the classifier benchmark runs (it also checks that every join shape returns equal records)
    main, parts, floors = classifier.run(PgServer(pg_server), cfg)
    # then it measured the shipped and the v0 code, each with one connection and at most 3 statements a batch
    assert {r["code"] for r in main.rows} == {"shipped", "v0 (caf2dda)"}
    assert all(r["stmts/batch"] <= 3 and r["conns/batch"] == 1 for r in main.rows)
    assert all(r["groups/s"] > 0 for r in main.rows)
    assert len(parts.rows) == 2 and len(floors.rows) == 4


def test_v0_build_payload_agrees_with_the_shipped_one():
    # given batches of every kind of group and ledger records of every status
    rng = random.Random(7)
    now = datetime.now(timezone.utc)
    old = now - timedelta(days=2)
    ctx = classify.ClassifyContext(backend_id=data.BACKEND, scope="aws:123456789012", listed_at=now, margin=timedelta(minutes=5),
                                   protect_key="orphan-cleanup-protect")
    for _ in range(50):
        groups = data.make_groups(1_000, 40, rng)
        records = {g.provider_ref: LedgerRecord(
            provider_ref=g.provider_ref, owner_type=rng.choice(["instance", "instance", "volume"]), owner_id="o",
            owner_name="n", issued_at=rng.choice([old, now]), instance_found=(status := rng.choice(
                ["busy", "idle", "terminated", "pending", "terminating", "odd", None])) is not None,
            status=status, backend_id=rng.choice([data.BACKEND, None, "other"]),
            primary_id=rng.choice([g.primary_id, None, "i-other"]), created_at=rng.choice([old, now]),
            provisioned_at=rng.choice([old, None]), terminated_at=rng.choice([old, None, now]),
            deleted_at=rng.choice([None, None, old]),
            known_orphan_resource_ids=frozenset(g.resource_ids()) if rng.random() < 0.3 else frozenset())
            for g in groups if rng.random() < 0.9}
        batch = ListingBatch(cycle_id="c", backend=data.BACKEND, seq=0, listed_at=now,
                             mode=rng.choice(["report", "delete"]), record_all=rng.random() < 0.3,
                             groups=tuple(groups))
        # when both versions shape the payload
        before = legacy.build_payload(batch, records, ctx)
        after = build_payload(batch, records, ctx, mode=batch.mode, record_all=batch.record_all)
        # then they are equal (as shipped to oc_apply_batch and reported), verdict counts in the same order
        # included; the shipped rows also carry the evidence that v0 did not compute (migration 0008)
        shipped = apply_payload(after)
        assert all(row["evidence"] for row in shipped["rows"])
        shipped["rows"] = [{k: v for k, v in row.items() if k != "evidence"} for row in shipped["rows"]]
        assert before == (shipped, [r.as_dict() for r in after.to_report],
                          [(m, r.as_dict()) for m, r in after.errors], after.counts)
        assert list(before[3]) == list(after.counts)


def test_tick_bench_lists_a_shared_account_once(pg_server):
    from bench import tick

    [table] = tick.run(PgServer(pg_server), sizes=(1, 4))
    rows = {(r["backends"], r["scheduler"].startswith("tick")): r for r in table.rows}
    # one listing per backend before; the tick's shared listing costs the calls of one backend
    assert rows[(4, False)]["list calls"] == 4 * rows[(1, False)]["list calls"]
    assert rows[(4, True)]["list calls"] == rows[(1, True)]["list calls"] == rows[(1, False)]["list calls"]
    assert rows[(4, True)]["identity checks"] == 1 and rows[(4, False)]["identity checks"] == 4
