"""Benchmark 3: a whole synthetic account through the in-process pipeline.

A synthetic provider generates the account's groups lazily, one region of
5,000 groups at a time (70 % tracked live owners, 2 % leaks of terminated or
hard-deleted owners, 5 % pending owners), against a ledger built with
``generate_series``. Each run is a subprocess on its own copy of the ledger
database, so its peak RSS (``VmHWM``) is its own.

Four ways to run one report cycle:

- ``run --json, buffered (before)``: ``runner.run_cycle`` as ``orphan-cleanup run``
  did it: a manual cycle (``record_all``), its batches classified as the lister
  streams them, then the whole C3 report read and dumped as one JSON string;
- ``run --json, streamed``: the same cycle, then the report as ``run --json`` writes
  it now: its header, then the groups page by page from the ledger
  (``LedgerStore.report_groups``, ``output.write_json_document``);
- ``lister, then drain``: the same queue discipline for a scheduled cycle
  (no ``record_all``, no report): what the queue holds is what grows;
- ``streaming (bench)``: a queue that hands each batch to the classifier as
  the lister publishes it (``StreamingQueue`` below), scheduled cycle.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import ledger_data as data
from bench.common import PgServer, Table, peak_rss_mb

PER_REGION = 5_000
VARIANTS = ("run --json, buffered (before)", "run --json, streamed", "lister, then drain", "streaming (bench)")
REPO = Path(__file__).resolve().parent.parent


def ledger_size(n_groups: int) -> int:
    """Refs needed so the account lists ``n_groups`` groups (77 per 100 refs)."""
    return (n_groups // 77 + 2) * 100


def account(n_groups: int) -> Iterator[tuple[int, str]]:
    """(ref index, kind) of every group the synthetic account lists, in order."""
    made = i = 0
    while made < n_groups:
        m = i % 100
        kind = "tracked" if m < 70 else "orphan" if m in (70, 85) else "pending" if m >= 95 else None
        if kind is not None:
            yield i, kind
            made += 1
        i += 1


def make_provider(n_groups: int) -> Callable[[Any], Any]:
    from orphan_cleanup.core.listing import RegionListing
    from orphan_cleanup.providers.base import ResourceProvider

    class SyntheticProvider(ResourceProvider):
        """Generates one region's groups at a time; nothing is kept between regions."""

        def reached_account(self) -> str:
            return self.backend.scope_account

        def iter_listing(self) -> Iterator[RegionListing]:
            created = datetime.now(UTC) - timedelta(days=2)
            it = account(n_groups)
            for region in self.backend.regions:
                groups = tuple(data.group_for(kind, i, created, region)
                               for _, (i, kind) in zip(range(PER_REGION), it, strict=False))
                yield RegionListing(region=region, groups=groups)

        def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
            raise AssertionError("report mode deletes nothing")

        def instance_created_at(self, instance: Any) -> Any:
            raise AssertionError("report mode deletes nothing")

        def delete_resource_group(self, group: Any, *args: Any, **kw: Any) -> Any:
            raise AssertionError("report mode deletes nothing")

    return lambda backend: SyntheticProvider(backend)


def streaming_queue(pipeline: Any) -> Any:
    """An in-process queue that classifies each listing batch as it is published,
    after the same serialization round trip a real queue imposes."""
    from orphan_cleanup.core.messages import ListingBatch
    from orphan_cleanup.queues.memory import InProcessQueue

    class StreamingQueue(InProcessQueue):
        def publish(self, message: Any) -> None:
            body = message.model_dump_json()
            if len(body.encode()) > self.max_message_bytes:
                raise ValueError(f"message of {len(body)} bytes exceeds {self.max_message_bytes}")
            pipeline.handle_batch(ListingBatch.model_validate_json(body))

    return StreamingQueue()


