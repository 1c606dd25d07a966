"""Rule 23: "a region that failed to list keeps its marks (not seen is not changed)". But
``_SWEEP_SQL``'s ``ended`` keeps every mark of a region named in the cycle's failures, even
when this listing *did* see the group there and found it otherwise. A region counts as failed
while its other groups are classified (here: one group too large for a message, a failure of
its region, rule 20; likewise a GCP region failure over zones that listed). The group found
protected half a window ago is then deleted on its first mark."""

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.cycle.runner import run_cycle
from tests.attack.rule23_harness import WINDOW, Clock, actions, pipeline
from tests.support.memory_cloud import MemoryCloud
from tests.support.platform import Platform, add_backend


def test_group_seen_protected_in_a_region_with_a_failure_keeps_its_old_mark(db):
    cloud = MemoryCloud()
    add_backend(db, mode="delete", regions=("r1",))
    p = Platform(db, cloud)
    _, _, iid = p.terminated_leak("r1")
    clock = Clock(db)
    pl = pipeline(db, cloud, clock)
    pl.lister.listing_queue.max_message_bytes = 4096 + 2000

    first = run_cycle(pl, "mem", mode="delete")
    assert actions(first)[iid][2] == "marked"

    # Half a window later: the VM is protected (seen so, classified so), and another ref's
    # leftovers in the same region are too large for one message: r1 is a failed region.
    clock.advance(WINDOW / 2)
    cloud.resources[iid].tags[DEFAULT_PROTECT_KEY] = "yes"
    big = [cloud.create(ResourceKind.VOLUME, "r1", {DEFAULT_TAG_KEY: "zzzzforeign1", f"k{i}": "v" * 40})
           for i in range(80)]
    second = run_cycle(pl, "mem", mode="delete")
    assert actions(second)[iid][:2] == ("protected", "protect_tag")
    assert any(f["region"] == "r1" for f in second.c3()["failures"]), second.c3()["failures"]

    # The protection is lifted and the big group is gone; half a window after the listing
    # that found it protected, the group must be marked again, not deleted.
    del cloud.resources[iid].tags[DEFAULT_PROTECT_KEY]
    for v in big:
        del cloud.resources[v]
    clock.advance(WINDOW / 2)
    third = run_cycle(pl, "mem", mode="delete")
    assert cloud.exists(iid), f"deleted on a stale mark: {actions(third)[iid]}"
    assert actions(third)[iid][2] == "marked"
