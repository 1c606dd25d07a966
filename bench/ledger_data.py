"""A synthetic ledger and matching listing batches for the classifier benchmark.

The ledger is written by SQL alone (``INSERT ... SELECT generate_series``), so
a million refs take seconds. Ref ``i`` is ``'r' || lpad(i, 11, '0')`` and its
owner's role follows ``i % 100``:

====== ===================================================== =========
i%100  owner                                                  share
====== ===================================================== =========
0-34   busy, provisioned, primary ``i-<hex(i)>`` in r1        35 %
35-69  idle, same                                             35 %
70-84  terminated a day after provisioning                    15 %
85-94  hard-deleted placeholder (the ref stays, no instance)  10 %
95-99  pending for 30 minutes (no provisioning data yet)       5 %
====== ===================================================== =========

Every timestamp is older than the 5-minute margin. A listing batch is mostly
what a healthy account looks like: groups of live owners (tracked), with a few
leaks (terminated/hard-deleted owners: orphans), pending owners (skipped),
unattached volumes of live owners (protected, and they exercise the leftover
sub-query) and foreign refs that are not in the ledger (ignored).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.ledger.db import Database

BACKEND = "bench"
REGION = "r1"
TAG = "provider_ref"

# Share of each kind of group in a listing batch (sums to 1).
BATCH_MIX = (
    ("tracked", 0.94),
    ("orphan", 0.02),
    ("pending", 0.01),
    ("leftover", 0.01),
    ("foreign", 0.02),
)
ROLE_RANGES = {"tracked": range(0, 70), "orphan": range(70, 95), "pending": range(95, 100),
               "leftover": range(0, 70)}

POPULATE_REFS = """
INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name, issued_at)
SELECT 'r' || lpad(i::text, 11, '0'), 'instance', 'inst-' || i, 'job-' || i,
       now() - interval '2 days' - (i % 1440) * interval '1 minute'
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS i
"""

POPULATE_INSTANCES = """
INSERT INTO instances (id, name, provider_ref, status, backend_id, primary_id, region,
                       created_at, provisioned_at, terminated_at)
SELECT 'inst-' || i, 'job-' || i, 'r' || lpad(i::text, 11, '0'),
       CASE WHEN m < 35 THEN 'busy' WHEN m < 70 THEN 'idle' WHEN m < 85 THEN 'terminated' ELSE 'pending' END,
       CASE WHEN m < 85 THEN :backend END,
       CASE WHEN m < 85 THEN 'i-' || lpad(to_hex(i), 17, '0') END,
       CASE WHEN m < 85 THEN :region END,
       CASE WHEN m < 85 THEN t + interval '1 second' ELSE now() - interval '30 minutes' END,
       CASE WHEN m < 85 THEN t + interval '1 minute' END,
       CASE WHEN m >= 70 AND m < 85 THEN t + interval '1 day' END
  FROM (SELECT i, i % 100 AS m, now() - interval '2 days' - (i % 1440) * interval '1 minute' AS t
          FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS i) s
 WHERE m < 85 OR m >= 95
