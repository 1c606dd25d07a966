"""One seed of the simulation: a platform and the cleanup running together
against the simulated provider, the real classifier, pipeline and Postgres.

The run drives the deployed shape by hand: the scheduler fires the tick
(``Pipeline.run_tick``: one listing job per group of due backends sharing a
listing) in a seeded share of its runs and invokes ``Pipeline.run_lister`` for
one backend in the others (a direct invoke, sometimes manual or with a one-off
mode); it delivers queued messages to ``run_job``, ``handle_batch`` and
``handle_delete`` as the SQS/Pub-Sub event sources would, with duplicates,
delays, losses, forgeries, any order, and functions that crash before or after
the handler. Each step advances the simulated clock, then does one thing: a
platform or people action, a scheduled run, or one delivery.

After ``steps`` steps the faults stop and the platform drives its in-flight
owners to final states (the settle phase); then the cleanup must converge (L1).
Deliveries live in ``functions.py``, the settle phase in ``settle.py``.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pg8000.native

from orphan_cleanup.core.messages import DeleteRequest
from orphan_cleanup.core.results import ListerResult, TickResult
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.reporting import Reporter
from tests.sim import db as simdb
from tests.sim.backends import Backends
from tests.sim.cloud import ListingRecord, SimCloud, SimProvider
from tests.sim.deletion_worlds import Worlds
from tests.sim.functions import Functions
from tests.sim.invariants import Checker, Violation
from tests.sim.owners import PROTECT_STACK
from tests.sim.platform import Platform
from tests.sim.queues import JOBS_MAX_RECEIVES, JOBS_VISIBILITY_TIMEOUT, SimQueue
from tests.sim.retire import Retire
from tests.sim.settle import Settle
from tests.sim.world import (
    ACCOUNT,
    BACKEND,
    BASE_RATES,
    DEADLINE,
    EPOCH,
    INTENSITIES,
    INTERVAL,
    MARGIN,
    MAX_BACKOFF,
    Dice,
    SimClock,
    Trace,
    stream,
    swarm,
)

PLATFORM_FAULTS = {"crash_after_ref", "error_after_create", "create_error", "crash_after_create",
                   "crash_terminating", "termination_gave_up", "volume_left_behind", "user_copy",
                   "user_protect", "user_untag", "foreign_resource"}
#: Normal operation rather than faults: never scaled down, never switched off.
BEHAVIOUR = {"commit_lag", "concurrent_delete", "concurrent_lister"}


class _Silent:
    """The reporter's logger: the simulation reads the database, not the log."""

    def _drop(self, *_a: Any, **_k: Any) -> None:
        return None

    debug = info = warning = error = exception = _drop


quiet = _Silent()


@dataclass
class SimEnv:
    """What outlives a seed: the database, its pools, an admin connection."""

    admin: pg8000.native.Connection
    pipeline_pool: simdb.ConnectionPool
    platform_pool: simdb.ConnectionPool

    @classmethod
    def open(cls, info: simdb.ConnInfo) -> SimEnv:
        simdb.prepare(simdb.Database(info))
        admin = simdb.connect(info, application_name="oc-sim-admin")
        admin.run("SET synchronous_commit = off")
        return cls(admin, simdb.ConnectionPool(info), simdb.ConnectionPool(info))

    def close(self) -> None:
        self.pipeline_pool.close_all()
        self.platform_pool.close_all()
        self.admin.close()


@dataclass
class SeedResult:
    seed: int
    steps: int
    faults: Counter
    checks: Counter
    violations: list[Violation]
    outcome: str  # L1: converged | blocked | reported | violation
    cycles: int = 0
    deleted: int = 0
    crashes: Counter = field(default_factory=Counter)
    # Scheduled work: direct lister runs, ticks, listing jobs run, shared listings
    # (a job's ``listings`` below its started backends) and the cycles they fed.
    work: Counter = field(default_factory=Counter)


class SimReporter(Reporter):
    def __init__(self, sim: Simulation) -> None:
        super().__init__(logger=quiet)
        self.sim = sim

    def orphan(self, backend_id: str, cycle_id: str, row: dict[str, Any]) -> None:
        self.sim.checker.reported.append(cycle_id)
        super().orphan(backend_id, cycle_id, row)


