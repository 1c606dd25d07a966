"""Benchmark: whole cycles through a throttling proxy in front of moto (issue #17 item 2).

A moto fleet in two regions (``per_region`` tracked instances each; instance and root
volume carry the instance's ref, recorded in a real ledger the way a platform writes
it) is listed by real report cycles (``runner.run_cycle``: lister, classifier) whose
every call (identity included) goes through ``tests.support.aws_proxy``. The proxy
refuses an exact share of the requests with EC2's HTTP 503 ``RequestLimitExceeded``,
spread evenly, and forwards the rest. Then delete cycles remove a handful of leaks
(owners terminated, instances still running), unthrottled and throttled.

The adapter is built as the product builds it (default retries, the settings' default
timeouts and request budgets, ``ORPHAN_CLEANUP_*_RATE`` / ``*_BURST``): the bucket's
waiting after a refusal is what users get, and it is in the wall time. Each cycle gets
fresh buckets, so one row's slowed-down rate does not carry into the next.

Before the tables are returned the bench asserts what the tests assert
(``tests/integration/test_aws_throttling.py``): below 50% refusals the cycle finishes,
no region fails, the calls beyond the unthrottled run are at most twice the refused
ones, and the buckets saw every refusal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from bench.common import PgServer, Table

SHARES = (0.0, 0.1, 0.3, 0.49, 1.0)
DELETE_SHARES = (0.0, 0.3)
QUICK_SHARES = (0.0, 0.49, 1.0)
REGIONS = ("us-east-1", "eu-west-1")
BACKEND = "bench-throttled"


@dataclass
class Cycle:
    """One measured cycle: its report and what the proxy and the buckets saw."""

    kind: str  # "listing" (report mode) or "delete"
    share: float
    report: Any
    calls: int
    refused: int
    throttles: int  # refusals the request buckets were told about
    waited: float  # seconds the buckets made callers sleep, summed over threads
    seconds: float

    @property
    def unavailable(self) -> int:
        """Regions skipped for throttling past the retry budget (the cycle not failed)."""
        if self.report.outcome == "failed":
            return 0
        return sum("ProviderThrottled" in f.error for f in self.report.failures)

    @property
    def failed(self) -> int:
        """Regions that failed: every region of a failed cycle, else the non-throttling failures."""
        if self.report.outcome == "failed":
            return len(REGIONS)
        return len(self.report.failures) - self.unavailable

    @property
    def deleted(self) -> int:
        return sum(g.verdict == "orphan" and g.action == "deleted" for g in self.report.groups)


@contextmanager
def _moto(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from bench.listing_aws import moto_server

    with moto_server() as started:
        yield started


def run(server: PgServer, *, quick: bool = False, per_region: int | None = None, orphans: int = 4,
        shares: tuple[float, ...] = SHARES, delete_shares: tuple[float, ...] = DELETE_SHARES,
        budgets: Mapping[str, Any] | None = None, moto_url: str | None = None) -> list[Table]:
    """Measure a report cycle at each of ``shares`` and a delete cycle of ``orphans`` leaks at
    each of ``delete_shares`` (the first share of each is the baseline, normally 0).
    ``budgets`` default to the product's (``settings_budgets`` of the default settings);
    ``moto_url``: a running moto server (default: one started here)."""
    from orphan_cleanup.core.settings import Settings
    from orphan_cleanup.providers.ratelimit import settings_budgets
    from tests.support.ledger_helpers import add_backend
    from tests.support.moto import reset_moto

    # The leaks are minutes old, not the default margin's; one delete cycle deletes them (no
    # confirmation window: the calls of one delete cycle are what is measured).
    settings = Settings.explicit(margin_seconds=0, confirm_seconds=0)
    budgets = dict(budgets if budgets is not None else settings_budgets(settings))
    per_region = per_region if per_region is not None else (10 if quick else 75)
    if quick:  # the claim's edge (49%) and the all-refused row; the delete cycles only in the full run
        shares, delete_shares = tuple(s for s in shares if s in QUICK_SHARES), ()
    db = server.fresh_database("oc_bench_throttle")
    with _moto(moto_url) as url:
        reset_moto(url)
        add_backend(db, BACKEND, regions=REGIONS)
        start = time.perf_counter()
        platforms = _fleet(db, per_region)
        setup = time.perf_counter() - start
        print(f"-- throttling: {2 * per_region * len(REGIONS):,} tagged resources in {setup:.0f} s",
              file=sys.stderr, flush=True)
        listings = [_cycle(db, url, share, budgets, settings, "report") for share in shares]
        deletes = []
        for share in delete_shares:
            leaks = [platforms[i % len(platforms)].terminated_leak(data_volume=False) for i in range(orphans)]
            deletes.append(_cycle(db, url, share, budgets, settings, "delete"))
            if share == 0 and deletes[-1].deleted != len(leaks):  # else its calls are no baseline
                raise AssertionError(f"the unthrottled delete cycle deleted {deletes[-1].deleted} of {len(leaks)}")
    for cycles in (listings, deletes):
        check(cycles)
    return [_table(listings, deletes, per_region, orphans, budgets, setup)]


def _fleet(db: Any, per_region: int) -> list[Any]:
    from tests.support.sqs_harness import MotoPlatform

    platforms = [MotoPlatform(db, BACKEND, region) for region in REGIONS]
    for platform in platforms:
        for _ in range(per_region):
            platform.tracked(data_volume=False)
    return platforms


def _cycle(db: Any, url: str, share: float, budgets: Mapping[str, Any], settings: Any,
           mode: Literal["report", "delete"]) -> Cycle:
    from orphan_cleanup.cycle.pipeline import Pipeline
    from orphan_cleanup.cycle.runner import run_cycle
    from orphan_cleanup.providers.aws.provider import build_aws_provider
    from orphan_cleanup.providers.ratelimit import RateLimits
    from orphan_cleanup.queues.memory import InProcessQueue
    from tests.support.aws_proxy import AwsProxy

    limits = RateLimits(budgets)
    built: dict[str, Any] = {}
    with AwsProxy(url, share=share) as proxy:
        def provider_for(backend: Any) -> Any:
            # One adapter per cycle, as the composition root caches it (bootstrap.provider_factory).
            if "p" not in built:
                built["p"] = build_aws_provider(backend, connect_timeout=settings.provider_connect_timeout,
                                                read_timeout=settings.provider_read_timeout,
                                                endpoint_url=proxy.url, limits=limits)
            return built["p"]

        pipeline = Pipeline(settings=settings, db=db, provider_for=provider_for,
                            listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
        start = time.perf_counter()
        report = run_cycle(pipeline, BACKEND, mode=mode)
        seconds = time.perf_counter() - start
        log = proxy.log
    buckets = limits.buckets().values()
    cycle = Cycle("listing" if mode == "report" else "delete", share, report, len(log),
                  sum(r.refused for r in log), sum(b.throttles for b in buckets),
                  sum(b.waited for b in buckets), seconds)
    print(f"-- throttling: {cycle.kind} at {share:.0%} refused: {report.outcome}, {cycle.calls} calls, "
          f"{seconds:.1f} s", file=sys.stderr, flush=True)
    return cycle


def check(cycles: list[Cycle]) -> None:
    """Issue #17's promises, against the first (baseline) cycle of ``cycles``."""
    if not cycles:
        return
    base = cycles[0]
    if base.report.outcome != "clean" or base.refused:
        raise AssertionError(f"the baseline {base.kind} cycle is not a clean unthrottled one: {base.report.outcome}")
    for c in cycles:
        if c.throttles != c.refused:
            raise AssertionError(f"{c.kind} at {c.share:.0%}: the buckets saw {c.throttles} of {c.refused} refusals")
        if c.share >= 0.5:
            if c.report.outcome == "failed":
                raise AssertionError(f"{c.kind} at {c.share:.0%}: the cycle failed: {c.report.failures}")
            continue
        if c.report.outcome not in ("clean", "unsettled") or c.failed:
            raise AssertionError(f"{c.kind} at {c.share:.0%}: {c.report.outcome}, failures {c.report.failures}")
        if c.calls - base.calls > 2 * c.refused:
            raise AssertionError(f"{c.kind} at {c.share:.0%}: {c.calls - base.calls} extra calls "
                                 f"for {c.refused} refused")


