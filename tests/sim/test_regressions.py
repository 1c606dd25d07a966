"""Regression tests for the library bugs the simulation found (tests/sim/README.md).

Each is the smallest reproduction of a failing seed, on the real pipeline and
Postgres, with the in-memory cloud behind the provider port.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.deleter import GateBusy
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import Deletion, MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend


def _pipeline(db: Database, provider_for) -> Pipeline:  # type: ignore[no-untyped-def]
    return Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=60), db=db, provider_for=provider_for,
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue())


def _classify_all(pipeline: Pipeline) -> list[DeleteRequest]:
    pipeline.run_lister("mem", mode="delete", manual=True)
    while (body := pipeline.listing_queue.pop()) is not None:
        pipeline.handle_batch(ListingBatch.model_validate_json(body))
    return [DeleteRequest.model_validate_json(b) for b in pipeline.delete_queue.items]


def test_a_redelivered_delete_waits_for_the_running_one(db: Database) -> None:
    """Seeds 4, 28, 32, 33 (G1): SQS redelivers a delete request while the first
    delivery is still in its provider call (visibility timeout). Both deliveries
    used the same gate holder (``cycle:group``), so the gate let the second one in
    and two deletes of one ref ran at once (SAFETY.md rule 4)."""
    add_backend(db)
    cloud = MemoryCloud()
    platform = Platform(db, cloud)
    platform.terminated_leak()
    seen: list[str] = []

    class SlowProvider(MemoryProvider):
        @contextmanager
        def deleting(self, group: ResourceGroup) -> Iterator[Deletion]:
            if not seen:  # the message becomes visible again and another deleter takes it
                seen.append("nested")
                with pytest.raises(GateBusy):
                    pipeline.handle_delete(request)
            with super().deleting(group) as call:
                yield call

    pipeline = _pipeline(db, lambda b: SlowProvider(b, cloud))
    [request] = _classify_all(pipeline)

    assert pipeline.handle_delete(request) == "deleted"
    assert seen == ["nested"]
    assert pipeline.handle_delete(request) in ("fenced", "already_done")  # a later redelivery is a no-op


@pytest.mark.parametrize("moved_on", [OwnerStatus.TERMINATING, OwnerStatus.PENDING])
def test_an_owner_that_moved_on_after_classification_keeps_its_resources(db: Database,
                                                                         moved_on: OwnerStatus) -> None:
    """Seed 88 (S1): a leaked earlier attempt of a live owner (seed 002's race) is
    classified an orphan (``primary_mismatch``); before the delete request runs, the
    owner becomes terminating (or pending again). The deleter re-read the resource
    but not the ledger, and deleted a resource of a terminating owner (SAFETY.md
    rule 1, STEP 4: pending and terminating owners are skipped)."""
    add_backend(db)
    cloud = MemoryCloud()
    platform = Platform(db, cloud)
    ref, owner, tracked = platform.tracked()
    long_ago = datetime.now(UTC) - timedelta(hours=3)
    leaked, _ = platform.create_vm(ref, created_at=long_ago)  # created before the owner's provisioning
    pipeline = _pipeline(db, lambda b: MemoryProvider(b, cloud))
    [request] = _classify_all(pipeline)
    assert request.group.primary_id == leaked

    platform.ledger.set_status(owner, moved_on)
    status = pipeline.handle_delete(request)

    assert status == "skipped"
    assert cloud.exists(leaked) and cloud.exists(tracked)
    with db.connection() as conn:
        outcome, = conn.run("SELECT outcome FROM cycles WHERE id = :c", c=request.cycle_id)[0]
        reason, = conn.run("SELECT result->>'skipped' FROM delete_requests WHERE cycle_id = :c",
                           c=request.cycle_id)[0]
    assert outcome == "unsettled" and reason.startswith("owner_changed:")


def test_an_orphan_that_is_still_an_orphan_is_deleted(db: Database) -> None:
    """The re-check under the gate keeps the normal path: nothing changed, it deletes."""
    add_backend(db)
    cloud = MemoryCloud()
    platform = Platform(db, cloud)
    ref, owner, tracked = platform.tracked()
    leaked, _ = platform.create_vm(ref, created_at=datetime.now(UTC) - timedelta(hours=3))
    pipeline = _pipeline(db, lambda b: MemoryProvider(b, cloud))
    [request] = _classify_all(pipeline)

    assert pipeline.handle_delete(request) == "deleted"
    assert not cloud.exists(leaked) and cloud.exists(tracked)


#: A ``backends.settings`` value that is a JSON string whose text is no JSON (a platform
#: that stored a word, or half an object): jsonb holds it, pg8000 hands it back as ``str``.
NOT_JSON_TEXT = '"oops"'


@pytest.mark.parametrize("run", ["tick", "lister"])
def test_a_row_whose_settings_are_a_string_fails_only_its_own_backend(db: Database, run: str) -> None:
    """Simulation, world ``settings`` (X2, seeds 15, 31, 51, 53 of 60): a platform bug writes
    a settings value that is no JSON object into one backend's row. SAFETY.md rule 16 reads
    such a row leniently (the default keys), and ``backend_from_row`` promises that only
    that backend's work fails; a JSON string whose text is no JSON instead crashes the tick
    for every backend of the stack, and every lister and deleter of its account."""
    add_backend(db)
    add_backend(db, "mem-b", settings=NOT_JSON_TEXT)
    cloud = MemoryCloud()
    Platform(db, cloud).terminated_leak()
    pipeline = Pipeline(settings=Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=60), db=db,
                        provider_for=lambda b: MemoryProvider(b, cloud), listing_queue=InProcessQueue(),
                        delete_queue=InProcessQueue(), jobs_queue=InProcessQueue())

    # when the schedule ticks, or the healthy backend's lister runs
    if run == "tick":
        result = pipeline.run_tick()
        started = result.jobs
    else:
        started = pipeline.run_lister("mem", manual=True).cycle_id

    # then the healthy backend's work goes on
    assert started
