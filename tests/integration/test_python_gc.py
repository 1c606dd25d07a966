"""The cyclic collector is paused over a batch's decode and classification
(orphan_cleanup.cycle.python_gc, issue #17 item 4), and resumed afterwards, also when the
block raises or when several threads pause at once."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.python_gc import paused_gc
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend


def _in_handle_batch(frame: FrameType | None) -> bool:
    while frame is not None:
        if (frame.f_code.co_name == "handle_batch"
                and frame.f_code.co_filename.endswith("orphan_cleanup/cycle/pipeline.py")):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations of the collections that start inside ``Pipeline.handle_batch`` (its
    own frame on the stack: the one the resumed collector runs right after the pause is
    not), with a small threshold (100 allocations) so that allocation-heavy code triggers some."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and _in_handle_batch(sys._getframe()):
            seen.append(info["generation"])

    threshold = gc.get_threshold()
    gc.enable()
    gc.set_threshold(100, 10, 10)
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*threshold)
        gc.enable()


def test_a_batch_is_classified_without_a_cyclic_collection_and_the_collector_resumes(db, collections):
    # Given: a listing of 150 tracked and leaked groups on a real ledger, its batches queued
    cloud = MemoryCloud()
    add_backend(db)
    platform = Platform(db, cloud)
    for _ in range(75):
        platform.tracked()
        platform.terminated_leak()
    pipeline = Pipeline(settings=Settings(), db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    pipeline.run_lister("mem", mode="report", manual=True)
    [body] = pipeline.listing_queue.items
    batch = ListingBatch.model_validate_json(body)
    collections.clear()

    # When: the classifier handles it
    result = pipeline.handle_batch(batch)

    # Then: it was applied with no automatic collection inside, and the collector is on again
    assert result.status == "applied" and sum(result.verdicts.values()) == 150
    assert collections == []
    assert gc.isenabled()


def test_the_collector_resumes_when_the_block_raises():
    with pytest.raises(ValueError), paused_gc():
        assert not gc.isenabled()
        raise ValueError("a refused message")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pauses_of_several_threads_end_with_the_last_one():
    # Given: one thread inside a pause, waiting
    inside, release = threading.Event(), threading.Event()

    def worker() -> None:
        with paused_gc():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert inside.wait(10)
        # When: this thread's own pause ends first
        with paused_gc():
            pass
        # Then: the collector stays off until the worker's pause ends too
        assert not gc.isenabled()
    finally:
        release.set()
        t.join(10)
    assert gc.isenabled()
