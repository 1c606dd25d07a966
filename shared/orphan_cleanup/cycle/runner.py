"""One full cycle of one backend in this process (``orphan-cleanup run``):
the same steps as the deployed functions, through in-process queues.

- **The lease** is the cycle's deadline (the CLI makes it short:
  ``ORPHAN_CLEANUP_LEASE_SECONDS``). A heartbeat renews it every third of it
  while the run goes on, so a killed run frees its backend within one lease.
  Renewal is fenced: once another run has expired the lease, nothing of this
  cycle applies any more and the heartbeat stops.
- **Plan, then confirm.** With a ``confirm`` callback, a delete cycle stops
  once its listing is classified: the delete requests it registered (the
  delete queue's content) are the plan, and nothing is deleted unless
  ``confirm`` accepts it. Declined (or Ctrl-C at the question), every planned
  group is recorded as left in place (``delete_declined``): the cycle ends
  unsettled, ``clean_at`` stays, the orphans stay open for the next cycle.
  Accepted, exactly the planned groups go to the deleter, which re-reads and
  re-classifies each one before acting.
- **Ctrl-C.** The listing runs in a worker thread, so the caller stops waiting
  at once; the cycle is failed (``interrupted``), which fences whatever is
  still in flight, and ``RunInterrupted`` says what was left undone.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import TypeAdapter

from orphan_cleanup.core import delete_rules
from orphan_cleanup.core.backends import Mode
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.errors import ConfigError, DatabaseError, LeaseLost, OrphanCleanupError
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.results import ListerResult
from orphan_cleanup.core.verdicts import DeleteOutcome
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.deleter import GateBusy
from orphan_cleanup.cycle.heartbeat import Heartbeat
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.plan import Plan, build_plan, group_label, marked_line
from orphan_cleanup.cycle.python_gc import paused_gc
from orphan_cleanup.ledger.records import CycleReport
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.providers.base import describe_error
from orphan_cleanup.queues.memory import InProcessQueue

log = logging.getLogger("orphan_cleanup")
Progress = Callable[[str], None]
T = TypeVar("T")
_batch = TypeAdapter(ListingBatch)
_delete = TypeAdapter(DeleteRequest)
Confirm = Callable[[Plan], bool]
DECLINED = "delete_declined"


def _quiet(_message: str) -> None:
    pass


class BackendOff(ConfigError):
    """``off`` is final: no ``--mode`` runs a backend whose mode is off (exit 2)."""


class CycleNotStarted(OrphanCleanupError):
    """A manual run could not start a cycle (another cycle holds the lease)."""

    REASONS = {"busy": "another cycle of this backend is running (its lease has not expired)",
               "backend_changed": "the backend's row changed while the cycle started: run it again"}

    def __init__(self, backend_id: str, reason: str) -> None:
        super().__init__(f"no cycle started for {backend_id}: {self.REASONS.get(reason, reason)}")
        self.reason = reason


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a manual run; the message says what became of the cycle."""


def run_cycle(pipeline: Pipeline, backend_id: str, *, mode: Mode | None = None, progress: Progress = _quiet,
              confirm: Confirm | None = None, groups: bool = True) -> CycleReport:
    """Run lister, classifier and deleter to completion; return the C3 report
    (without ``groups``: its header only; ``LedgerStore.report_groups`` streams them).
    The pipeline's queues must be in-process ones: this process drains them.
    ``confirm``: asked before a delete cycle deletes anything (module docstring).
    Raises ``BackendOff``, ``CycleNotStarted`` (busy) and ``RunInterrupted``."""
    in_process_queues(pipeline)
    progress(f"listing {backend_id} ...")
    # ``run_lister`` in its two halves, so that the heartbeat holds the lease from the start.
    start = pipeline.start_cycle(backend_id, mode=mode, manual=True)
    if isinstance(start, ListerResult):
        if start.reason == "off":
            raise BackendOff(f"backend {backend_id} is off (its mode, or the global one, is off): nothing runs")
        raise CycleNotStarted(backend_id, start.reason)
    limits = start.limits
    run = _Run(pipeline, start.cycle.id, limits, progress)
    with Heartbeat(pipeline.store, run.cycle_id, limits.cycle_deadline_seconds, start.backend.scope,
                   delete_rules.gate_ttl(limits)) as heartbeat:
        run.heartbeat = heartbeat
        try:
            run.listing(lambda: pipeline.list_cycles([start]))
            requests = _take_all(in_process_queues(pipeline)[1])
            if confirm is not None and start.cycle.mode == "delete":
                requests = run.confirmed(requests, confirm)
            elif start.cycle.mode == "delete":
                run.say_marked()
            run.delete(requests)
            drain(pipeline, progress)  # nothing is left in a healthy run; a redelivery would be
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            raise run.interrupted() from None
        except Exception as exc:  # the run cannot go on: its cycle fails now rather than at its lease's end
            run.fail(f"run failed: {describe_error(exc)}")
            raise
    return pipeline.store.cycle_report(run.cycle_id, groups=groups)


