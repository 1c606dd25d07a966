"""SAFETY.md rule 14 against the in-memory cloud the simulation runs on: it refuses to
terminate a protected or controller-managed instance as the real adapters do, and the
real pipeline reports such a group and never loops on it (P1/P2 in the simulation)."""

from __future__ import annotations

from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend


def _cycle(pipeline: Pipeline, mode: str = "delete") -> list[DeleteRequest]:
    """One manual listing, classified: the delete requests it dispatched."""
    pipeline.delete_queue.items.clear()
    pipeline.run_lister("mem", mode=mode, manual=True)
    while (body := pipeline.listing_queue.pop()) is not None:
        pipeline.handle_batch(ListingBatch.model_validate_json(body))
    return [DeleteRequest.model_validate_json(b) for b in pipeline.delete_queue.items]


def _pipeline(db: Database, cloud: MemoryCloud) -> Pipeline:
    return Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=60), db=db,
                    provider_for=lambda b: MemoryProvider(b, cloud),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def test_a_termination_protected_orphan_is_remembered_and_re_read_never_terminated(db: Database) -> None:
    # given an orphan whose termination protection no listing shows (AWS disableApiTermination)
    add_backend(db)
    cloud = MemoryCloud()
    _ref, _owner, vm = Platform(db, cloud).terminated_leak()
    cloud.resources[vm].termination_protected = True
    pipeline = _pipeline(db, cloud)

    # when a delete cycle tries to delete it
    [request] = _cycle(pipeline)
    status = pipeline.handle_delete(request)

    # then the cloud refuses, the group is protected, and the cycle is not failed by it
    assert status == "protected" and cloud.exists(vm) and cloud.calls["terminate"] == 0
    with db.connection() as conn:
        outcome, = conn.run("SELECT outcome FROM cycles WHERE id = :c", c=request.cycle_id)[0]
        state, reason = conn.run("SELECT state, reason FROM orphans WHERE primary_id = :p", p=vm)[0]
    assert outcome == "clean" and (state, reason) == ("protected", "termination_protection")

    # and a report cycle classifies it protected up front, from what the delete recorded
    assert _cycle(pipeline, mode="report") == []
    with db.connection() as conn:
        [verdict] = conn.run("SELECT g.verdict, g.reason FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id"
                             " WHERE c.mode = 'report' AND g.primary_id = :p", p=vm)
    assert verdict == ["protected", "termination_protection"]

    # and the next delete cycle re-reads the remembered protection (read-only): still
    # protected, no terminate, the orphan still recorded protected
    [again] = _cycle(pipeline)
    assert pipeline.handle_delete(again) == "protected"
    assert cloud.calls["describe_attribute"] == 2 and cloud.calls["terminate"] == 0 and cloud.exists(vm)
    with db.connection() as conn:
        state, reason = conn.run("SELECT state, reason FROM orphans WHERE primary_id = :p", p=vm)[0]
    assert (state, reason) == ("protected", "termination_protection")

    # and a delete cycle whose re-read fails leaves it remembered: a report cycle still says protected
    [failing] = _cycle(pipeline)
    cloud.failing_regions.add(failing.group.region)
    assert pipeline.handle_delete(failing) == "failed"
    cloud.failing_regions.clear()
    _cycle(pipeline, mode="report")
    with db.connection() as conn:
        state, reason = conn.run("SELECT state, reason FROM orphans WHERE primary_id = :p", p=vm)[0]
        [latest] = conn.run("SELECT g.verdict FROM cycle_groups g JOIN cycles c ON c.id = g.cycle_id"
                            " WHERE c.mode = 'report' AND g.primary_id = :p ORDER BY c.started_at DESC LIMIT 1", p=vm)
    assert (state, reason, latest) == ("protected", "termination_protection", ["protected"])

    # and once the protection is lifted, the next delete cycle deletes it
    cloud.resources[vm].termination_protected = False
    [lifted] = _cycle(pipeline)
    pipeline.handle_delete(lifted)
    assert cloud.calls["terminate"] == 1


def test_a_controller_managed_instance_is_never_terminated(db: Database) -> None:
    # given an orphan-looking instance that an Auto Scaling group manages
    add_backend(db)
    cloud = MemoryCloud()
    _ref, _owner, vm = Platform(db, cloud).terminated_leak()
    cloud.resources[vm].controller = "asg:workers"
    pipeline = _pipeline(db, cloud)

    # when a delete cycle runs, and a delete of its group is attempted anyway
    requests = _cycle(pipeline)
    with pipeline.store.session() as session:
        provider = MemoryProvider(session.backend("mem"), cloud)
    [group] = [g for listing in provider.iter_listing() for g in listing.groups]
    result = provider.delete_resource_group(group)

    # then nothing is dispatched (protected by the listing), and the provider refuses too
    assert requests == []
    assert result.status is DeleteStatus.PROTECTED and result.protection == "managed_by_controller"
    assert cloud.exists(vm) and cloud.calls["terminate"] == 0
