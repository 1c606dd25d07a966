"""Benchmark: the AWS listing next to what users would run instead (issue #17).

One moto server, behind a counting proxy (``tests.support.aws_proxy``) that every
lister goes through, holds a fleet of instances, each with its root volume and
primary ENI; a share of them (``TAGGED_SHARE``) carries the ref tag, one ref per
instance, the rest is someone else's. Three listers of the same fleet, run
interleaved after a warm-up, medians of ``reps``:

- **product**: ``build_aws_provider(...).iter_listing()``, the describes of every
  kind it handles with the ``tag-key`` filter (server-side);
- **naive (aws-nuke style)**: the same describes with no filter and the default
  page size, the tag matched in Python;
- **Cloud Custodian**: ``custodian run`` (``c7n`` pinned in ``bench.peers_c7n``, in its own
  virtualenv under ``~/.cache/orphan-cleanup/bench-peers``, built on first use
  from PyPI) with one policy per kind of the fleet (``aws.ec2``, ``aws.ebs``,
  ``aws.eni``), each filtering on ``tag:KEY: present``; a subprocess per run, so
  its wall time includes starting Python and c7n, as a user pays it.

Calls and reply bytes are counted at the proxy for all three. Every lister must
return the same resource ids (checked).
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Table, median
from bench.listing import TAG
from bench.listing_aws import AMI, REGION
from bench.peers_c7n import C7N_VERSION, PeerUnavailable, custodian_lister, ensure_custodian
from tests.support.aws_proxy import AwsProxy

TAGGED_SHARE = 0.2
PER_RESERVATION = 10  # instances per run_instances call (one reservation each)
MOTO_PAGE = 100  # moto pages describe_instances by reservation, 100 a page by default; the rest in one page

Lister = Callable[[], set[str]]


@dataclass
class Fleet:
    resources: int  # instances + their root volumes + their ENIs
    ours: int  # resources carrying the ref tag
    reservations: int
    our_reservations: int
    setup_seconds: float


@dataclass
class Result:
    lister: str
    ids: set[str]
    calls: Counter[str]
    reply_bytes: int
    seconds: list[float] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)  # calls of each run (custodian's vary, see _peers_table)

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def calls_label(self) -> int | str:
        low, high = min(self.totals, default=0), max(self.totals, default=0)
        return low if low == high else f"{low}-{high}"


Measured = tuple[Fleet, dict[str, Result]]


# ---- the fleet -----------------------------------------------------------------------------


def build_fleet(ec2: Any, n_resources: int, tagged_share: float = TAGGED_SHARE,
                per_reservation: int = PER_RESERVATION) -> Fleet:
    """``n_resources / 3`` instances (each with its root volume and primary ENI) launched
    ``per_reservation`` at a time; the first ``tagged_share`` of them get one ref each on
    all three resources. ``ec2`` should talk to moto directly (setup is not counted)."""
    start = time.perf_counter()
    n_instances = max(1, round(n_resources / 3))
    n_ours = round(n_instances * tagged_share)
    reservations = our_reservations = 0
    for launched, tagged in ((0, n_ours), (n_ours, n_instances - n_ours)):
        left = tagged
        while left > 0:
            count = min(per_reservation, left)
            left -= count
            reservations += 1
            reply = ec2.run_instances(ImageId=AMI, MinCount=count, MaxCount=count)
            if launched == 0:
                our_reservations += 1
                for inst in reply["Instances"]:
                    _tag(ec2, inst)
    return Fleet(3 * n_instances, 3 * n_ours, reservations, our_reservations, time.perf_counter() - start)


def _tag(ec2: Any, inst: dict[str, Any]) -> None:
    iid = inst["InstanceId"]
    ids = [iid, inst["NetworkInterfaces"][0]["NetworkInterfaceId"]]
    volumes = [b["Ebs"]["VolumeId"] for b in inst.get("BlockDeviceMappings") or []]
    if not volumes:  # moto's run_instances reply may omit the mappings; describe says them
        desc = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
        volumes = [b["Ebs"]["VolumeId"] for b in desc["BlockDeviceMappings"]]
    ec2.create_tags(Resources=ids + volumes[:1], Tags=[{"Key": TAG, "Value": f"ref-{iid}"}])


def naive_instance_pages(reservations: int) -> int:
    return max(1, math.ceil(reservations / MOTO_PAGE))


# ---- the listers ---------------------------------------------------------------------------


def product_lister(endpoint: str, session: Any = None) -> Lister:
    import boto3

    from orphan_cleanup.core.backends import Backend
    from orphan_cleanup.providers.aws.provider import build_aws_provider
    from orphan_cleanup.providers.ratelimit import DESCRIBE, Budget, RateLimits
    from tests.support.listing import collect

    backend = Backend(id="bench-peers", provider="aws", account="123456789012", regions=(REGION,))
    # The request budget (5 describes/s by default) would time the bucket, not the listing: off here.
    unlimited = RateLimits({DESCRIBE: Budget(rate=1e9, burst=1e9)})
    provider = build_aws_provider(backend, connect_timeout=5, read_timeout=300, session=session or boto3.Session(),
                                  endpoint_url=endpoint, limits=unlimited)

    def listing() -> set[str]:
        result = collect(provider)
        if result.failures:
            raise RuntimeError(f"listing failed: {result.failures}")
        return {r.id for g in result.groups for r in g.resources}

    return listing


def naive_lister(endpoint: str, session: Any = None) -> Lister:
    """aws-nuke style: describe every resource of every kind the product handles (no
    filter, default page size), keep those carrying the tag key."""
    import boto3

    from orphan_cleanup.providers.aws import provider as aws
    from orphan_cleanup.providers.aws.kinds import listed_kinds
    from orphan_cleanup.providers.aws.listing import TAGS_PER_CALL, with_tags

    config = aws.client_config(connect_timeout=5, read_timeout=300)
    kinds = listed_kinds(None)
    clients = {service: (session or boto3.Session()).client(service, region_name=REGION, endpoint_url=endpoint,
                                                            config=config) for service in {k.service for k in kinds}}

    def listing() -> set[str]:
        ids: set[str] = set()
        for spec in kinds:
            client = clients[spec.service]
            if client.can_paginate(spec.describe):
                pages: Any = client.get_paginator(spec.describe).paginate()
            else:
                pages = [getattr(client, spec.describe)()]
            items = [item for page in pages for item in spec.items(page)]
            if spec.tags_by_arn:  # ELBv2 items carry no tags: read them as the product does, 20 a call
                items = [i for k in range(0, len(items), TAGS_PER_CALL)
                         for i in with_tags(client, spec, items[k:k + TAGS_PER_CALL])]
            ids |= {spec.item_id(item) for item in items
                    if any(t.get("Key") == TAG for t in item.get(spec.tags_field) or ())}
        return ids

    return listing




# ---- measuring -----------------------------------------------------------------------------


def measure(proxy: AwsProxy, listers: dict[str, Lister], reps: int) -> dict[str, Result]:
    """Warm each lister up once, then run them interleaved ``reps`` times; calls and
    bytes of the last run (they do not vary), wall times of all."""
    for listing in listers.values():
        listing()
    results: dict[str, Result] = {}
    for _ in range(reps):
        for name, listing in listers.items():
            proxy.reset()
            start = time.perf_counter()
            ids = listing()
            elapsed = time.perf_counter() - start
            calls, size = proxy.action_counts(), proxy.reply_bytes
            result = results.setdefault(name, Result(name, ids, calls, size))
            result.ids, result.calls, result.reply_bytes = ids, calls, size
            result.seconds.append(elapsed)
            result.totals.append(sum(calls.values()))
    return results


def sweep(sizes: tuple[int, ...], reps: int, with_custodian: bool = True,
          custodian_sizes: tuple[int, ...] | None = None) -> tuple[list[Measured], str | None]:
    """Measure every lister on a fleet of each size (one moto server, reset between sizes);
    custodian only at ``custodian_sizes`` (default: every size).
    Returns the measurements and why custodian is missing (None when it ran)."""
    import boto3

    from bench.listing_aws import moto_server
    from tests.support.moto import reset_moto

    custodian: Path | None = None
    missing: str | None = None if with_custodian else "not requested"
    if with_custodian:
        try:
            custodian = ensure_custodian()
        except PeerUnavailable as exc:
            missing = str(exc)
            print(f"-- peers: Cloud Custodian skipped: {exc}", file=sys.stderr, flush=True)
    out: list[Measured] = []
    with moto_server() as url, AwsProxy(url) as proxy, tempfile.TemporaryDirectory(prefix="oc-peers-") as tmp:
        direct = boto3.client("ec2", region_name=REGION, endpoint_url=url)
        base = {"product": product_lister(proxy.url), "naive": naive_lister(proxy.url)}
        peer = custodian_lister(custodian, proxy.url, Path(tmp)) if custodian is not None else None
        for size in sizes:
            listers = dict(base)
            if peer is not None and (custodian_sizes is None or size in custodian_sizes):
                listers["custodian"] = peer
            reset_moto(url)
            fleet = build_fleet(direct, size)
            print(f"-- peers: {fleet.resources:,} resources in {fleet.setup_seconds:.0f} s; listing x{reps} ...",
                  file=sys.stderr, flush=True)
            try:
                results = measure(proxy, listers, reps)
            except RuntimeError as exc:  # a broken peer must not hide the other listers
                if listers.pop("custodian", None) is None:
                    raise
                peer, missing = None, str(exc)[:200]
                print(f"-- peers: Cloud Custodian dropped: {missing}", file=sys.stderr, flush=True)
                results = measure(proxy, listers, reps)
            for name, r in results.items():
                if r.ids != results["product"].ids:
                    raise RuntimeError(f"{name} listed {len(r.ids)} resources, the product "
                                       f"{len(results['product'].ids)}: not the same fleet")
            out.append((fleet, results))
    return out, missing


LABELS = {"product": "orphan-cleanup (describe + tag-key filter)",
          "naive": "naive, aws-nuke style (describe all, filter in Python)",
          "custodian": f"Cloud Custodian {C7N_VERSION} (custodian run, tag: present)"}


def run(quick: bool = False, plot: str | None = None) -> list[Table]:
    sizes = (100, 1_000) if quick else (100, 1_000, 5_000)
    reps = 3 if quick else 5
    # --quick: custodian (a subprocess of ~1-4 s a run) at the largest size only, the one of the peers table.
    measured, missing = sweep(sizes, reps, custodian_sizes=sizes[-1:] if quick else None)
    tables = [_peers_table(*measured[-1], reps, missing), _sweep_table(measured, reps)]
    if quick:
        tables[1].notes.append(f"--quick: Cloud Custodian at {sizes[-1]:,} resources only.")
    if plot:
        from bench.plot import plot_sweep

        plot_sweep(tables[1].rows, Path(plot))
        tables[1].notes.append(f"plot written to {plot}")
    return tables


def _peers_table(fleet: Fleet, results: dict[str, Result], reps: int, missing: str | None) -> Table:
    t = Table(f"Listing the same moto fleet: {fleet.resources:,} resources (instances, root volumes, ENIs), "
              f"{fleet.ours:,} tagged {TAG}",
              ["lister", "resources listed", "calls", "reply KB", "wall ms", "calls x product", "wall x product"])
    base = results["product"]
    for name, r in results.items():
        t.add(**{"lister": LABELS[name], "resources listed": len(r.ids), "calls": r.calls_label(),
                 "reply KB": r.reply_bytes / 1024, "wall ms": median(r.seconds) * 1000,
                 "calls x product": median([float(x) for x in r.totals]) / base.total_calls,
                 "wall x product": median(r.seconds) / median(base.seconds)})
    if missing:
        t.add(lister=LABELS["custodian"], **{"resources listed": f"not run: {missing}"})
    t.notes += [f"wall ms = median of {reps} interleaved runs after a warm-up; calls and reply bytes counted "
                "at a proxy in front of moto, the same for all three listers; all list the same resource ids.",
                "calls by action: " + "; ".join(f"{n}: " + ", ".join(f"{a} {c}" for a, c in sorted(r.calls.items()))
                                                for n, r in results.items()),
                "custodian's calls vary from run to run: c7n samples up to 5 random instances and, when none of "
                "them has tags, reads every instance's tags with one more DescribeTags call.",
                "custodian's wall time includes starting its process (Python, boto3, c7n) each run, as a user pays it.",
                f"fleet setup (not measured): {fleet.setup_seconds:.0f} s for {fleet.reservations} reservations."]
    return t


def _sweep_table(measured: list[Measured], reps: int) -> Table:
    t = Table("Listing cost against fleet size (moto, one region, "
              f"{TAGGED_SHARE:.0%} of the instances tagged, {PER_RESERVATION} instances per reservation)",
              ["fleet resources", "tagged", "lister", "calls", "reply KB", "wall ms", "calls x product",
               "wall x product"])
    for fleet, results in measured:
        base = results["product"]
        for name, r in results.items():
            t.add(**{"fleet resources": fleet.resources, "tagged": fleet.ours, "lister": name,
                     "calls": r.calls_label(), "median calls": median([float(x) for x in r.totals]),
                     "reply KB": r.reply_bytes / 1024, "wall ms": median(r.seconds) * 1000,
                     "calls x product": median([float(x) for x in r.totals]) / base.total_calls,
                     "wall x product": median(r.seconds) / median(base.seconds)})
    t.notes += [f"median of {reps} interleaved runs; setup per size: "
                + ", ".join(f"{f.resources:,}: {f.setup_seconds:.0f} s" for f, _ in measured),
                "moto pages only describe_instances (100 reservations a page by default) and returns every other "
                "kind in one page, so call counts here understate what an unfiltered listing pays on AWS."]
    return t