class _Run:
    """The steps of one manual cycle after its lease was taken, and what they did."""

    def __init__(self, pipeline: Pipeline, cycle_id: str, limits: Limits, progress: Progress) -> None:
        self.pipeline, self.cycle_id, self.limits, self.progress = pipeline, cycle_id, limits, progress
        self.heartbeat: Heartbeat | None = None
        self.planned: int | None = None  # delete requests handed to the deleter (None: none yet)
        self.done = 0

    @property
    def store(self) -> LedgerStore:
        return self.pipeline.store

    def listing(self, listing: Callable[[], Any]) -> None:
        """The listing, its batches classified as they stream, in a worker thread."""
        lq = self.pipeline.listing_queue
        assert isinstance(lq, InProcessQueue)
        counts = [0, 0]  # batches, groups

        def classify_now(body: str) -> None:
            with paused_gc():
                batch = _batch.validate_json(body)
                self.pipeline.handle_batch(batch)
            counts[0] += 1
            counts[1] += len(batch.groups)
            self.progress(f"classified batch {counts[0]} ({counts[1]} groups so far)")

        def listed() -> Any:
            lq.consumer = classify_now
            try:
                return listing()
            finally:
                lq.consumer = None

        _in_worker(listed, name=f"listing-{self.cycle_id[:8]}", cleanup=self.pipeline.db.close)

    def confirmed(self, requests: list[DeleteRequest], confirm: Confirm) -> list[DeleteRequest]:
        """The requests to delete: all of them when ``confirm`` accepts the plan, else none."""
        if not requests:
            blocked = self.store.cycle_report(self.cycle_id).blocked_reason
            if blocked:
                self.progress(f"blast-radius cap: deleted nothing ({blocked}): nothing to confirm")
            if not self.say_marked() and not blocked:
                self.progress("no orphan to delete: nothing to confirm")
            return []
        plan = build_plan(self.store, self.cycle_id, requests)
        try:
            accepted = confirm(plan)
        except KeyboardInterrupt:
            self.decline(requests)
            raise RunInterrupted(f"interrupted at the confirmation: nothing deleted; cycle {self.cycle_id}"
                                 f" ended unsettled ({DECLINED})") from None
        if not accepted:
            self.decline(requests)
            self.progress(f"nothing deleted: the plan was not confirmed; cycle {self.cycle_id} ends unsettled"
                          f" ({DECLINED}), its orphans stay open for the next cycle")
            return []
        return requests

    def say_marked(self) -> bool:
        """Say what the cycle marked and when the first goes (SAFETY.md rule 23); False: nothing."""
        marked = self.store.marked_groups(self.cycle_id)
        if marked:
            self.progress(marked_line(len(marked), min(m[2] for m in marked)))
        return bool(marked)

    def decline(self, requests: Iterable[DeleteRequest]) -> None:
        """Record each planned group as left in place; the last one ends the cycle (unsettled)."""
        for request in requests:
            try:
                decision = cycle_state.delete_allowed(self.store, self.cycle_id, request.group)
            except LeaseLost:  # fenced: the cycle is not ours any more
                return
            if decision.refusal is None and decision.group is not None:
                cycle_state.record_delete(self.store, self.cycle_id, decision.group, self.limits,
                                          skipped_reason=DECLINED)

    def delete(self, requests: list[DeleteRequest]) -> None:
        self.planned = len(requests)
        for _ in delete_all(self.pipeline, requests, self.progress, self.heartbeat):
            self.done += 1

    def fail(self, error: str) -> bool:
        """Fail the cycle now (fenced); False when it had ended or was not ours any more."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        try:
            return cycle_state.fail_cycle(self.store, self.cycle_id, error, self.limits) is not None
        except DatabaseError as exc:
            log.warning("could not fail cycle %s (%s): its lease expires on its own", self.cycle_id, exc)
            return False

    def interrupted(self) -> RunInterrupted:
        failed = self.fail("interrupted")
        what = f"cycle {self.cycle_id} " + ("failed" if failed else "was not failed (it had ended, or the"
                                                                    " database did not answer)")
        undone = ("nothing deleted" if not self.planned
                  else f"{self.planned - self.done} of {self.planned} planned deletes not done"
                  + (" (one sent to the provider may still complete)" if self.done < self.planned else ""))
        return RunInterrupted(f"interrupted: {what}; {undone}")


def _in_worker(fn: Callable[[], T], *, name: str, cleanup: Callable[[], None]) -> T:
    """``fn()`` in a daemon thread while this thread only waits: Ctrl-C (delivered to
    the main thread) stops the wait at once; calls in flight finish behind it, fenced."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: B036 - handed to the waiting thread, raised there
            box["error"] = exc
        finally:
            cleanup()

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.2)
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def in_process_queues(pipeline: Pipeline) -> tuple[InProcessQueue, InProcessQueue]:
    lq, dq = pipeline.listing_queue, pipeline.delete_queue
    if not isinstance(lq, InProcessQueue) or not isinstance(dq, InProcessQueue):
        raise TypeError("a manual run drains in-process queues: build the pipeline with InProcessQueue")
    return lq, dq


