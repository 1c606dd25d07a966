"""Rule 23: a delete-mode listing that found the marked group *otherwise* (here: protected by
its tag) must end the mark. When that cycle fails after its first batches were classified (a
listing-queue publish that fails, a listing that outlives its lease, ...), ``dispatch_deletes``
(the only caller of ``LockedCycle.sweep``) never runs, so the mark keeps its old time: the next
cycle deletes the group at once although, half a window earlier, it was found protected."""

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.queues.memory import InProcessQueue
from tests.attack.rule23_harness import WINDOW, Clock, actions, pipeline
from tests.support.memory_cloud import MemoryCloud
from tests.support.platform import Platform, add_backend


class FailingLastPublish(InProcessQueue):
    """The listing queue: the last batch of an armed cycle fails to publish (an SQS outage)."""

    armed = False

    def publish(self, message):  # type: ignore[override]
        if self.armed and getattr(message, "last", False):
            raise ConnectionError("listing queue unavailable")
        return super().publish(message)


def test_failed_cycle_that_saw_the_group_protected_does_not_end_its_mark(db):
    cloud = MemoryCloud()
    add_backend(db, mode="delete", regions=("r1",))
    p = Platform(db, cloud)
    _, _, iid = p.terminated_leak("r1")
    p.foreign("r1")  # another group after it (ref zzzz...): the orphan's batch goes out first
    clock = Clock(db)
    pl = pipeline(db, cloud, clock)
    queue = FailingLastPublish()
    # one group per batch: the orphan's batch is published (and classified) before the last one
    queue.max_message_bytes = 4096 + 700
    pl.lister.listing_queue = queue

    first = run_cycle(pl, "mem", mode="delete")
    assert actions(first)[iid][2] == "marked"

    # Half a window later the VM is protected by its tag; this delete cycle classifies it so
    # (verdict protected), then fails before its listing completes.
    clock.advance(WINDOW / 2)
    cloud.resources[iid].tags[DEFAULT_PROTECT_KEY] = "yes"
    queue.armed = True
    try:
        run_cycle(pl, "mem", mode="delete")
    except Exception:
        pass
    queue.armed = False
    with db.connection() as conn:
        seen = conn.run("SELECT g.verdict FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id"
                        " WHERE g.primary_id = :i ORDER BY c.started_at DESC LIMIT 1", i=iid)
    assert seen == [["protected"]], seen  # the failed cycle did find it otherwise

    # The protection is lifted; the next delete listing, half a window after the one that found
    # it protected, must mark it again (rule 23), not delete it.
    del cloud.resources[iid].tags[DEFAULT_PROTECT_KEY]
    clock.advance(WINDOW / 2)
    third = run_cycle(pl, "mem", mode="delete")
    assert cloud.exists(iid), f"deleted on a stale mark: {actions(third)[iid]}"
    assert actions(third)[iid][2] == "marked"
