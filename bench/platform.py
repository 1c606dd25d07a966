"""Benchmark: the platform's writes (what the product's load and triggers cost the platform's transactions).

The latency of the platform's own transactions on the database the product shares
with it: the ledger protocol's calls (``LedgerClient``: ``issue_ref``,
``mark_provisioning``, busy/idle ``set_status``, ``mark_terminated``), each owner
going through those five, paced at a target rate (Poisson arrivals) from 8 threads,
each on its own connection (application_name ``bench-platform``).

- **Case A, the cleanup's load.** The same transactions on one migrated database
  (the product's triggers on), with no cleanup running (baseline) and while a fleet
  runs its cycles on the same database: a child process (nice 10: in production the
  cleanup's own CPU is elsewhere, only the database is shared) loops the tick
  (``Pipeline.run_tick``), the listing jobs and the classifier's batches of several
  backends over in-memory clouds (``tests/support/memory_cloud.py``), each backend its
  own account, a few thousand listed groups in total, report mode. A sampler on its
  own connection reads ``pg_locks``/``pg_stat_activity`` every ~20 ms and keeps the
  longest lock wait it saw of a platform connection (``pg_locks.waitstart``), and who
  blocked it.
- **Case B, the triggers.** The same transactions on two copies of one schema: as
  migrated, and with the product's triggers on ``provider_refs``, ``instances``,
  ``volumes`` and ``backends`` dropped (``pg_trigger``, not internal ones).

The compared cases alternate in short rounds (ABBA), so a drifting machine hurts
both alike; a transaction that straddles a switch is not counted. Every figure is
its case's; the ratio is to the baseline measured in the same run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any

from bench.common import PgServer, Table
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.db import Database, connect

APP = "bench-platform"
REGIONS = ("r1", "r2", "r3")
C1_TABLES = ("provider_refs", "instances", "volumes", "backends")
GOAL_P99 = 1.2
GOAL_WAIT_MS = 50.0


@dataclass
class Config:
    rate: float = 200.0  # target transactions/s, all threads together
    threads: int = 8
    backends: int = 8
    groups_per_backend: int = 500
    history: int = 50_000  # terminated owners already in the ledger (table and index size)
    rounds: int = 8  # per case: this many rounds of each side (ABBA)
    round_seconds: float = 10.0
    sample_ms: float = 20.0
    # The fleet's connections' startup options (e.g. "-c synchronous_commit=off": what the
    # cleanup's redoable commits would cost with it); None: as deployed.
    fleet_options: str | None = None

    @classmethod
    def quick(cls) -> Config:
        return cls(backends=4, groups_per_backend=500, history=20_000, rounds=4, round_seconds=5.0)


def run(server: PgServer, quick: bool = False, cfg: Config | None = None) -> list[Table]:
    cfg = cfg or (Config.quick() if quick else Config())
    template = server.fresh_database("oc_bench_plat")
    dbs: list[Database] = []
    fleet: _Fleet | None = None
    try:
        _seed(template, cfg)
        db_a, with_t, without_t = (server.clone(template, p) for p in ("oc_bench_plat_a", "oc_bench_plat_t",
                                                                      "oc_bench_plat_n"))
        dbs += [db_a, with_t, without_t]
        dropped = _drop_product_triggers(without_t)
        fleet = _Fleet(db_a, cfg)
        load = _Load({"a": db_a, "with": with_t, "without": without_t}, cfg)
        sampler = _LockSampler(db_a, load)
        load.start()
        sampler.start()
        try:
            fleet.wait_ready()
            # Warm-up, not counted: every connection opened, the fleet's first cycle (enrolment).
            for key in ("with", "without", "a"):
                load.measure(None, key, 1.0)
            fleet.resume()
            load.measure(None, "a", 2.0 * cfg.round_seconds)
            fleet.pause()
            work: dict[str, float] = {"seconds": 0.0}
            a = _alternate(load, cfg, ("A: no cleanup running", "a", None),
                           ("A: fleet cycles running", "a", fleet), work)
            fleet.stop()
            b = _alternate(load, cfg, ("B: without the product's triggers", "without", None),
                           ("B: with the product's triggers", "with", None), {})
        finally:
            sampler.stop()
            load.stop()
        # the run's rows only: the seed's are dated 29 days back
        activity = _count(with_t, "SELECT count(*) FROM ledger_activity WHERE at > now() - interval '1 day'")
        return _tables(cfg, load, sampler, fleet, work, a, b, dropped, activity)
    finally:
        if fleet is not None:
            fleet.stop()
        for db in dbs:
            server.drop(db)
        server.drop(template)


# ---- the schema and its data ---------------------------------------------------------------


def backend_ids(cfg: Config) -> list[str]:
    return [f"proj-{i:02}" for i in range(cfg.backends)]


def _seed(db: Database, cfg: Config) -> None:
    """The fleet's backends (one account each, report mode) and ``history`` terminated owners."""
    with db.transaction() as conn:
        for i, b in enumerate(backend_ids(cfg)):
            conn.run("INSERT INTO backends (id, provider, account, regions, mode)"
                     " VALUES (:b, 'aws', :a, CAST(:r AS text[]), 'report')",
                     b=b, a=f"{100000000000 + i}", r=list(REGIONS))
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id, owner_name, issued_at)"
                 " SELECT 'h' || lpad(i::text, 11, '0'), 'hist-' || i, 'history', now() - interval '30 days'"
                 " FROM generate_series(1, :n) AS i", n=cfg.history)
        conn.run("INSERT INTO instances (id, name, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at, terminated_at)"
                 " SELECT 'hist-' || i, 'history', 'h' || lpad(i::text, 11, '0'), 'terminated',"
                 " 'proj-' || lpad((i % :b)::text, 2, '0'), 'i-h' || i, 'r1', now() - interval '30 days',"
                 " now() - interval '30 days', now() - interval '29 days' FROM generate_series(1, :n) AS i",
                 n=cfg.history, b=cfg.backends)
        conn.run("UPDATE ledger_activity SET at = at - interval '29 days'")
    with db.connection() as conn:
        conn.run("VACUUM ANALYZE")