def _take_all(queue: InProcessQueue) -> list[DeleteRequest]:
    requests = []
    while (body := queue.pop()) is not None:
        requests.append(_delete.validate_json(body))
    return requests


def drain(pipeline: Pipeline, progress: Progress = _quiet) -> None:
    """Classify every queued batch and handle every queued delete request, until both queues are empty."""
    lq, dq = in_process_queues(pipeline)
    n_batches = 0
    while len(lq) or len(dq):
        while (body := lq.pop()) is not None:
            with paused_gc():
                pipeline.handle_batch(_batch.validate_json(body))
            n_batches += 1
            progress(f"classified batch {n_batches}")
        for _ in delete_all(pipeline, _take_all(dq), progress):
            pass


_SAID = {DeleteOutcome.DELETED: ("deleted", ""),
         DeleteOutcome.DELETING: ("deleting", " (the owner is shutting down; its dependents go next cycle)"),
         DeleteOutcome.SKIPPED: ("skipped", ": it changed since the listing (owner or resources), left in place"),
         DeleteOutcome.FAILED: ("failed to delete", "")}


def delete_all(pipeline: Pipeline, requests: list[DeleteRequest], progress: Progress = _quiet,
               heartbeat: Heartbeat | None = None, gate_wait_seconds: float = 60.0) -> Iterable[DeleteOutcome]:
    """Handle each request (yielding its outcome) and say so per group. A request whose
    ref's gate another deleter holds waits behind the others, at most ``gate_wait_seconds``
    without progress (then ``GateBusy``)."""
    pending, total, n = deque(requests), len(requests), 0
    busy_since: float | None = None
    busy_streak = 0
    while pending:
        request = pending.popleft()
        holder = f"{request.cycle_id}:{request.group.key}:{uuid.uuid4().hex[:12]}"
        if heartbeat is not None:
            heartbeat.hold(request.group.provider_ref, holder)
        try:
            outcome = pipeline.handle_delete(request, holder=holder)
        except GateBusy:
            busy_since = busy_since or time.monotonic()
            if time.monotonic() - busy_since > gate_wait_seconds:
                raise
            if busy_streak == 0:
                progress(f"waiting for the delete gate of ref {request.group.provider_ref} (another deleter holds it)")
            busy_streak += 1
            pending.append(request)
            if busy_streak >= len(pending):  # every request left is waiting for a gate
                time.sleep(0.2)
            continue
        finally:
            if heartbeat is not None:
                heartbeat.gate = None
        busy_since, busy_streak, n = None, 0, n + 1
        verb, note = _SAID.get(outcome, ("did not delete", f" ({outcome.value})"))
        progress(f"{verb} group {n}/{total}: {group_label(request.group)}{note}")
        yield outcome
