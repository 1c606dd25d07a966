"""Benchmark 2: listing cost, in provider API calls and time.

AWS: the real adapter (``build_aws_provider``) against a moto server over
HTTP, 1,000 tagged instances each with its root volume and primary ENI tagged
with the same ref, plus untagged instances of someone else. Calls are counted
with botocore event hooks (``before-parameter-build`` per API call,
``before-send`` per HTTP request). Baselines, measured in the same run on the
same fleet, must return the same groups:

- no server-side tag filter: the adapter's describes without ``tag-key``,
  filtered client-side;
- the Resource Groups Tagging API, then one describe per resource (what the
  design rules out: the tagging index also lags deletions by up to an hour).

GCP: the real adapter (``build_gcp_provider``) against the fake Compute
server, 1,000 labelled instances each with a labelled data disk, plus
unlabelled instances; calls counted by the fake. Baseline: the same
aggregated lists without the ``labels.KEY:*`` filter, filtered client-side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.common import Table
from orphan_cleanup.core.listing import ResourceGroup

TAG = "provider_ref"


@dataclass
class Measured:
    groups: list[ResourceGroup]
    calls: int
    requests: int
    seconds: float
    reply_bytes: int | None = None


def _key(groups: list[ResourceGroup]) -> set[tuple[str, str, str | None, frozenset[str]]]:
    return {(g.provider_ref, g.region, g.primary_id, frozenset(g.resource_ids())) for g in groups}


def run(quick: bool = False) -> list[Table]:
    from bench import listing_aws as aws
    from bench import listing_gcp as gcp
    from tests.support.gcp_fake import FakeCompute

    n_ours = 200 if quick else 1_000
    # moto slows down super-linearly past ~1,000 instances (tests/support/moto.py); the fake does not.
    others = {"aws": 50 if quick else 200, "gcp": 400 if quick else 2_000}
    reps = 3
    table = Table(f"Listing cost: one region, {n_ours:,} instances of ours with their root volume and ENI "
                  "(AWS) or data disk (GCP), plus untagged instances of others",
                  ["cloud", "method", "others", "groups", "resources", "API calls", "HTTP requests",
                   "calls/1k resources", "floor/1k", "x floor", "reply KB", "listing s", "x shipped"])
    # AWS
    with aws.moto_server():
        start = time.perf_counter()
        ours = aws.build_aws_fleet(n_ours, others["aws"])
        setup_aws = time.perf_counter() - start
        variants = [("shipped: describe + tag-key filter, largest pages", aws.aws_shipped, reps),
                    ("before #17: EC2's default page size", aws.aws_old_page_size, reps),
                    ("shipped, the first 6 kinds only (no launch templates, key pairs, placement groups,"
                     " load balancers, target groups)", aws.aws_first_kinds, reps),
                    ("no server-side filter", aws.aws_unfiltered, reps),
                    ("Tagging API + describe per resource", aws.aws_tagging_api, 1)]
        try:
            measured = aws.measure_all([make for _, make, _ in variants], [r for _, _, r in variants])
        except Exception as exc:  # noqa: BLE001 - report it in the table, keep the other benchmarks
            measured = exc
        _add_rows(table, "aws", ours, others["aws"],
                  [(name, _result(measured, i)) for i, (name, _, _) in enumerate(variants)], floor=aws.aws_floor())
    # GCP
    with FakeCompute() as fake:
        start = time.perf_counter()
        ours = gcp.build_gcp_fleet(fake, n_ours, others["gcp"])
        setup_gcp = time.perf_counter() - start
        try:
            gcp_measured: list[Measured] | Exception = gcp.measure(fake, reps)
        except Exception as exc:  # noqa: BLE001 - report it in the table
            gcp_measured = exc
        _add_rows(table, "gcp", ours, others["gcp"], [
            ("shipped: aggregatedList + labels filter, maxResults 500", _result(gcp_measured, 0)),
            ("no server-side filter", _result(gcp_measured, 1)),
            ("shipped, the first kinds only (instances, disks, addresses: no forwarding rules, images)",
             _result(gcp_measured, 2)),
        ], floor=gcp.gcp_floor(n_ours))
    table.notes += [
        "every method returns the same groups (checked); listing s = median of "
        f"{reps} interleaved listings (1 for per-resource describes) after a warm-up.",
        "calls/1k resources = API calls per 1,000 of our listed resources; floor/1k = the fewest calls that "
        "can list them (one call per kind and per page of the API's largest size: EC2 1,000, Compute 500), "
        "x floor = calls / floor (issue #17: at most 1.1). On GCP the page size was already 500 before #17. "
        "moto and the fake run locally and "
        "filter in Python: their time is mostly their own work (moto's tag-key filter is slower than no filter); "
        "a real cloud adds ~50-200 ms of latency per call and bills every page it returns.",
        f"fleet setup (not measured): aws {setup_aws:.0f} s, gcp {setup_gcp:.0f} s.",
    ]
    return [table]


def _result(measured: list[Measured] | Exception, i: int) -> Callable[[], Measured]:
    def get() -> Measured:
        if isinstance(measured, Exception):
            raise measured
        return measured[i]
    return get


def _add_rows(table: Table, cloud: str, ours: int, others: int,
              variants: list[tuple[str, Callable[[], Measured]]], *, floor: int) -> None:
    base: Measured | None = None
    for name, measure in variants:
        try:
            m = measure()
        except Exception as exc:  # noqa: BLE001 - a broken baseline must not hide the others
            table.add(cloud=cloud, method=name, groups=f"error: {type(exc).__name__}: {exc}"[:120])
            continue
        if base is None:
            base = m
        elif _key(m.groups) != _key(base.groups):
            table.add(cloud=cloud, method=name, groups="error: groups differ from the shipped listing")
            continue
        n_res = sum(len(g.resources) for g in m.groups)
        table.add(**{"cloud": cloud, "method": name, "others": others, "groups": len(m.groups), "resources": n_res,
                     "API calls": m.calls, "HTTP requests": m.requests,
                     "calls/1k resources": m.calls * 1000 / max(1, ours),
                     "floor/1k": floor * 1000 / max(1, ours), "x floor": m.calls / floor,
                     "reply KB": m.reply_bytes / 1024 if m.reply_bytes is not None else None,
                     "listing s": m.seconds,
                     "x shipped": m.seconds / base.seconds})