COLUMNS = ["cycle", "refused share", "outcome", "regions failed", "regions unavailable", "calls", "refused",
           "extra calls", "extra / refused", "deleted", "bucket wait s", "wall ms", "wall x baseline"]


def _table(listings: list[Cycle], deletes: list[Cycle], per_region: int, orphans: int,
           budgets: Mapping[str, Any], setup: float) -> Table:
    t = Table(f"Cycles through a proxy refusing a share of calls (RequestLimitExceeded): moto, "
              f"{len(REGIONS)} regions, {2 * per_region * len(REGIONS):,} tagged resources", COLUMNS)
    for cycles in (listings, deletes):
        if not cycles:
            continue
        base = cycles[0]
        for c in cycles:
            extra = c.calls - base.calls
            t.add(**{"cycle": "report" if c.kind == "listing" else f"delete ({orphans} leaks)",
                     "refused share": f"{c.share:.0%}", "outcome": c.report.outcome,
                     "regions failed": c.failed, "regions unavailable": c.unavailable, "calls": c.calls,
                     "refused": c.refused, "extra calls": extra,
                     "extra / refused": extra / c.refused if c.refused and extra >= 0 else None,
                     "deleted": c.deleted if c.kind == "delete" else None, "bucket wait s": c.waited,
                     "wall ms": c.seconds * 1000, "wall x baseline": c.seconds / base.seconds})
    describe = budgets["describe"]
    t.notes += [
        "one cycle per row, through the same proxy (tests/support/aws_proxy.py) in front of one moto server; "
        "calls and refusals counted at the proxy (identity call included); extra calls = calls - the same "
        "cycle's calls at 0% refused (negative when nothing was listed: extra / refused then left out).",
        f"request budgets: the product's defaults (describe {describe.rate:g}/s, burst {describe.burst:g}, "
        "per account, region and API class), fresh for each cycle; retries: botocore standard mode, the "
        "product's default attempts. bucket wait s = seconds the buckets made callers sleep (summed over threads).",
        "checked before printing: below 50% refused no region failed and extra calls <= 2 x refused; "
        "a region still throttled after its retries is unavailable (unsettled), never failed.",
        f"fleet setup (not measured): {setup:.0f} s; delete rows: {orphans} fresh leaks each "
        "(owner terminated, instance running), the report fleet still listed.",
    ]
    return t
