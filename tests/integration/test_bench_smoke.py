"""The classifier benchmark runs on a tiny ledger and keeps its promises.

Behaviour only (rows produced, statements per batch, the "before" code agreeing
with the shipped one); timings are the benchmark's business, never a test's.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from bench import classifier, legacy, peers
from bench import ledger_data as data
from bench.common import PgServer
from orphan_cleanup.core import classify
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.owners import LedgerRecord
from orphan_cleanup.ledger.session import apply_payload
from orphan_cleanup.providers.aws.kinds import listed_kinds
from tests.support.aws_proxy import AwsProxy


@pytest.mark.slow  # a bench run (~20 s): kept out of the default run for its time
def test_quick_classifier_bench_produces_rows_within_three_statements_per_batch(pg_server):
    # given a 1,000-ref ledger and 100-group batches
    cfg = classifier.Config(ledgers=(1_000,), batch_sizes=(100,), reps={100: 2}, message_batch=False)
    # when the classifier benchmark runs (it also checks that every join shape returns equal records)
    main, parts, floors = classifier.run(PgServer(pg_server), cfg)
    # then it measured the shipped and the v0 code, at most 3 statements a batch on the warm connection (none opened)
    assert {r["code"] for r in main.rows} == {"shipped", "pydantic records", "v0 (caf2dda)"}
    assert all(r["stmts/batch"] <= 3 and r["conns/batch"] == 0 for r in main.rows)
    assert all(r["groups/s"] > 0 for r in main.rows)
    assert len(parts.rows) == 3 and len(floors.rows) == 5


def test_v0_build_payload_agrees_with_the_shipped_one():
    # given batches of every kind of group and ledger records of every status
    rng = random.Random(7)
    now = datetime.now(UTC)
    old = now - timedelta(days=2)
    ctx = classify.ClassifyContext(backend_id=data.BACKEND, scope="aws:123456789012", listed_at=now,
                                   margin=timedelta(minutes=5), protect_key="orphan-cleanup-protect")
    # (an owner type cleanup does not handle: not ``volume``, whose groups v0 did not split one per
    # volume, README C1)
    for _ in range(50):
        groups = data.make_groups(1_000, 40, rng)
        records = {g.provider_ref: LedgerRecord(
            provider_ref=g.provider_ref, owner_type=rng.choice(["instance", "instance", "bucket"]), owner_id="o",
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
        after = classify_batch(batch, records, ctx, mode=batch.mode, record_all=batch.record_all)
        # then they are equal (as shipped to oc_apply_batch and reported), verdict counts in the same order
        # included; the shipped rows also carry the evidence that v0 did not compute (migration 0008)
        shipped = apply_payload(after)
        assert all(row["evidence"] for row in shipped["rows"])
        shipped["rows"] = [{k: v for k, v in row.items() if k != "evidence"} for row in shipped["rows"]]
        # and the orphans what `report` reads (migration 0018), which v0 did not compute either
        assert all("orphan_since" in o and "size" in o for o in shipped["orphans"])
        shipped["orphans"] = [{k: v for k, v in o.items() if k not in ("orphan_since", "size")}
                              for o in shipped["orphans"]]
        # and v0 wrote every orphan group's resources as orphan_resources, which now only the
        # deleter's re-read writes (SAFETY.md rule 15)
        before[0].pop("orphan_resources")
        assert before == (shipped, [r.as_dict() for r in after.to_report],
                          [(m, r.as_dict()) for m, r in after.errors], after.counts)
        assert list(before[3]) == list(after.counts)


@pytest.mark.slow  # a bench run (~20 s): kept out of the default run for its time
def test_tick_bench_lists_a_shared_account_once(pg_server):
    from bench import tick

    table, scale = tick.run(PgServer(pg_server), sizes=(1, 4), scale_backends=200)
    # the tick at many backends: its one statement and one mark_idle_many for all of them
    worst = [r for r in scale.rows if r["scenario"].startswith("worst")]
    assert len(worst) == 2 and all(r["statements"] == 2 and r["idle marked"] == 200 for r in worst)
    rows = {(r["backends"], r["scheduler"].startswith("tick")): r for r in table.rows}
    # one listing per backend before; the tick's shared listing costs the calls of one backend
    assert rows[(4, False)]["list calls"] == 4 * rows[(1, False)]["list calls"]
    assert rows[(4, True)]["list calls"] == rows[(1, True)]["list calls"] == rows[(1, False)]["list calls"]
    assert rows[(4, True)]["identity checks"] == 1 and rows[(4, False)]["identity checks"] == 4


def test_peers_bench_product_listing_is_filtered_and_cheaper_than_the_naive_one(moto_reset, session, calls):
    # given 110 instances, one per reservation (more than moto's 100-reservation page), 6 of them ours
    fleet = peers.build_fleet(boto3.client("ec2", region_name=peers.REGION), 330, tagged_share=0.05,
                              per_reservation=1)
    assert (fleet.resources, fleet.ours, fleet.reservations) == (330, 18, 110)
    with AwsProxy(moto_reset) as proxy:
        listers = {"product": peers.product_lister(proxy.url, session), "naive": peers.naive_lister(proxy.url)}
        # when the peers bench measures the product's listing and the naive one through its counting proxy
        results = peers.measure(proxy, listers, reps=1)
    product, naive = results["product"], results["naive"]
    # then both list our 18 resources (instance, root volume, ENI of each of the 6)
    assert len(product.ids) == 18 and product.ids == naive.ids
    # the product's every EC2 describe carries the tag-key filter (ELBv2's have none: tags by ARN)
    describes = [(op, params) for service, op, params in calls.calls if op.startswith("Describe") and service == "ec2"]
    assert describes and all({"Name": "tag-key", "Values": [peers.TAG]} in params.get("Filters", [])
                             for _, params in describes)
    # the naive one pays moto's page arithmetic: one call per kind, describe_instances paged by 100 reservations
    kinds = len(listed_kinds(None))
    assert naive.calls["DescribeInstances"] == peers.naive_instance_pages(fleet.reservations) == 2
    assert naive.total_calls == kinds - 1 + 2
    # and the product makes fewer calls (its filtered instances fit one page), with less reply data
    assert product.calls["DescribeInstances"] == 1 and product.total_calls == kinds < naive.total_calls
    assert product.reply_bytes < naive.reply_bytes / 3


@pytest.mark.slow
def test_peers_bench_custodian_lists_the_same_resources(moto_reset, tmp_path):
    # given c7n in its cached virtualenv (built from PyPI on first use) and a small fleet, a fifth of it ours
    try:
        exe = peers.ensure_custodian()
    except peers.PeerUnavailable as exc:
        pytest.skip(str(exc))
    fleet = peers.build_fleet(boto3.client("ec2", region_name=peers.REGION), 30)
    with AwsProxy(moto_reset) as proxy:
        listers = {"product": peers.product_lister(proxy.url),
                   "custodian": peers.custodian_lister(exe, proxy.url, tmp_path)}
        # when custodian runs its tag-filtered policies against the same proxy
        results = peers.measure(proxy, listers, reps=1)
    # then it lists exactly our instances, volumes and ENIs, with calls counted at the proxy
    assert len(results["custodian"].ids) == fleet.ours == 6
    assert results["custodian"].ids == results["product"].ids
    assert results["custodian"].calls["DescribeInstances"] >= 1


@pytest.mark.slow  # a bench run (~20 s): kept out of the default run for its time
def test_throttling_bench_counts_refusals_and_keeps_every_region(pg_server, moto_reset):
    from bench import throttling
    from orphan_cleanup.providers.ratelimit import DESCRIBE, MUTATE, TERMINATE, Budget

    # given a tiny two-region fleet and budgets high enough that the buckets barely wait
    fast = {DESCRIBE: Budget(50.0, 50), MUTATE: Budget(50.0, 50), TERMINATE: Budget(50.0, 50)}
    # when the throttling bench runs its report and delete cycles at 0% and 30% refusals
    [table] = throttling.run(PgServer(pg_server), per_region=2, orphans=1, shares=(0.0, 0.3),
                             delete_shares=(0.0, 0.3), budgets=fast, moto_url=moto_reset)
    rows = {(r["cycle"].split()[0], r["refused share"]): r for r in table.rows}
    assert sorted(rows) == [("delete", "0%"), ("delete", "30%"), ("report", "0%"), ("report", "30%")]
    # then the baselines are clean and unrefused, the leak deleted without throttling
    assert rows[("report", "0%")]["outcome"] == rows[("delete", "0%")]["outcome"] == "clean"
    assert rows[("report", "0%")]["refused"] == rows[("delete", "0%")]["refused"] == 0
    assert rows[("delete", "0%")]["deleted"] == 1
    # a delete cycle calls more than a report cycle (the terminate and its confirmation)
    assert rows[("delete", "0%")]["calls"] > rows[("report", "0%")]["calls"]
    for kind in ("report", "delete"):
        row = rows[(kind, "30%")]
        # and at 30% refused the cycle finished with no region failed or skipped (the retries absorbed it),
        assert row["outcome"] in ("clean", "unsettled")
        assert row["regions failed"] == row["regions unavailable"] == 0
        # each refusal cost one extra call at most twice over, and the proxy's share held
        assert row["refused"] == int(row["calls"] * 0.3) >= 1
        assert 0 < row["extra calls"] <= 2 * row["refused"]


@pytest.mark.slow  # a bench run (~25 s): kept out of the default run for its time
def test_platform_bench_measures_every_case_and_drops_only_the_product_triggers(pg_server):
    from bench import platform

    # given a tiny fleet (2 backends, 60 groups), a short history and short rounds
    cfg = platform.Config(rate=80, backends=2, groups_per_backend=30, history=200, rounds=2, round_seconds=1.0)
    # when the platform bench runs both cases
    a, b, kinds, doing = platform.run(PgServer(pg_server), cfg=cfg)
    # then every case counted transactions, none failed, and the baselines are their own ratio
    assert all(r["transactions"] > 0 for r in a.rows + b.rows)
    assert not any("platform errors" in n for n in a.notes)
    assert a.rows[0]["p99 x baseline"] == b.rows[0]["p99 x baseline"] == 1.0
    # the fleet ran cycles in its rounds only
    assert a.rows[0]["fleet cycles"] == 0 and a.rows[1]["fleet cycles"] >= 1
    # the copy without triggers lost the product's activity triggers, not the foreign key's internal ones
    dropped = next(n for n in b.notes if n.startswith("dropped"))
    for trigger in ("provider_refs.provider_refs_activity", "instances.instances_activity",
                    "volumes.volumes_activity", "backends.backends_activity"):
        assert trigger in dropped
    assert "RI_ConstraintTrigger" not in dropped
    # and every transaction of the protocol was measured on both copies
    assert [r["transaction"] for r in kinds.rows] == list(platform.KINDS)
    assert len(doing.rows) == 4