"""


def ref(i: int) -> str:
    return f"r{i:011d}"


def primary(i: int) -> str:
    return f"i-{i:017x}"


def add_backend(db: Database, backend_id: str = BACKEND, regions: tuple[str, ...] = (REGION,)) -> None:
    with db.transaction() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions)"
                 " VALUES (:b, 'aws', '123456789012', CAST(:r AS text[])) ON CONFLICT DO NOTHING",
                 b=backend_id, r=list(regions))


def populate(db: Database, lo: int, hi: int, backend_id: str = BACKEND) -> None:
    """Add refs ``lo..hi-1`` (and their owners) to the ledger, then refresh statistics.

    Row triggers (the STEP 1 activity log) are disabled for the load only: they
    are irrelevant to the join and would double the load time."""
    with db.transaction() as conn:
        conn.run("SET LOCAL session_replication_role = replica")
        conn.run(POPULATE_REFS, lo=lo, hi=hi)
        conn.run(POPULATE_INSTANCES, lo=lo, hi=hi, backend=backend_id, region=REGION)
    with db.connection() as conn:
        conn.run("VACUUM ANALYZE provider_refs")
        conn.run("VACUUM ANALYZE instances")


def _resource(kind: ResourceKind, rid: str, ref_value: str, created: datetime, attached: str | None,
              region: str, state: ResourceState = ResourceState.ACTIVE) -> Resource:
    details = {"state": "running" if kind is ResourceKind.INSTANCE else ("in-use" if attached else "available"),
               "AvailabilityZone": f"{region}a"}
    if kind is ResourceKind.INSTANCE:
        details["VpcId"] = "vpc-0123456789abcdef0"
    return Resource(kind=kind, id=rid, region=region, state=state, tags={TAG: ref_value, "Name": f"job-{rid}"},
                    created_at=created, attached_to=attached, details=details)


def group_for(kind: str, i: int, created: datetime, region: str = REGION) -> ResourceGroup:
    """One listed group of ref ``i`` (``kind`` from ``BATCH_MIX``): an instance
    and its volume, a lone volume (leftover), or a foreign instance."""
    if kind == "foreign":
        r = f"f{i:011d}"
        iid = f"i-f{i:016x}"
        return ResourceGroup(provider_ref=r, region=region, primary_id=iid, resources=(
            _resource(ResourceKind.INSTANCE, iid, r, created, None, region),))
    r = ref(i)
    vol = f"vol-{i:017x}"
    if kind == "leftover":
        return ResourceGroup(provider_ref=r, region=region, primary_id=None, resources=(
            _resource(ResourceKind.VOLUME, vol, r, created, None, region, ResourceState.AVAILABLE),))
    iid = primary(i)
    return ResourceGroup(provider_ref=r, region=region, primary_id=iid, resources=(
        _resource(ResourceKind.INSTANCE, iid, r, created, None, region),
        _resource(ResourceKind.VOLUME, vol, r, created, iid, region)))


def mix_counts(n_refs: int, size: int) -> dict[str, int]:
    """How many groups of each kind a batch of ``size`` holds. When the ledger
    has fewer refs of a kind than the mix asks for (a 10k batch against a 10k
    ledger), every such ref is listed and the rest are foreign refs."""
    want = {k: max(1, round(size * s)) for k, s in BATCH_MIX if k != "tracked"}
    want["tracked"] = size - sum(want.values())
    blocks = max(1, n_refs // 100)
    live = blocks * len(ROLE_RANGES["tracked"])
    out = {}
    for kind in ("orphan", "pending"):
        out[kind] = min(want[kind], blocks * len(ROLE_RANGES[kind]) // 2)
    out["leftover"] = min(want["leftover"], live // 10)
    out["tracked"] = min(want["tracked"], int(live * 0.9) - out["leftover"])
    out["foreign"] = size - sum(out.values())
    return out


def make_groups(n_refs: int, size: int, rng: random.Random) -> list[ResourceGroup]:
    """``size`` groups of distinct refs drawn from a ledger of ``n_refs`` refs
    (``n_refs`` a multiple of 100), in the proportions of ``mix_counts``."""
    taken: set[int] = set()
    created = datetime.now(timezone.utc) - timedelta(days=2)
    groups: list[ResourceGroup] = []
    blocks = max(1, n_refs // 100)
    for kind, want in mix_counts(n_refs, size).items():
        made = 0
        while made < want:
            if kind == "foreign":
                i = rng.randrange(10**10)
                if -i - 1 in taken:
                    continue
                taken.add(-i - 1)
            else:
                i = rng.randrange(blocks) * 100 + rng.choice(ROLE_RANGES[kind])
                if i in taken:
                    continue
                taken.add(i)
            groups.append(group_for(kind, i, created))
            made += 1
    rng.shuffle(groups)
    return groups


def listing_batch(cycle_id: str, seq: int, listed_at: datetime, groups: list[ResourceGroup],
                  backend_id: str = BACKEND) -> ListingBatch:
    """A real queue message: built, serialized and parsed back as the classifier receives it."""
    batch = ListingBatch(cycle_id=cycle_id, backend=backend_id, seq=seq, listed_at=listed_at, mode="report",
                         record_all=False, groups=tuple(groups), last=False)
    return ListingBatch.model_validate_json(batch.model_dump_json())