class Simulation(Functions, Settle, Backends, Worlds, Retire):
    def __init__(self, env: SimEnv, seed: int, steps: int,
                 provider_cls: Callable[..., SimProvider] = SimProvider, ignore: frozenset[str] = frozenset(),
                 function_clock: bool = False) -> None:
        self.env, self.seed, self.steps, self.ignore = env, seed, steps, ignore
        self.admin = env.admin
        cfg = stream(seed, "config")
        infra, people = cfg.choice(INTENSITIES), cfg.choice((0.5, 1.0, 1.0, 2.0))
        rates = {k: v * (1.0 if k in BEHAVIOUR else people if k in PLATFORM_FAULTS else infra)
                 for k, v in BASE_RATES.items()}
        self.rates = swarm(rates, stream(seed, "swarm"), exempt=BEHAVIOUR)
        self.max_deletes, self.max_delete_share = 100, 0.5
        blast = cfg.random() < 0.25
        if blast:  # a blast-radius seed: a small cap, and a platform bug later
            self.rates["mass_terminate"], self.max_deletes = 1.0, 3
        if cfg.random() < 0.15:
            self.rates["mode_flip"] = 1.0
        self.mode = self.final_mode = "delete" if cfg.random() < 0.85 else "report"
        regions = ("r1", "r2", "r3")[:cfg.randint(1, 3)]
        self.margin, self.deadline = MARGIN, DEADLINE

        self.clock = SimClock(EPOCH)
        self.trace = Trace(self.clock)
        counts: Counter = Counter()
        self.dice = Dice(stream(seed, "faults"), self.rates, counts)
        self.behaviour = Dice(stream(seed, "behaviour"), self.rates, counts)
        # Rule 14's world (``protections.py``) in a share of the seeds, from streams of its own.
        self.rng_rule14 = stream(seed, "rule14")
        self.rule14 = self.rng_rule14.random() < 0.4
        if self.rule14:
            self.rates["user_termination_protect"] = self.rng_rule14.choice((0.15, 0.3, 0.6))
        self.rule14_dice = Dice(stream(seed, "rule14:faults"), self.rates, counts)
        # Rule 15's world (its own streams): people attach foreign volumes that the provider
        # would delete with an instance (DeleteOnTermination / autoDelete).
        self.rng_cascade = stream(seed, "cascade")
        self.cascade = self.rng_cascade.random() < 0.4
        if self.cascade:
            self.rates["user_attach_auto_delete"] = self.rng_cascade.choice((0.2, 0.4))
        self.cascade_dice = Dice(stream(seed, "cascade:faults"), self.rates, counts)
        # Rule 17's world (its own stream): a platform that sometimes records a mangled
        # primary_id (a float-rounded number, the VM's name).
        self.rng_mangle = stream(seed, "mangle")
        self.mangle = self.rng_mangle.random() < 0.3
        # Mark, then sweep (rule 23), from a stream of its own: the stack's confirmation window
        # (the interval in most seeds, off in some, twice the interval in some) and, in some
        # seeds, ``sim``'s row with its own ``confirm_seconds``: a shorter one is ignored, a
        # longer one applies (rule 8: a row may only tighten). W1 holds every delete to it.
        confirm = stream(seed, "confirm")
        self.confirm_seconds = confirm.choices((INTERVAL, 0, 2 * INTERVAL), weights=(70, 15, 15))[0]
        self.confirm_row: int | None = None
        if confirm.random() < 0.3:
            shorter = self.confirm_seconds > 0 and confirm.random() < 0.5
            self.confirm_row = (confirm.choice((0, self.confirm_seconds // 2)) if shorter
                                else self.confirm_seconds + confirm.choice((30, INTERVAL, 2 * INTERVAL)))
        self.setup_worlds()  # the deletion's worlds (deletion_worlds.py), each from streams of its own
        self.rng_sched, self.rng_platform = stream(seed, "sched"), stream(seed, "platform")
        self.rng_cloud, self.rng_db = stream(seed, "cloud"), stream(seed, "db")
        self.checker = Checker(self)
        self.cloud = SimCloud(ACCOUNT)
        self.cloud.terminate_lag = cfg.choice((0, 0, 1, 2))
        self.listing_record: ListingRecord | None = None  # the listing running now (set by SimProvider)
        self.work: Counter = Counter()
        self.job_reasons: dict[str, str] = {}  # backend -> why its first job run of a settle round went so
        # The scheduler's share of runs that go through the tick (the rest: direct invokes).
        self.rng_tick = stream(seed, "tick")
        self.rng_keys = stream(seed, "protect-key-choice")  # which key a user protects with (rule 16)
        # In a share of the seeds users also protect with the stack's own key, which no row names
        # (its own streams: the other draws of a seed stay as they were).
        self.stack_key_users = stream(seed, "stack-key").random() < 0.3
        self.rng_stack_key = stream(seed, "stack-key-choice")
        self.tick_share = self.rng_tick.choice((0.6, 0.75, 0.8))
        self.delete_ctx: list[DeleteRequest] = []
        self.in_delivery: set[int] = set()
        self.crashes: Counter = Counter()
        self.backend_id = BACKEND
        self.idle_until = 0

        simdb.reset(self.admin)
        random.seed(f"{seed}:global")  # STEP 7's backoff jitter uses the global generator
        simdb.set_db_clock(self.admin, self.clock())
        self.clock.on_advance(self.checker.clock_advanced)
        self.clock.on_advance(lambda _d: simdb.set_db_clock(self.admin, self.clock()))
        self.setup_backends(regions)
        pool = env.pipeline_pool
        pool.faults, pool.note = simdb.DbFaults(self.dice), self.trace
        # small messages: cycles of several batches (the lister keeps 4 KiB of each for the envelope)
        size = cfg.choice((4096 + 2048, 4096 + 4096, 200 * 1024))
        self.listing_q = SimQueue("listing", self.clock, self.dice, stream(seed, "lq"), self.trace, size)
        self.delete_q = SimQueue("delete", self.clock, self.dice, stream(seed, "dq"), self.trace, size)
        self.jobs_q = SimQueue("jobs", self.clock, self.dice, stream(seed, "jq"), self.trace, 256 * 1024,
                               max_receives=JOBS_MAX_RECEIVES, visibility_timeout=JOBS_VISIBILITY_TIMEOUT)
        # The stack's mode ceiling (rule 8): report in half the seeds whose rows start in report
        # mode (a stream of its own), where a row an operator or the platform flips to delete must
        # not delete (M1) unless an operator asked for a one-off delete; the others run as before.
        report_ceiling = self.final_mode == "report" and stream(seed, "ceiling").random() < 0.5
        self.checker.ceiling = "report" if report_ceiling else "delete"
        # Every setting the run depends on is named here: ``Settings`` also reads the environment
        # (tests/conftest.py exports ORPHAN_CLEANUP_CONFIRM_SECONDS=0 for the older tests), and
        # ``python -m tests.sim`` and pytest must run the same seeds alike.
        settings = Settings(ORPHAN_CLEANUP_MARGIN_SECONDS=MARGIN, ORPHAN_CLEANUP_INTERVAL_SECONDS=INTERVAL,
                            ORPHAN_CLEANUP_CONFIRM_SECONDS=self.confirm_seconds,
                            ORPHAN_CLEANUP_MAX_MODE=self.checker.ceiling,
                            ORPHAN_CLEANUP_PROTECT_TAG_KEY=PROTECT_STACK,
                            ORPHAN_CLEANUP_CYCLE_DEADLINE_SECONDS=DEADLINE,
                            ORPHAN_CLEANUP_MAX_DELETES=self.max_deletes,
                            ORPHAN_CLEANUP_MAX_DELETE_SHARE=self.max_delete_share, ORPHAN_CLEANUP_MODE="report",
                            ORPHAN_CLEANUP_MAX_BACKOFF_SECONDS=MAX_BACKOFF)
        self.listing_q.forger = self.forge_batch
        self.delete_q.forger = self.forge_request
        self.jobs_q.forger = self.forge_job
        self.listing_q.on_publish = self.batch_published
        self.world_queues()
        # The product's clock is the database's (oc_clock(), on simulated time: db.py). The
        # ``function_clock`` mutation brings back the function's own clock, skewed by this
        # seed's skew (the world that rule 13 guards against).
        clock = (lambda: self.clock() + timedelta(seconds=self.skew)) if function_clock else None
        self.pipeline = Pipeline(settings=settings, db=simdb.SimDatabase(pool),
                                 provider_for=lambda b: provider_cls(b, self.cloud_for(b), self),
                                 listing_queue=self.listing_q, delete_queue=self.delete_q,
                                 jobs_queue=self.jobs_q, reporter=SimReporter(self), clock=clock)
        self.platform = Platform(self, env.platform_pool, BACKEND, regions)
        if blast:  # live owners only: the bug that marks them all terminated makes the blast
            self.platform.history(cfg.randint(4, 7), stories=("live",))
        else:
            self.platform.history(cfg.randint(4, 14))
        if self.rule14:
            self.platform.rule14_history()
        if self.mangle:
            self.platform.mangle_history()
        backups = stream(seed, "backups")  # rule 15's snapshots (a stream of its own)
        if backups.random() < 0.4:
            self.platform.backup_history(backups)
        self.platform.world_history()
        self.retire_history()

    # ---- the run -------------------------------------------------------------

    def run(self) -> SeedResult:
        quiet_loggers = [logging.getLogger(n) for n in ("orphan_cleanup", "orphan_cleanup.ledger.store")]
        for logger in quiet_loggers:
            logger.disabled = True
        try:
            for _ in range(self.steps):
                self.step()
                if self.checker.violations:
                    return self._result("violation")
            outcome = self.settle()
            return self._result(outcome)
        finally:
            for logger in quiet_loggers:
                logger.disabled = False
            self.platform.flush(everything=True)
            self.env.pipeline_pool.faults = None

    def _result(self, outcome: str) -> SeedResult:
        n_cycles = self.admin.run("SELECT count(*) FROM cycles")[0][0]
        deleted = sum(len(c.deleted) for c in self.clouds.values())
        fed = Counter(id(record) for record in self.checker.listings.values())
        self.work["cycles_fed_by_shared_listing"] += sum(n for n in fed.values() if n > 1)
        return SeedResult(self.seed, self.trace.step, self.dice.counts, self.checker.checks,
                          self.checker.violations, outcome, n_cycles, deleted, self.crashes, self.work)

    def step(self) -> None:
        self.trace.step += 1
        self.platform.flush()
        dt = self.rng_sched.randint(1, 20)
        if self.dice.roll("lease_expiry_jump"):
            self.platform.flush(everything=True)  # commit lag stays below the margin
            dt = DEADLINE + self.rng_sched.randint(1, 300)
            self.trace(f"clock: jumps {dt}s, past the cycle deadline")
        self.clock.advance(dt)
        for cloud in self.clouds.values():
            cloud.tick(self.clock())
        self.world_operators()
        if self.dice.roll("db_kill_backends"):
            self.env.pipeline_pool.kill_next(self.admin)
            self.trace("db: pg_terminate_backend on an idle pooled connection")
        if self.idle_until <= self.trace.step and self.dice.roll("idle_spell"):
            self.idle_until = self.trace.step + self.rng_sched.randint(5, 40)
            self.trace(f"platform: idle until step {self.idle_until} (recoveries only)")
        self.platform.idle = self.idle_until > self.trace.step
        choices: list[tuple[float, Callable[[], None]]] = [(3.0, self.platform.step), (1.0, self.scheduled)]
        if self.jobs_q.ready():
            choices.append((3.0, self.deliver_job))
        if self.listing_q.ready():
            choices.append((3.0, self.deliver_batch))
        if self.delete_q.ready():
            choices.append((3.0, self.deliver_delete))
        pick = self.rng_sched.uniform(0, sum(w for w, _ in choices))
        action = choices[-1][1]
        for weight, candidate in choices:
            pick -= weight
            if pick <= 0:
                action = candidate
                break
        action()

    def set_mode(self, mode: str, backend_id: str = BACKEND) -> None:
        if backend_id == BACKEND:
            self.mode = mode
        self.edit_backend_row(backend_id, f"mode -> {mode}", "mode = :m", m=mode)

    # ---- pieces of the cleanup, each a checked step -------------------------------

    def _checked(self, work: Callable[[], None]) -> None:
        before = self.checker.before_step()
        try:
            work()
        finally:
            self.checker.after_step(before)

    def scheduled(self, *, nested: bool = False) -> None:
        """The scheduler fires: the tick (this seed's share of runs), else a direct
        invoke of the lister for one backend."""
        if self.rng_tick.random() < self.tick_share:
            self.tick(nested=nested)
        else:
            self.lister(nested=nested)

    def tick(self, *, nested: bool = False) -> TickResult | None:
        """One tick: every due backend in one statement, one listing job per shared listing."""
        out: list[TickResult | None] = [None]

        def work() -> None:
            out[0] = self._run_tick()

        if nested:
            work()
        else:
            self._checked(work)
        return out[0]

    def _run_tick(self) -> TickResult | None:
        for bid in sorted(self.backends):  # the tick may list any of them
            self.credentials_spell(bid)
        self.listing_record = None
        try:
            result = self.pipeline.run_tick()
        except Exception as exc:  # noqa: BLE001 - the function crashed; the schedule ticks again later
            self._crash("tick", exc, self.run_ids())
            return None
        self.work["ticks"] += 1
        for bid, reason in sorted(result.skipped.items()):
            if reason == "no_activity":
                self.checker.no_activity_skip(bid)
        skipped = ", ".join(f"{b}:{r}" for b, r in sorted(result.skipped.items()))
        self.trace(f"tick: jobs {result.jobs}" + (f", skipped {skipped}" if skipped else ""))
        return result

    def lister(self, backend_id: str | None = None, *, nested: bool = False) -> ListerResult | None:
        """One direct lister invocation for one backend (the scheduler's pick when not given)."""
        out: list[ListerResult | None] = [None]
        bid = backend_id or (self.rng_sched.choice(sorted(self.backends)) if len(self.backends) > 1 else BACKEND)

        def work() -> None:
            out[0] = self._run_lister(bid)

        if nested:
            work()
        else:
            self._checked(work)
        return out[0]

    def _run_lister(self, bid: str) -> ListerResult | None:
        # Operators invoke the lister as often per scheduler firing as before the tick took
        # most of the firings: manual runs and one-off modes are that much likelier per direct run.
        direct = 1.0 / (1.0 - self.tick_share)
        manual = self.rng_sched.random() < 0.1 * direct and self.dice.enabled
        # An operator's one-off mode in the event (``{"backend": ..., "mode": ...}``): never runs an off backend,
        # which is the backend an operator is most tempted to run once anyway.
        mode = self.rng_sched.choice(("delete", "report")) if self.dice.roll("mode_override", direct) else None
        if mode is not None and self.checker.off and self.rng_sched.random() < 0.8:
            bid = self.rng_sched.choice(sorted(self.checker.off))
        if mode == "delete":
            self.checker.asked_delete.add(bid)
        self.credentials_spell(bid)
        self.listing_record = None
        summary = None
        try:
            summary = self.pipeline.run_lister(bid, manual=manual, mode=mode)
            self.trace(f"lister {bid}{' (manual)' if manual else ''}{f' mode={mode}' if mode else ''}:"
                       f" {summary.reason} cycle={str(summary.cycle_id)[:8]} batches={summary.batches}")
        except Exception as exc:  # noqa: BLE001 - the function crashed; the scheduler tries again later
            self._crash("lister", exc, (bid,))
        self.work["direct_lister_runs"] += 1
        if summary is not None and summary.reason == "no_activity":
            self.checker.no_activity_skip(bid)
        return summary

    def _crash(self, where: str, exc: BaseException, backends: Iterable[str] = ()) -> None:
        """A function raised (its record or event comes back). ``backends``: whose work it was."""
        self.crashes[f"{where}:{type(exc).__name__}"] += 1
        self.checker.function_crashed(where, exc, set(backends))
        self.trace(f"{where}: crashed with {type(exc).__name__}: {str(exc)[:90]}")



def run_seed(env: SimEnv, seed: int, steps: int, **kw: Any) -> SeedResult:
    return Simulation(env, seed, steps, **kw).run()


