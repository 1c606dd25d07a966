"""``run --json`` streams its groups from the ledger (issue #17 item 5): page by page,
the same groups in the same order with the same values as the report read whole."""

from __future__ import annotations

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend


def test_the_streamed_groups_are_the_report_s_groups_page_by_page(db):
    # given a cycle of tracked VMs, leaks and a foreign VM over two regions
    cloud = MemoryCloud()
    add_backend(db, "mem", regions=("r1", "r2"))
    platform = Platform(db, cloud, "mem")
    for region in ("r1", "r2"):
        platform.tracked(region=region)
        platform.tracked(region=region)
        platform.terminated_leak(region=region)
        platform.foreign(region=region)
    pipeline = Pipeline(settings=Settings(), db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    report = run_cycle(pipeline, "mem", mode="report")
    whole = report.c3()["groups"]
    assert len(whole) >= 8 and any("detail" in g for g in whole)
    # when its groups are streamed two at a time (and in one page)
    paged = list(pipeline.store.report_groups(report.cycle_id, page=2))
    one_page = list(pipeline.store.report_groups(report.cycle_id))
    # then they are the report's, in its order; the header alone reads no group
    assert paged == one_page == whole
    header = pipeline.store.cycle_report(report.cycle_id, groups=False)
    assert header.groups == () and header.c3() | {"groups": whole} == report.c3()
