"""The lister step: the tick selects the due backends and
queues listing jobs; a job, or a direct run, takes each backend's lease (STEP 1) and
lists once per group of backends sharing a listing (STEP 2), each cycle getting its
own batches."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orphan_cleanup.core import listing_rules, policy
from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY, Backend, Mode
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.errors import (
    ConfigError,
    DatabaseError,
    OrphanCleanupError,
    ProviderError,
    ProviderThrottled,
)
from orphan_cleanup.core.listing import RegionFailure, RegionListing, ResourceGroup
from orphan_cleanup.core.messages import MAX_JOB_BACKENDS, ListingBatch, ListingJob
from orphan_cleanup.core.results import JobResult, ListerResult, TickResult
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.deleter import identity_failure
from orphan_cleanup.cycle.step_context import StepContext
from orphan_cleanup.ledger.records import CycleRef, IdleSnapshot
from orphan_cleanup.providers.base import describe_error
from orphan_cleanup.queues.base import Queue


@dataclass(frozen=True)
class StartedCycle:
    """A backend whose cycle started (STEP 1 passed, the lease taken)."""

    backend: Backend
    cycle: CycleRef
    limits: Limits
    reason: str
    manual: bool
    # Per region: (groups of the last clean listing, of the suspect one since), read with the lease.
    baselines: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    def result(self, reason: str, **kw: Any) -> ListerResult:
        return ListerResult(backend=self.backend.id, started=True, cycle_id=self.cycle.id, reason=reason, **kw)


class _Batcher:
    """Cuts one cycle's listing into ``ListingBatch`` messages below the queue's size
    limit, region by region; the last batch carries the count and the region failures.

    The groups of one ref in one region go into one batch, so a live owner's other VM is
    judged beside its recorded primary (SAFETY.md rule 17; a run of one ref larger than a
    batch is cut, and what cannot be judged is skipped, never an orphan). A group too
    large for a message is reduced to what classification and deletion read; one still
    too large fails alone, a failure of its region (rule 20)."""

    def __init__(self, started: StartedCycle, listed_at: datetime, limit: int,
                 baselines: dict[str, tuple[int | None, int | None]], settings: Settings) -> None:
        self.started, self.listed_at, self.limit = started, listed_at, limit
        self.baselines, self.settings = baselines, settings
        self.counts: dict[str, int] = {}  # believed regions: their group counts
        self.suspects: dict[str, int] = {}  # anomalous regions: what they listed
        self.failures: list[RegionFailure] = []
        self.pending: list[ResourceGroup] = []
        self.size = 0
        self.count = 0
        self.regions_listed = 0
        self.regions_throttled = 0

    def _batch(self, last: bool) -> ListingBatch:
        cycle, seq = self.started.cycle, self.count
        batch = ListingBatch(cycle_id=cycle.id, backend=self.started.backend.id, seq=seq, listed_at=self.listed_at,
                             mode=cycle.mode, record_all=self.started.manual, groups=tuple(self.pending), last=last,
                             batch_count=seq + 1 if last else None, failures=tuple(self.failures) if last else ())
        self.count += 1
        self.pending, self.size = [], 0
        return batch

    def add(self, region: RegionListing) -> Iterator[ListingBatch]:
        if region.failure is not None:
            self.failures.append(RegionFailure(region=region.region, error=region.failure))
            self.regions_throttled += region.throttled
            return
        clean, suspect = self.baselines.get(region.region, (None, None))
        anomaly = listing_rules.region_anomaly(len(region.groups), clean, suspect,
                                               max_shrink=self.settings.region_shrink_share,
                                               min_groups=self.settings.region_shrink_min_groups)
        if anomaly is not None:
            self.failures.append(RegionFailure(region=region.region, error=anomaly))
            self.suspects[region.region] = len(region.groups)
            return
        self.regions_listed += 1
        self.counts[region.region] = len(region.groups)
        for _, run in itertools.groupby(sorted(region.groups, key=_ref_of), key=_ref_of):
            sized = [self._sized(group) for group in run]
            if self.pending and self.size + sum(n for _, n in sized) > self.limit:
                yield self._batch(last=False)
            for group, gsize in sized:
                if gsize > self.limit:
                    self.failures.append(RegionFailure(region=region.region, error=(
                        f"group {group.key[:200]} of {len(group.resources)} resources is too large for one"
                        f" message ({gsize} bytes, even reduced to its ids and keys): not classified")))
                    continue
                if self.pending and self.size + gsize > self.limit:
                    yield self._batch(last=False)
                self.pending.append(group)
                self.size += gsize

    def _sized(self, group: ResourceGroup) -> tuple[ResourceGroup, int]:
        gsize = len(group.model_dump_json()) + 1
        if gsize <= self.limit:
            return group, gsize
        s = self.started.backend.settings
        keep = {s.tag_key, SNAPSHOT_SOURCE_KEY, *self.started.backend.protect_keys, *s.controller_tag_keys}
        small = listing_rules.reduced(group, keep)
        return small, len(small.model_dump_json()) + 1

    def add_failure(self, region: RegionListing) -> None:
        for _ in self.add(region):  # a failure yields no batch
            pass

    def close(self) -> ListingBatch:
        return self._batch(last=True)


def _ref_of(group: ResourceGroup) -> str:
    return group.provider_ref


@dataclass
class Lister:
    ctx: StepContext
    listing_queue: Queue
    # The tick's listing jobs (the deployed functions); None where there is no tick.
    jobs_queue: Queue | None = None
    # False (the deployed functions): a backend whose row holds a key is not listed.
    ledger_keys: bool = True
    # The backends the last tick validated, by their row's JSON (``LedgerSession.tick_rows``):
    # a warm function does not validate 10,000 unchanged rows again every minute.
    _tick_backends: dict[bytes, Backend] | None = field(default=None, init=False, repr=False)

    # ---- the tick: due selection for every backend ----------------------------------

    def run_tick(self) -> TickResult:
        """Select every due backend in one statement and queue one listing job per
        group of due backends that share a listing (``Backend.listing_key``). Idle
        backends are marked processed in one more statement. Needs ``jobs_queue``."""
        if self.jobs_queue is None:
            raise ConfigError("the tick needs a jobs queue (JOBS_QUEUE_URL on AWS, JOBS_TOPIC on GCP)")
        if self._tick_backends is None:
            self._tick_backends = {}
        with self.ctx.store.session() as session:
            # An injected clock is not the statement's: then every row comes with its facts.
            rows = session.tick_rows(self._tick_backends, horizon=self.ctx.clock is None)
            due: dict[str, str] = {}
            skipped: dict[str, str] = {}
            shared: dict[str, list[str]] = {}
            idle: list[tuple[str, IdleSnapshot, str, datetime]] = []
            stalest: tuple[int, str] | None = None  # StalestBackendSeconds: enabled, enrolled backends
            for row in rows:
                backend, seen = row.backend, row.snapshot
                mode = policy.effective_mode(self.ctx.settings, backend)
                if mode != "off" and row.stale_seconds is not None:
                    stalest = max(stalest or (row.stale_seconds, backend.id), (row.stale_seconds, backend.id))
                if mode == "off" or seen is None:
                    skipped[backend.id] = "off" if mode == "off" else "not_due" if row.due_later else "not_enrolled"
                    continue
                now = self.ctx.now() or seen.now
                limits = self.ctx.limits(backend)
                if seen.leased:
                    go = row.lease_expires_at is None or row.lease_expires_at <= now
                    reason = "lease_expired" if go else "busy"
                else:
                    go, reason = cycle_state.scheduled_step1(seen, mode, limits, now)
                    if not go and reason != "not_due":
                        idle.append((backend.id, seen, mode, now + timedelta(seconds=limits.interval_seconds)))
                if not go:
                    skipped[backend.id] = reason
                    continue
                due[backend.id] = reason
                shared.setdefault(backend.listing_key, []).append(backend.id)
            if idle:
                session.mark_idle_many(idle, self.ctx.now() or idle[0][1].now)
        jobs = [ids[i:i + MAX_JOB_BACKENDS] for ids in shared.values() for i in range(0, len(ids), MAX_JOB_BACKENDS)]
        for ids in jobs:
            self.jobs_queue.publish(ListingJob(backends=tuple(ids)))
        return TickResult(jobs=jobs, due=due, skipped=skipped, stalest_backend=stalest[1] if stalest else None,
                          stalest_backend_seconds=stalest[0] if stalest else None)

    def run_job(self, job: ListingJob) -> JobResult:
        """A listing job: STEP 1 and the lease of every backend it names, in one transaction
        whose statements do not grow with their number (``cycle_state.start_cycles``; the tick
        has just read their idle facts, so no lock-free read comes first), then one listing
        per group of started backends whose rows share a listing key (the job's grouping is
        only a hint), feeding every cycle of the group."""
        results: list[ListerResult] = []
        started: dict[str, list[StartedCycle]] = {}
        outcomes = cycle_state.start_cycles(self.ctx.store, job.backends, manual=False, plan=self._plan(None),
                                            stack_protect_key=self.ctx.settings.protect_tag_key, now=self.ctx.now())
        for backend_id, outcome in outcomes.items():
            if outcome.reason == "unknown_backend":  # e.g. the backend row was removed since the tick
                self.ctx.reporter.error("listing job: backend not started", backend=backend_id, error=outcome.error)
            start = self._started(backend_id, outcome, manual=False)
            if isinstance(start, ListerResult):
                results.append(start)
            else:
                started.setdefault(start.backend.listing_key, []).append(start)
        for group in started.values():
            results += self.list_cycles(group)
        return JobResult(listings=len(started), results=results)

    # ---- lister: STEP 1-2 -------------------------------------------------

    def run_lister(self, backend_id: str, *, mode: Mode | None = None, manual: bool = False) -> ListerResult:
        """STEP 1, lease, list and publish batches. Returns a summary.
        An idle scheduled run costs two statements on one connection."""
        start = self.start_cycle(backend_id, mode=mode, manual=manual)
        return start if isinstance(start, ListerResult) else self.list_cycles([start])[0]

    def start_cycle(self, backend_id: str, *, mode: Mode | None, manual: bool) -> StartedCycle | ListerResult:
        """STEP 1 and the lease of one backend: its started cycle, or why it did not start.
        ``run_lister`` is this and ``list_cycles``; the manual runner calls them apart to
        keep the lease alive (a heartbeat) from the moment it is taken. A scheduled run
        reads its facts without a lock first: an idle backend is marked processed there."""
        with self.ctx.store.session() as session:
            backend, seen = session.backend_and_idle(backend_id)
            planned = self._plan(mode)(backend)
            if isinstance(planned, cycle_state.StartRefusal):
                return ListerResult(backend=backend_id, started=False, reason=planned.reason, error=planned.error)
            effective, limits = planned
            skip = None if manual else cycle_state.quick_skip(session, backend_id, seen, effective, limits,
                                                               self.ctx.now())
        if skip is not None:
            return ListerResult(backend=backend_id, started=False, reason=skip)
        started = cycle_state.start_cycle(self.ctx.store, backend_id, effective, limits, manual=manual,
                                          stack_protect_key=self.ctx.settings.protect_tag_key,
                                          now=self.ctx.now(),
                                          mode_of=lambda row: policy.effective_mode(self.ctx.settings, row, mode))
        return self._started(backend_id, started, manual)

    def _plan(self, mode: Mode | None) -> cycle_state.Plan:
        """What a backend's row allows: the refusals of the stack's settings (the reporter
        says why), its effective mode (never looser than the row's: ``policy``) and limits."""
        def plan(backend: Backend) -> tuple[Mode, Limits] | cycle_state.StartRefusal:
            refusals = {"stack_protect_key": policy.stack_key_refusal(self.ctx.settings, backend),
                        "ledger_key": None if self.ledger_keys else policy.ledger_key_refusal(backend)}
            for reason, refused in refusals.items():
                if refused is not None:
                    self.ctx.reporter.error(refused, backend=backend.id)
                    return cycle_state.StartRefusal(reason, refused)
            effective = policy.effective_mode(self.ctx.settings, backend, mode)
            if effective == "off":
                return cycle_state.StartRefusal("off")
            return effective, self.ctx.limits(backend)
        return plan

    def _started(self, backend_id: str, started: cycle_state.StartResult, manual: bool) -> StartedCycle | ListerResult:
        if started.cycle is None or started.backend is None:
            return ListerResult(backend=backend_id, started=False, reason=started.reason, error=started.error)
        # From here on the cycle works on its snapshot of the backend (SAFETY.md rule 18).
        return StartedCycle(backend=started.backend, cycle=started.cycle, limits=self.ctx.limits(started.backend),
                            reason=started.reason, manual=manual, baselines=started.baselines or {})

    def _close(self, closing: list[tuple[StartedCycle, _Batcher]]) -> dict[str, ListerResult]:
        """End the cycles' listing: remember anomalous regions, fail a cycle that listed no
        region, else record the believed region counts of all the others (one statement)
        and publish each one's last batch.

        A cycle whose every region was throttled past its retry budget is not failed:
        the regions are unavailable for this cycle, so it ends unsettled (SAFETY.md
        rule 5: throttling never fails a cycle; no failed-cycle backoff for a busy account)."""
        results: dict[str, ListerResult] = {}
        counts: dict[str, dict[str, int]] = {}
        for s, batcher in closing:
            if batcher.suspects:
                with self.ctx.store.session() as session:
                    session.mark_suspect(s.cycle.id, s.backend.id, batcher.suspects)
            all_throttled = bool(batcher.failures) and batcher.regions_throttled == len(batcher.failures)
            if not batcher.regions_listed and not all_throttled:  # nothing listed: never clean, never unsettled
                error = "no region could be listed" if batcher.failures else "no region to list"
                self.ctx.reporter.error("listing failed", backend=s.backend.id, cycle_id=s.cycle.id, error=error)
                cycle_state.fail_cycle(self.ctx.store, s.cycle.id, error, s.limits, self.ctx.now(),
                                       failures=batcher.failures)
                results[s.cycle.id] = s.result("listing_failed")
            else:
                counts[s.cycle.id] = batcher.counts
        recorded = cycle_state.record_region_groups(
            self.ctx.store, counts, {s.cycle.id: s.backend.id for s, _ in closing}) if counts else set()
        for s, batcher in closing:
            if s.cycle.id not in counts:
                continue
            if s.cycle.id not in recorded:
                results[s.cycle.id] = s.result("lease_lost")
                continue
            self.listing_queue.publish(batcher.close())
            results[s.cycle.id] = s.result(s.reason, batches=batcher.count, mode=s.cycle.mode)
        return results

    def list_cycles(self, group: list[StartedCycle]) -> list[ListerResult]:
        """One listing (identity check, then every region) feeding the cycles of
        ``group``, backends with one listing key. Each cycle keeps its own batches,
        failures and outcome. Returns one result per backend, in order."""
        results: dict[str, ListerResult] = {}
        # Fenced, right before the first provider call: a cycle that lost its lease since it was
        # taken lists nothing (SAFETY.md rule 6).
        stamped = cycle_state.stamp_listed_at(self.ctx.store, {s.cycle.id: s.backend.id for s in group},
                                              self.ctx.now())
        live: list[tuple[StartedCycle, _Batcher]] = []
        for s in group:
            if s.cycle.id not in stamped:
                results[s.cycle.id] = s.result("lease_lost")
                continue
            live.append((s, _Batcher(s, stamped[s.cycle.id], self.listing_queue.max_message_bytes - 4096,
                                     s.baselines, self.ctx.settings)))

        def fail_all(reason: str, error: str, failures: list[RegionFailure] | None = None) -> None:
            for s, _ in live:
                cycle_state.fail_cycle(self.ctx.store, s.cycle.id, error, s.limits, self.ctx.now(), failures=failures)
                results[s.cycle.id] = s.result(reason)

        try:
            provider = self.ctx.provider_for(live[0][0].backend) if live else None
            if provider is not None:
                try:
                    provider.verify_identity()  # SAFETY.md rule 11: before anything is listed
                except ProviderThrottled as exc:
                    # Not a mismatch, and not an answer: every region is unavailable this cycle.
                    reason = identity_failure(exc)
                    for _, batcher in live:
                        for name in dict.fromkeys(batcher.started.backend.regions):
                            batcher.add_failure(RegionListing(region=name, failure=reason, throttled=True))
                    provider = None
                except ProviderError as exc:
                    reason = identity_failure(exc)
                    for s, _ in live:
                        self.ctx.reporter.error("identity check failed", backend=s.backend.id,
                                                cycle_id=s.cycle.id, error=reason)
                    fail_all("identity_failed", reason, [RegionFailure(region="*", error=reason)])
                    live, provider = [], None
            for region in provider.iter_listing() if provider is not None else ():
                for _, batcher in live:
                    for batch in batcher.add(region):
                        self.listing_queue.publish(batch)
            results.update(self._close(live))
        except Exception as exc:  # the listing raised: the cycles fail (STEP 7), never orphans
            for s, _ in live:
                self.ctx.reporter.error("listing failed", backend=s.backend.id, cycle_id=s.cycle.id,
                                        error=describe_error(exc))
            fail_all("listing_failed", f"listing failed: {describe_error(exc)}")
            if not isinstance(exc, (OrphanCleanupError, DatabaseError)):
                raise
        return [results[s.cycle.id] for s in group]