def child(args: dict[str, Any]) -> dict[str, Any]:
    """One cycle in this process; returns its figures (printed as JSON by ``main``)."""
    from bench.classifier import quiet_reporter
    from orphan_cleanup.core.settings import Settings
    from orphan_cleanup.cycle.pipeline import Pipeline
    from orphan_cleanup.cycle.runner import drain, run_cycle
    from orphan_cleanup.ledger.db import Database
    from orphan_cleanup.queues.memory import InProcessQueue

    rss_start = peak_rss_mb()
    n, variant = args["groups"], args["variant"]
    db = Database.from_url(args["url"])
    regions = tuple(f"s{i}" for i in range(math.ceil(n / PER_REGION)))
    data.add_backend(db, data.BACKEND, regions)
    pipeline = Pipeline(settings=Settings(), db=db, provider_for=make_provider(n),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue(), reporter=quiet_reporter())
    queued_bytes = 0
    report_groups = None
    start = time.perf_counter()
    if variant == "run --json, buffered (before)":  # what `run --json` did: the whole report, then one dumps
        report = run_cycle(pipeline, data.BACKEND, mode="report")
        with open(os.devnull, "w") as out:
            print(json.dumps(report.c3(), indent=2), file=out)
        report_groups = len(report.groups)
    elif variant == "run --json, streamed":  # commands.run: the header, then the groups page by page
        from orphan_cleanup.cli.output import write_json_document

        report = run_cycle(pipeline, data.BACKEND, mode="report", groups=False)
        counted = _Counted(pipeline.store.report_groups(report.cycle_id))
        with open(os.devnull, "w") as out:
            write_json_document({k: v for k, v in report.c3().items() if k != "groups"}, "groups", counted, out)
        report_groups = counted.n
    elif variant == "lister, then drain":
        pipeline.run_lister(data.BACKEND, mode="report", manual=False)
        queued_bytes = sum(len(b) for b in pipeline.listing_queue.items)
        drain(pipeline)
    else:
        pipeline.listing_queue = streaming_queue(pipeline)
        pipeline.run_lister(data.BACKEND, mode="report", manual=False)
    wall = time.perf_counter() - start
    with db.connection() as conn:
        outcome, batches, listed = conn.run(
            "SELECT outcome, applied_batches, groups_listed FROM cycles ORDER BY started_at DESC LIMIT 1")[0]
    return {"groups": n, "variant": variant, "wall": wall, "batches": batches, "listed": listed,
            "outcome": outcome, "rss_start": rss_start, "rss_peak": peak_rss_mb(),
            "queued_mb": queued_bytes / 2**20, "report_groups": report_groups}


class _Counted:
    """An iterator that counts what passes through it."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items, self.n = items, 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.n += 1
            yield item


def _spawn(url: str, n: int, variant: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-m", "bench.scale", json.dumps({"url": url, "groups": n,
                                                                            "variant": variant})],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"scale child failed ({variant}, {n}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(server: PgServer, quick: bool = False, sizes: tuple[int, ...] | None = None,
        variants: tuple[str, ...] = VARIANTS) -> list[Table]:
    sizes = sizes or ((10_000,) if quick else (10_000, 100_000))
    table = Table("Scale: one report cycle of a synthetic account through the in-process pipeline "
                  "(one subprocess per run)",
                  ["groups", "how", "batches", "wall s", "groups/s", "RSS start MB", "peak RSS MB",
                   "growth MB", "queued MB", "outcome"])
    template = server.fresh_database("oc_bench_scale")
    start = time.perf_counter()
    data.populate(template, 0, ledger_size(max(sizes)))
    build = time.perf_counter() - start
    try:
        for n in sizes:
            for variant in variants:
                db = server.clone(template, "oc_bench_scale_run")
                try:
                    r = _spawn(db.info.url(), n, variant)
                finally:
                    server.drop(db)
                assert r["listed"] == n and r["report_groups"] in (None, n), r
                table.add(**{"groups": n, "how": variant, "batches": r["batches"], "wall s": r["wall"],
                             "groups/s": n / r["wall"], "RSS start MB": r["rss_start"],
                             "peak RSS MB": r["rss_peak"], "growth MB": r["rss_peak"] - r["rss_start"],
                             "queued MB": r["queued_mb"] if variant == "lister, then drain" else None,
                             "outcome": r["outcome"]})
    finally:
        server.drop(template)
    table.notes += [
        f"ledger: {ledger_size(max(sizes)):,} refs built in {build:.1f} s; groups per region {PER_REGION:,}; "
        "outcome 'unsettled' is expected (pending owners are skipped).",
        "queued MB = serialized batches waiting in the in-process queue when the lister returned.",
        "RSS start = after imports; growth = peak - start.",
    ]
    return [table]


def main() -> None:
    print(json.dumps(child(json.loads(sys.argv[1]))))


if __name__ == "__main__":
    main()
