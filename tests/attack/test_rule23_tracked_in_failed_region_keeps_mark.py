"""Rule 23: "A listing that finds the group otherwise (another verdict ...) ends the mark".
The fix of the first attacker's finding ends a mark in a failed region only when the group is in
this cycle's ``cycle_groups``; but a scheduled cycle records only orphan, protected and skipped
groups (``classify.RECORDED``): a group found TRACKED in a region that counts as failed (here:
another ref's group too large for a message, rule 20) is written nowhere, so its old mark
survives, and the intermediate-cycle check (``rg.verdict <> 'orphan'``) finds no row either.
When the owner ends again the group is deleted on the first, stale, mark."""

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.cycle.runner import drain
from tests.attack.rule23_harness import WINDOW, Clock, pipeline
from tests.support.memory_cloud import MemoryCloud
from tests.support.platform import Platform, add_backend


def _scheduled(db, pl) -> tuple[str, dict[str, tuple[str, str, str]], list]:
    """One scheduled cycle (record_all off) of backend mem, drained: its id, its recorded groups
    by primary (verdict, reason, action) and its failures."""
    res = pl.run_lister("mem", mode="delete", manual=False)
    assert res.reason not in ("not_due", "no_activity", "busy"), res
    drain(pl)
    with db.connection() as conn:
        [[cid, failures]] = conn.run("SELECT id, failures FROM cycles ORDER BY listed_at DESC LIMIT 1")
        rows = conn.run("SELECT primary_id, verdict, reason, action FROM cycle_groups WHERE cycle_id = :c", c=cid)
    return cid, {r[0]: tuple(r[1:]) for r in rows}, failures


def test_group_seen_tracked_in_failed_region_keeps_stale_mark(db):
    cloud = MemoryCloud()
    add_backend(db, mode="delete", regions=("r1",))
    p = Platform(db, cloud)
    _, owner, iid = p.terminated_leak("r1")
    clock = Clock(db)
    pl = pipeline(db, cloud, clock, interval_seconds=60)
    pl.lister.listing_queue.max_message_bytes = 4096 + 2000

    _, first, _ = _scheduled(db, pl)
    assert first[iid][2] == "marked"

    # Half a window later the owner is live again (the platform took it back): this listing
    # finds the group TRACKED, in a region that counts as failed (a too-large foreign group).
    clock.advance(WINDOW / 2)
    p.ledger.set_status(owner, OwnerStatus.BUSY)
    big = [cloud.create(ResourceKind.VOLUME, "r1", {DEFAULT_TAG_KEY: "zzzzforeign1", f"k{i}": "v" * 40})
           for i in range(80)]
    _, second, failures = _scheduled(db, pl)
    assert iid not in second  # tracked: not recorded by a scheduled cycle
    assert any(f["region"] == "r1" for f in failures), failures
    with db.connection() as conn:
        assert conn.run("SELECT count(*) FROM orphan_marks")[0][0] == 0  # ended: not seen counts as changed

    # The owner ends again; half a window after the listing that found the group tracked, the
    # group must be marked again (the run of orphan listings began at the third listing).
    p.ledger.mark_terminated(owner)
    for v in big:
        del cloud.resources[v]
    clock.advance(WINDOW / 2 + 1)
    _, third, _ = _scheduled(db, pl)
    assert cloud.exists(iid), f"deleted on a mark a tracked listing should have ended: {third[iid]}"