def _drop_product_triggers(db: Database) -> list[str]:
    """Drop the product's (non-internal) triggers on the C1 tables; return them as ``table.trigger``."""
    with db.transaction() as conn:
        rows = conn.run("SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                        " WHERE NOT t.tgisinternal AND c.relname = ANY(CAST(:t AS text[]))"
                        " AND c.relnamespace = current_schema()::regnamespace ORDER BY 1, 2", t=list(C1_TABLES))
        for table, trigger in rows:
            conn.run(f'DROP TRIGGER "{trigger}" ON "{table}"')
    return [f"{t}.{g}" for t, g in rows]


def _count(db: Database, sql: str) -> int:
    with db.connection() as conn:
        return int(conn.run(sql)[0][0])


# ---- the platform's load ---------------------------------------------------------------------


KINDS = ("issue_ref", "mark_provisioning", "busy", "idle", "mark_terminated")


@dataclass
class _Owners:
    """One thread's owners on one database, each at its next step of the five."""

    live: deque = field(default_factory=deque)


class _Load:
    """``threads`` threads writing as the platform does, to the database ``key`` says.

    ``measure(label, key, seconds)`` points them at a database and counts what they
    finish there for ``seconds`` under ``label`` (None: not counted)."""

    LIVE = 10  # owners a thread keeps between their steps

    def __init__(self, dbs: dict[str, Database], cfg: Config) -> None:
        self.cfg = cfg
        self.clients = {k: LedgerClient(Database(replace(db.info, application_name=APP), keep_idle=True))
                        for k, db in dbs.items()}
        self.backends = backend_ids(cfg)
        self.key = "a"
        self.label: str | None = None
        self.generation = 0
        self.samples: dict[str, list[tuple[str, float]]] = {}
        self.seconds: dict[str, float] = {}
        self.wal: dict[str, Counter] = {}  # per label: WAL bytes and syncs of the whole server (pg_stat_wal)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"platform-{i}")
                         for i in range(cfg.threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        for client in self.clients.values():
            client.db.close()

    def measure(self, label: str | None, key: str, seconds: float) -> None:
        self.generation += 1
        self.key, self.label = key, None
        time.sleep(0.2)  # the previous round's transactions finish, uncounted
        self.generation += 1
        self.label = label
        wal = _wal(self.clients[key].db)
        start = time.perf_counter()
        time.sleep(seconds)
        if label is not None:
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start
            self.wal.setdefault(label, Counter()).update(_wal(self.clients[key].db) - wal)
        self.generation += 1
        self.label = None

    def _worker(self, i: int) -> None:
        rng = random.Random(i)
        owners = {k: _Owners() for k in self.clients}
        per_thread = self.cfg.rate / self.cfg.threads
        due = time.perf_counter() + rng.expovariate(per_thread)
        n = 0
        try:
            while not self._stop.is_set():
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -1.0:  # far behind: no burst to catch up
                    due = time.perf_counter()
                due += rng.expovariate(per_thread)
                key, label, gen = self.key, self.label, self.generation
                n += 1
                start = time.perf_counter()
                kind = self._step(self.clients[key], owners[key], i, n, rng)
                elapsed = time.perf_counter() - start
                if label is not None and gen == self.generation:
                    self.samples.setdefault(label, []).append((kind, elapsed))
        except Exception as e:  # noqa: BLE001 - reported in the table's notes, the run goes on without it
            self.errors.append(f"{type(e).__name__}: {e}")

    def _step(self, client: LedgerClient, owners: _Owners, i: int, n: int, rng: random.Random) -> str:
        if len(owners.live) < self.LIVE:
            issued = client.issue_ref(owner_name=f"platform-{i}")
            owners.live.append((issued.owner_id, 0))
            return KINDS[0]
        owner, stage = owners.live.popleft()
        if stage == 0:
            client.mark_provisioning(owner, backend_id=rng.choice(self.backends), primary_id=f"i-p{i}x{n}",
                                     region=rng.choice(REGIONS))
        elif stage == 1:
            client.set_status(owner, OwnerStatus.BUSY)
        elif stage == 2:
            client.set_status(owner, OwnerStatus.IDLE)
        else:
            client.mark_terminated(owner)
            return KINDS[4]
        owners.live.append((owner, stage + 1))
        return KINDS[stage + 1]


WAL_SQL = ("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'),"
           " (SELECT sum(fsyncs) FROM pg_stat_io WHERE object = 'wal')")  # PostgreSQL 18; NULL before


def _wal(db: Database) -> Counter:
    """The server's WAL bytes and WAL fsyncs so far (fsyncs: -1 where pg_stat_io does not count them)."""
    with db.connection() as conn:
        try:
            written, syncs = conn.run(WAL_SQL)[0]
        except Exception:  # noqa: BLE001 - PostgreSQL 14/15: no pg_stat_io
            written, syncs = conn.run("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")[0][0], None
    return Counter(bytes=int(written), syncs=int(syncs) if syncs is not None else -1)


def _alternate(load: _Load, cfg: Config, first: tuple[str, str, Any], second: tuple[str, str, Any],
               work: dict[str, float]) -> tuple[str, str]:
    """``cfg.rounds`` rounds of each, ABBA; a case with a fleet resumes it for its rounds."""
    for r in range(cfg.rounds):
        for label, key, fleet in ((first, second) if r % 2 == 0 else (second, first)):
            if fleet is not None:
                before = fleet.counters()
                fleet.resume()
                load.measure(label, key, cfg.round_seconds)
                fleet.pause()
                after = fleet.counters()
                for k, v in after.items():
                    work[k] = work.get(k, 0.0) + v - before[k]
                work["seconds"] += cfg.round_seconds
            else:
                load.measure(label, key, cfg.round_seconds)
    return first[0], second[0]


# ---- the lock sampler ------------------------------------------------------------------------


SAMPLE_SQL = """
SELECT w.pid, l.waitstart, extract(epoch FROM clock_timestamp() - l.waitstart) * 1000,
       l.locktype, coalesce(l.relation::regclass::text, ''), l.mode,
       coalesce((SELECT string_agg(DISTINCT b.application_name, ',') FROM pg_stat_activity b
                  WHERE b.pid = ANY(pg_blocking_pids(w.pid))), '')
  FROM pg_stat_activity w JOIN pg_locks l ON l.pid = w.pid AND NOT l.granted
 WHERE w.wait_event_type = 'Lock' AND w.application_name = :app AND l.waitstart IS NOT NULL
"""


# What each active platform connection is doing at a sample: waiting (type:event) or on CPU.
ACTIVE_SQL = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
 WHERE application_name = :app AND state = 'active'
"""


@dataclass
class Wait:
    ms: float
    label: str | None
    what: str
    blockers: str


class _LockSampler:
    """Every ``sample_ms``, the platform connections waiting on a lock; per wait (pid and
    waitstart) the longest time it was seen waiting."""

    def __init__(self, db: Database, load: _Load) -> None:
        self.db, self.load = db, load
        self.waits: dict[tuple[int, Any], Wait] = {}
        self.samples: dict[str | None, int] = {}
        self.doing: dict[str | None, Counter] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lock-sampler")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        conn = connect(self.db.info, application_name="bench-sampler")
        try:
            period = self.load.cfg.sample_ms / 1000
            while not self._stop.wait(period):
                label = self.load.label
                for pid, start, ms, locktype, rel, mode, blockers in conn.run(SAMPLE_SQL, app=APP):
                    key = (pid, start)
                    w = self.waits.get(key)
                    if w is None or float(ms) > w.ms:
                        self.waits[key] = Wait(float(ms), label if w is None else w.label,
                                               f"{locktype} {rel} {mode}".strip(), blockers)
                self.samples[label] = self.samples.get(label, 0) + 1
                self.doing.setdefault(label, Counter()).update(e for (e,) in conn.run(ACTIVE_SQL, app=APP))
        finally:
            conn.close()

    def longest(self, label: str) -> tuple[Wait | None, int]:
        mine = [w for w in self.waits.values() if w.label == label]
        return (max(mine, key=lambda w: w.ms) if mine else None), len(mine)


# ---- the fleet ---------------------------------------------------------------------------------


class _Fleet:
    """The cleanup's cycles in a child process, paused and resumed between rounds."""

    def __init__(self, db: Database, cfg: Config) -> None:
        ctx = mp.get_context("spawn")
        self.run_ev, self.paused_ev, self.stop_ev, self.ready_ev = (ctx.Event() for _ in range(4))
        self.paused_ev.set()
        self.stats = ctx.Array("d", 3)  # cycles, batches, groups
        self.groups = ctx.Value("i", 0)
        self.proc = ctx.Process(target=_fleet_main, name="bench-fleet", daemon=True,
                                args=(db.info, cfg, self.run_ev, self.paused_ev, self.stop_ev, self.ready_ev,
                                      self.stats, self.groups))
        self.proc.start()

    def wait_ready(self) -> None:
        while not self.ready_ev.wait(1.0):
            if not self.proc.is_alive():
                raise RuntimeError(f"the fleet process died (exit {self.proc.exitcode})")

    def resume(self) -> None:
        self.paused_ev.clear()
        self.run_ev.set()

    def pause(self) -> None:
        self.run_ev.clear()
        while not self.paused_ev.wait(1.0):
            if not self.proc.is_alive():
                raise RuntimeError(f"the fleet process died (exit {self.proc.exitcode})")

    def counters(self) -> dict[str, float]:
        cycles, batches, groups = self.stats[:]
        return {"cycles": cycles, "batches": batches, "groups": groups}

    def stop(self) -> None:
        if self.proc.is_alive():
            self.stop_ev.set()
            self.run_ev.set()
            self.proc.join(timeout=60)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(timeout=10)


def _fleet_main(info: Any, cfg: Config, run_ev: Any, paused_ev: Any, stop_ev: Any, ready_ev: Any,
                stats: Any, groups: Any) -> None:
    from pydantic import TypeAdapter

    from bench.classifier import quiet_reporter
    from orphan_cleanup.core.messages import ListingBatch, ListingJob
    from orphan_cleanup.core.settings import Settings
    from orphan_cleanup.cycle.pipeline import Pipeline
    from orphan_cleanup.cycle.runner import drain
    from orphan_cleanup.queues.memory import InProcessQueue
    from tests.support.memory_cloud import MemoryCloud, MemoryProvider

    os.nice(10)  # the cleanup's own CPU is not the database's: only its statements compete
    db = Database(replace(info, options=cfg.fleet_options) if cfg.fleet_options else info, keep_idle=True)
    clouds = {b: MemoryCloud() for b in backend_ids(cfg)}
    groups.value = _fleet_ledger(db, clouds, cfg)
    jobs, listing = InProcessQueue(), InProcessQueue()
    pipeline = Pipeline(settings=Settings(), db=db, provider_for=lambda b: MemoryProvider(b, clouds[b.origin]),
                        listing_queue=listing, delete_queue=InProcessQueue(), jobs_queue=jobs,
                        reporter=quiet_reporter())
    batch = TypeAdapter(ListingBatch)
    ready_ev.set()

    def checkpoint() -> bool:
        if not run_ev.is_set():
            paused_ev.set()
            run_ev.wait()
            paused_ev.clear()
        return not stop_ev.is_set()

    while checkpoint():
        with db.connection() as conn:  # an interval went by: every backend is due again
            conn.run("UPDATE cleanup SET next_due_at = oc_clock() - interval '1 second'")
        pipeline.run_tick()
        while (body := jobs.pop()) is not None and checkpoint():
            pipeline.run_job(ListingJob.model_validate_json(body))
        while (body := listing.pop()) is not None:
            if not checkpoint():
                return
            b = batch.validate_json(body)
            pipeline.handle_batch(b)
            stats[1] += 1
            stats[2] += len(b.groups)
        drain(pipeline)  # report mode: no delete requests; a redelivered batch would be here
        stats[0] += 1


def _fleet_ledger(db: Database, clouds: dict[str, Any], cfg: Config) -> int:
    """Per backend, ``groups_per_backend`` VMs (instance and root volume, one ref) over
    the regions, two hours old: 85% tracked busy owners, 10% terminated owners whose VM
    still runs, 5% refs whose owner row is gone. Returns the groups listed in total."""
    from datetime import UTC, datetime, timedelta

    from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
    from orphan_cleanup.core.listing import ResourceKind

    when = datetime.now(UTC) - timedelta(hours=2)
    total = 0
    for bi, (backend, cloud) in enumerate(clouds.items()):
        refs, ids, iids, regions, statuses = [], [], [], [], []
        for i in range(cfg.groups_per_backend):
            ref = f"f{bi:02}{i:09}"
            region = REGIONS[i % len(REGIONS)]
            iid = cloud.create(ResourceKind.INSTANCE, region, {DEFAULT_TAG_KEY: ref}, created_at=when)
            cloud.create(ResourceKind.VOLUME, region, {DEFAULT_TAG_KEY: ref}, attached_to=iid, created_at=when)
            refs.append(ref)
            ids.append(f"fleet-{bi}-{i}")
            iids.append(iid)
            regions.append(region)
            statuses.append("gone" if i % 20 == 0 else "terminated" if i % 10 == 1 else "busy")
        total += len(refs)
        with db.transaction() as conn:
            conn.run("INSERT INTO provider_refs (provider_ref, owner_id, owner_name, issued_at)"
                     " SELECT r, o, 'fleet', now() - interval '2 hours'"
                     " FROM unnest(CAST(:r AS text[]), CAST(:o AS text[])) AS u(r, o)", r=refs, o=ids)
            conn.run("INSERT INTO instances (id, name, provider_ref, status, backend_id, primary_id, region,"
                     " created_at, provisioned_at, terminated_at)"
                     " SELECT o, 'fleet', r, s, :b, p, g, now() - interval '2 hours', now() - interval '2 hours',"
                     "        CASE WHEN s = 'terminated' THEN now() - interval '90 minutes' END"
                     " FROM unnest(CAST(:r AS text[]), CAST(:o AS text[]), CAST(:s AS text[]), CAST(:p AS text[]),"
                     "             CAST(:g AS text[])) AS u(r, o, s, p, g) WHERE s <> 'gone'",
                     r=refs, o=ids, s=statuses, p=iids, g=regions, b=backend)
    with db.connection() as conn:
        conn.run("UPDATE ledger_activity SET at = at - interval '2 hours' WHERE at > now() - interval '1 minute'")
        conn.run("ANALYZE")
    return total


# ---- the tables ------------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def _row(load: _Load, label: str, base: str) -> dict[str, Any]:
    lat = [s for _, s in load.samples.get(label, [])]
    base_lat = [s for _, s in load.samples.get(base, [])]
    secs = load.seconds.get(label, 0.0)
    wal = load.wal.get(label, Counter())
    return {"case": label, "transactions": len(lat), "tx/s": len(lat) / secs if secs else 0.0,
            "p50 ms": _pct(lat, 0.50), "p95 ms": _pct(lat, 0.95), "p99 ms": _pct(lat, 0.99),
            "max ms": max(lat) * 1000 if lat else float("nan"),
            "p99 x baseline": _pct(lat, 0.99) / _pct(base_lat, 0.99) if base_lat else float("nan"),
            "WAL MB/s": wal["bytes"] / 2**20 / secs if secs else 0.0,
            "WAL syncs/s": wal["syncs"] / secs if secs and wal["syncs"] >= 0 else None}


def _tables(cfg: Config, load: _Load, sampler: _LockSampler, fleet: _Fleet, work: dict[str, float],
            a: tuple[str, str], b: tuple[str, str], dropped: list[str], activity: int) -> list[Table]:
    cols = ["case", "transactions", "tx/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "p99 x baseline", "WAL MB/s",
            "WAL syncs/s"]
    head = (f"{cfg.threads} threads, target {cfg.rate:.0f} tx/s (Poisson), {cfg.rounds} rounds of "
            f"{cfg.round_seconds:g} s per case, alternated ABBA")
    ta = Table(f"The platform's writes, case A: while the cleanup's fleet cycles run ({head})",
               cols + ["fleet cycles", "longest lock wait ms", "lock waits seen", "blocked by"])
    for label in a:
        row = _row(load, label, a[0])
        wait, n = sampler.longest(label)
        row |= {"fleet cycles": int(work.get("cycles", 0)) if label == a[1] else 0,
                "longest lock wait ms": wait.ms if wait else 0.0, "lock waits seen": n,
                "blocked by": f"{wait.blockers or '?'} ({wait.what})" if wait else "-"}
        ta.add(**row)
    secs = work.get("seconds", 0.0) or 1.0
    ta.notes += [
        f"fleet: {cfg.backends} backends (one account each, 3 regions, report mode), {fleet.groups.value:,} listed "
        f"groups in total; during its rounds it ran {work.get('cycles', 0):.0f} full fleet cycles (tick, listings, "
        f"classifier), {work.get('batches', 0) / secs:.1f} batches/s, {work.get('groups', 0) / secs:,.0f} groups "
        f"classified/s, never idle in its rounds (a child process at nice 10)",
        f"lock waits: pg_locks (waitstart) of the platform's connections, sampled every {cfg.sample_ms:.0f} ms "
        f"({sum(v for k, v in sampler.samples.items() if k in a):,} samples in case A); a wait shorter than a "
        f"period may go unseen; goal: none over {GOAL_WAIT_MS:.0f} ms",
        f"goal: p99 x baseline <= {GOAL_P99}; latency = the LedgerClient call (BEGIN to COMMIT, the client's "
        "Python included) on a kept connection",
        f"the ledger holds {cfg.history:,} older terminated owners besides the fleet's",
        "WAL MB/s: the server's WAL position over the case's rounds; syncs/s: WAL fsyncs of pg_stat_io (PostgreSQL "
        "18; backends report them within about a second)",
    ]
    tb = Table(f"The platform's writes, case B: the product's triggers on the C1 tables ({head})", cols)
    for label in b:
        tb.add(**_row(load, label, b[0]))
    tb.notes += [f"dropped in the copy without: {', '.join(dropped)}",
                 f"ledger_activity rows the triggers wrote in the copy with them during the run: {activity:,}"
                 " (warm-up and uncounted transactions included)"]
    kinds = Table("The platform's writes, case B by transaction (p99 ms; x = with / without)",
                  ["transaction", "statements", "without p50", "with p50", "without p99", "with p99", "p99 x"])
    stmts = {"issue_ref": "BEGIN, 2 INSERT, COMMIT", "mark_provisioning": "BEGIN, UPDATE, COMMIT",
             "busy": "BEGIN, UPDATE, COMMIT", "idle": "BEGIN, UPDATE, COMMIT",
             "mark_terminated": "BEGIN, UPDATE, COMMIT"}
    for kind in KINDS:
        wo = [s for k, s in load.samples.get(b[0], []) if k == kind]
        wi = [s for k, s in load.samples.get(b[1], []) if k == kind]
        kinds.add(**{"transaction": kind, "statements": stmts[kind], "without p50": _pct(wo, 0.5),
                     "with p50": _pct(wi, 0.5), "without p99": _pct(wo, 0.99), "with p99": _pct(wi, 0.99),
                     "p99 x": _pct(wi, 0.99) / _pct(wo, 0.99) if wo and wi else float("nan")})
    if load.errors:
        ta.notes.append(f"platform errors (a thread stopped): {load.errors[:3]}")
    return [ta, tb, kinds, _doing(sampler, (*a, *b))]


def _doing(sampler: _LockSampler, labels: tuple[str, ...]) -> Table:
    """The platform's active connections at the samples: on CPU or waiting, on what."""
    table = Table("The platform's writes: what its active connections were doing when sampled (share of samples)",
                  ["case", "active seen", "CPU", "IO", "LWLock", "Lock", "other", "top waits"])
    for label in labels:
        doing = sampler.doing.get(label, Counter())
        n = sum(doing.values()) or 1
        by_type = Counter()
        for event, k in doing.items():
            kind = event.split(":")[0]
            by_type[kind if kind in ("CPU", "IO", "LWLock", "Lock") else "other"] += k
        top = ", ".join(f"{e} {100 * k / n:.0f}%" for e, k in doing.most_common(4) if e != "CPU")
        table.add(**{"case": label, "active seen": sum(doing.values()),
                     **{k: f"{100 * by_type[k] / n:.0f}%" for k in ("CPU", "IO", "LWLock", "Lock", "other")},
                     "top waits": top or "-"})
    table.notes.append("pg_stat_activity of the connections named bench-platform in state active, at each lock "
                       "sample; CPU = no wait event (running, or waiting for a core)")
    return table
