"""Benchmark: a modelled full cycle of a fleet (tick, listings, classifier, deleter).

What it models. ``accounts`` provider accounts, each a ``MemoryCloud`` (the synthetic
provider behind the real operations port, ``tests/support/memory_cloud.py``) with
``regions`` regions and ``vms_per_account`` VMs (an instance and its root volume, one
ref each), spread evenly over the regions; ``backends_per_account`` backends per account,
backend ``k`` listing region ``k`` alone, so no two backends share a listing key
(``Backend.listing_key``) and every backend is one listing of its own. Every VM is in
the real Postgres ledger (a ref row and an owner row, written in bulk by SQL, two hours
old: outside the margin); 2 % of them leaked, and must be found as orphans: every 100th
VM's owner is terminated while the VM still runs, every 100th (offset 50) ref lost its
owner row (a hard-deleted placeholder). The run asserts that the orphans recorded are
exactly the leaked VMs.

The parts are the product's: the real ``Pipeline`` (one per worker thread, as each
deployed function instance builds its own, all on one ``Database`` that keeps an idle
connection per thread as the deployed functions do), the real ledger, in-process
queues, and the deployed concurrency caps (template.yaml: ListerMaxConcurrency 5,
ClassifierMaxConcurrency 5, DeleterMaxConcurrency 2). One cycle: every backend is made
due, the tick runs once, then 5 lister threads run the listing jobs while 5 classifier
threads classify the batches as they are published and 2 deleter threads handle the
delete requests as they come (the phases overlap, as deployed). Two modes, each on a fresh
ledger: report mode (one cycle, no delete request), the default stack mode; then delete
mode, two cycles with ``ORPHAN_CLEANUP_CONFIRM_SECONDS=0`` (the deleter's outcomes per
cycle are in the notes; the run asserts that every leaked VM's instance and root volume,
and nothing else, was deleted).

What it measures, per size: wall time of the cycle and of each phase (a phase's span:
its first piece of work's start to its last one's end; the phases overlap), DB time per phase (time inside the
statements, summed over the phase's threads), statements per backend in all and per
phase, peak connections open at once (opened minus closed, highest seen; goal <= the
caps + 2), the database server's CPU time for the whole cycle (utime + stime of the
postmaster and all its children, reaped ones included, from /proc) against a same-run
baseline: the classifier's ledger join (``queries.JOIN_SQL``) alone, run on the same
batches' groups by as many threads as classifiers (ratio goal <= 1.5x), and the orphans
found. Two sizes are run to show how each figure grows with the fleet (goal: linear or
better, i.e. x10 or less for 10 times the backends).
"""

from __future__ import annotations

import os
import queue
import re
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.classifier import quiet_reporter
from bench.common import PgServer, Table, print_tables
from orphan_cleanup.core.backends import DEFAULT_TAG_KEY, Backend
from orphan_cleanup.core.listing import ResourceGroup, ResourceKind
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch, ListingJob
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import delete_all
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.db import Database, connect
from orphan_cleanup.queues.memory import InProcessQueue

PHASES = ("tick", "listing", "classify", "delete")
LEAK_EVERY = 100  # per 100 VMs one terminated, one without its owner row: 2 % leaked
GOAL_CONNECTIONS_OVER_CAPS = 2
GOAL_CPU_RATIO = 1.5
SQL_CHARS = 70  # a statement is told apart by its first characters
TOP_STATEMENTS = 10


@dataclass(frozen=True)
class Size:
    accounts: int
    backends_per_account: int = 10
    regions: int = 10  # per account; backend k lists region k (backends_per_account <= regions)
    vms_per_account: int = 1_000

    @property
    def backends(self) -> int:
        return self.accounts * self.backends_per_account

    @property
    def vms(self) -> int:
        return self.accounts * self.vms_per_account

    @property
    def leaked(self) -> int:
        return sum(1 for i in range(self.vms_per_account) if _role(i) != "busy") * self.accounts


def template_cap(parameter: str) -> int:
    """The default of a concurrency parameter of template.yaml (the SQS ScalingConfig's
    MaximumConcurrency of the lister, classifier or deleter)."""
    text = (Path(__file__).resolve().parent.parent / "template.yaml").read_text()
    found = re.search(rf"^  {parameter}:\n(?:    .*\n)*?    Default: (\d+)", text, re.M)
    if found is None:
        raise ValueError(f"template.yaml has no default for {parameter}")
    return int(found.group(1))


@dataclass
class Config:
    sizes: tuple[Size, ...] = (Size(accounts=10), Size(accounts=100))
    listers: int = field(default_factory=lambda: template_cap("ListerMaxConcurrency"))
    classifiers: int = field(default_factory=lambda: template_cap("ClassifierMaxConcurrency"))
    deleters: int = field(default_factory=lambda: template_cap("DeleterMaxConcurrency"))
    delete: bool = False  # report mode (one cycle); True: two delete-mode cycles, confirm window 0 (``run``
    # sets it per mode)

    @classmethod
    def quick(cls) -> Config:
        return cls(sizes=(Size(accounts=1), Size(accounts=10)))

    @property
    def caps(self) -> int:
        return self.listers + self.classifiers + self.deleters


MODES = ("report", "delete")


def run(server: PgServer, quick: bool = False, cfg: Config | None = None,
        modes: tuple[str, ...] = MODES) -> list[Table]:
    """The tables of each mode in ``modes`` (report: one cycle; delete: two), every size."""
    base = cfg or (Config.quick() if quick else Config())
    tables: list[Table] = []
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
        c = replace(base, delete=mode == "delete")
        tables += _tables(c, [_measure_size(server, size, c) for size in c.sizes])
    return tables


# ---- counting: statements, DB time and connections per phase ---------------------------------


@dataclass
class PhaseStats:
    statements: int = 0
    db_seconds: float = 0.0
    connections: int = 0
    backend_cpu: float = 0.0  # CPU of the server processes serving its connections
    started: float | None = None
    ended: float | None = None

    def span(self) -> float:
        return (self.ended - self.started) if self.started is not None and self.ended is not None else 0.0


class Meter:
    """Per phase (the calling thread's ``phase``): statements, time inside them, connections
    opened; over all: connections open now and the most open at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.phases: dict[str, PhaseStats] = {p: PhaseStats() for p in PHASES}
        self.by_sql: dict[tuple[str, str], list[float]] = {}  # (phase, statement's start): [count, seconds]
        self.open = self.peak = 0

    @property
    def phase(self) -> str:
        return getattr(self.local, "phase", "tick")

    def enter(self, phase: str) -> None:
        """The calling thread works for ``phase`` from now on."""
        self.local.phase = phase

    @contextmanager
    def work(self) -> Iterator[None]:
        """One piece of the thread's phase's work (a tick, a job, a batch, a delete request):
        the phase's span runs from its first piece's start to its last piece's end."""
        now = time.perf_counter()
        with self.lock:
            p = self.phases[self.phase]
            p.started = now if p.started is None else min(p.started, now)
        try:
            yield
        finally:
            now = time.perf_counter()
            with self.lock:
                p.ended = now if p.ended is None else max(p.ended, now)

    def statement(self, sql: str, seconds: float) -> None:
        with self.lock:
            p = self.phases[self.phase]
            p.statements += 1
            p.db_seconds += seconds
            seen = self.by_sql.setdefault((self.phase, " ".join(sql.split())[:SQL_CHARS]), [0, 0.0])
            seen[0] += 1
            seen[1] += seconds

    def opened(self) -> str:
        with self.lock:
            self.phases[self.phase].connections += 1
            self.open += 1
            self.peak = max(self.peak, self.open)
        return self.phase

    def closed(self, phase: str, backend_cpu: float) -> None:
        with self.lock:
            self.open -= 1
            self.phases[phase].backend_cpu += backend_cpu


class MeteredConnection:
    """A pg8000 connection whose statements are timed and whose close is counted."""

    def __init__(self, conn: Any, meter: Meter) -> None:
        self._conn, self._meter, self._closed = conn, meter, False
        self._phase = meter.opened()
        self._pid = backend_pid(conn)

    def run(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._conn.run(sql, *args, **kwargs)
        finally:
            self._meter.statement(sql, time.perf_counter() - start)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._meter.closed(self._phase, process_cpu(self._pid))
        self._conn.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class MeteredDatabase(Database):
    """The deployed functions' ``Database`` (an idle connection kept per thread), metered."""

    def __init__(self, db: Database, meter: Meter) -> None:
        super().__init__(db.info, keep_idle=True)
        self.meter = meter

    def connect(self) -> Any:
        return MeteredConnection(super().connect(), self.meter)


# ---- the database server's CPU time -------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()  # fields from the state on (field 3)


def backend_pid(conn: Any) -> int:
    """The pid of the server process serving a pg8000 connection (its BackendKeyData)."""
    return int(struct.unpack("!i", conn._backend_key_data[:4])[0])


def process_cpu(pid: int) -> float:
    """CPU seconds (utime + stime) of one live process; 0 when it is gone."""
    try:
        return sum(int(v) for v in _stat(pid)[11:13]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return 0.0


def server_pid(db: Database) -> int | None:
    """The postmaster: the parent of this connection's backend process (None: the server
    is not on this machine, ``DATABASE_URL``; its CPU is then not measured)."""
    with db.connection() as conn:
        backend = int(conn.run("SELECT pg_backend_pid()")[0][0])
        try:
            return int(_stat(backend)[1])  # ppid (field 4), while the backend lives
        except OSError:
            return None


def server_cpu(postmaster: int | None) -> float:
    """CPU seconds of the server so far: the postmaster's own and its reaped children's
    (utime, stime, cutime, cstime), and each live child's (utime, stime, cutime, cstime)."""
    if postmaster is None:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu(fields: list[str]) -> int:
        return sum(int(v) for v in fields[11:15])  # fields 14-17

    total = cpu(_stat(postmaster))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
        except (OSError, ValueError):
            continue  # gone meanwhile: the postmaster's cutime/cstime now holds it
        if int(fields[1]) == postmaster:
            total += cpu(fields)
    return total / ticks


# ---- the fleet's world: backends, clouds, ledger -------------------------------------------------


def _role(i: int) -> str:
    return "terminated" if i % LEAK_EVERY == 0 else "gone" if i % LEAK_EVERY == LEAK_EVERY // 2 else "busy"


def _account(a: int) -> str:
    return f"{200000000000 + a}"


def _backend_id(a: int, k: int) -> str:
    return f"fleet-{a:03}-{k:02}"


def _seed(db: Database, size: Size) -> dict[str, Any]:
    """Backends, clouds and the ledger; returns the clouds by account."""
    from tests.support.memory_cloud import MemoryCloud

    assert size.backends_per_account <= size.regions
    regions = [f"r{r:02}" for r in range(size.regions)]
    when = datetime.now(UTC) - timedelta(hours=2)
    clouds: dict[str, Any] = {}
    refs: list[str] = []
    owners: list[str] = []
    statuses: list[str] = []
    primaries: list[str] = []
    where: list[str] = []
    backends: list[str] = []
    for a in range(size.accounts):
        cloud = clouds[_account(a)] = MemoryCloud()
        for i in range(size.vms_per_account):
            r = i % size.regions
            if r >= size.backends_per_account:
                r %= size.backends_per_account  # regions no backend lists hold no VM
            ref = f"f{a:03}{i:08}"
            iid = cloud.create(ResourceKind.INSTANCE, regions[r], {DEFAULT_TAG_KEY: ref}, created_at=when)
            cloud.create(ResourceKind.VOLUME, regions[r], {DEFAULT_TAG_KEY: ref}, attached_to=iid, created_at=when)
            refs.append(ref)
            owners.append(f"vm-{a}-{i}")
            statuses.append(_role(i))
            primaries.append(iid)
            where.append(regions[r])
            backends.append(_backend_id(a, r))
    with db.transaction() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions)"
                 " SELECT 'fleet-' || lpad(a::text, 3, '0') || '-' || lpad(k::text, 2, '0'), 'aws',"
                 "        (200000000000 + a)::text, ARRAY['r' || lpad(k::text, 2, '0')]"
                 " FROM generate_series(0, :na - 1) AS a, generate_series(0, :nk - 1) AS k",
                 na=size.accounts, nk=size.backends_per_account)
        conn.run("INSERT INTO provider_refs (provider_ref, owner_id, owner_name, issued_at)"
                 " SELECT r, o, 'fleet', now() - interval '2 hours'"
                 " FROM unnest(CAST(:r AS text[]), CAST(:o AS text[])) AS u(r, o)", r=refs, o=owners)
        conn.run("INSERT INTO instances (id, name, provider_ref, status, backend_id, primary_id, region,"
                 " created_at, provisioned_at, terminated_at)"
                 " SELECT o, 'fleet', r, s, b, p, g, now() - interval '2 hours', now() - interval '2 hours',"
                 "        CASE WHEN s = 'terminated' THEN now() - interval '90 minutes' END"
                 " FROM unnest(CAST(:r AS text[]), CAST(:o AS text[]), CAST(:s AS text[]), CAST(:p AS text[]),"
                 "             CAST(:g AS text[]), CAST(:b AS text[])) AS u(r, o, s, p, g, b) WHERE s <> 'gone'",
                 r=refs, o=owners, s=statuses, p=primaries, g=where, b=backends)
        conn.run("UPDATE ledger_activity SET at = at - interval '2 hours'")
        conn.run("INSERT INTO cleanup (backend_id) SELECT id FROM backends ON CONFLICT DO NOTHING")
    with db.connection() as conn:
        conn.run("VACUUM ANALYZE")
    return clouds


def _make_due(db: Database) -> None:
    """An interval went by: every backend is due."""
    with db.transaction() as conn:
        conn.run("UPDATE cleanup SET next_due_at = oc_clock() - interval '1 second'")
        conn.run("UPDATE cleanup SET clean_at = clean_at - interval '2 hours' WHERE clean_at IS NOT NULL")


# ---- one cycle of the fleet ----------------------------------------------------------------------


@dataclass
class Cycle:
    size: Size
    cfg: Config
    meter: Meter
    wall: float = 0.0
    server_cpu: float = 0.0
    batches: list[tuple[str, list[ResourceGroup]]] = field(default_factory=list)
    groups: int = 0
    orphan_verdicts: int = 0
    jobs: int = 0
    deletes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _run_cycle(db: Database, clouds: dict[str, Any], size: Size, cfg: Config, settings: Settings,
               postmaster: int | None) -> Cycle:
    from tests.support.memory_cloud import MemoryProvider

    meter = Meter()
    metered = MeteredDatabase(db, meter)
    cycle = Cycle(size, cfg, meter)
    jobs = InProcessQueue()
    listing, deletes = InProcessQueue(), InProcessQueue()
    batches: queue.Queue[str | None] = queue.Queue()
    requests: queue.Queue[str | None] = queue.Queue()
    listing.consumer = batches.put  # published batches go to the classifier threads at once
    deletes.consumer = requests.put
    lock = threading.Lock()

    def provider_for(backend: Backend) -> Any:
        return MemoryProvider(backend, clouds[backend.account])

    def pipeline() -> Pipeline:  # one per thread: each function instance builds its own
        return Pipeline(settings=settings, db=metered, provider_for=provider_for, listing_queue=listing,
                        delete_queue=deletes, jobs_queue=jobs, reporter=quiet_reporter())

    def worker(phase: str, body: Callable[[Pipeline], None]) -> Callable[[], None]:
        def target() -> None:
            try:
                meter.enter(phase)
                body(pipeline())
            except Exception as exc:  # noqa: BLE001 - reported, and the run's checks then fail
                with lock:
                    cycle.errors.append(f"{phase}: {type(exc).__name__}: {exc}")
            finally:
                metered.close()  # the thread's idle connection
        return target

    def lister(p: Pipeline) -> None:
        while (body := jobs.pop()) is not None:
            with meter.work():
                p.run_job(ListingJob.model_validate_json(body))

    def classifier(p: Pipeline) -> None:
        while (body := batches.get()) is not None:
            with meter.work():
                batch = ListingBatch.model_validate_json(body)
                result = p.handle_batch(batch)
            with lock:
                if batch.groups:  # an empty last batch sends no join
                    cycle.batches.append((batch.backend, list(batch.groups)))
                cycle.groups += len(batch.groups)
                cycle.orphan_verdicts += result.verdicts.get("orphan", 0)

    def deleter(p: Pipeline) -> None:
        while (body := requests.get()) is not None:
            with meter.work():
                outcomes = list(delete_all(p, [DeleteRequest.model_validate_json(body)]))
            with lock:
                for outcome in outcomes:
                    cycle.deletes[outcome.value] = cycle.deletes.get(outcome.value, 0) + 1

    cpu0 = server_cpu(postmaster)
    start = time.perf_counter()
    try:
        meter.enter("tick")
        with meter.work():
            tick = pipeline().run_tick()
        cycle.jobs = len(tick.jobs)
    finally:
        metered.close()
    listers = [threading.Thread(target=worker("listing", lister), name=f"lister-{i}") for i in range(cfg.listers)]
    classifiers = [threading.Thread(target=worker("classify", classifier), name=f"classifier-{i}")
                   for i in range(cfg.classifiers)]
    deleters = [threading.Thread(target=worker("delete", deleter), name=f"deleter-{i}") for i in range(cfg.deleters)]
    for t in (*deleters, *classifiers, *listers):
        t.start()
    for t in listers:
        t.join()
    for _ in classifiers:
        batches.put(None)
    for t in classifiers:
        t.join()
    for _ in deleters:
        requests.put(None)
    for t in deleters:
        t.join()
    cycle.wall = time.perf_counter() - start
    cycle.server_cpu = server_cpu(postmaster) - cpu0
    return cycle


# ---- the baseline: the classifier's ledger join alone, on the same batches ------------------------


@dataclass
class Floor:
    """Per pass over the batches (the mean of ``passes``)."""

    wall: float
    db_seconds: float
    server_cpu: float  # the whole server, as the cycle's
    backend_cpu: float  # the server processes of the floor's connections alone
    statements: int
    passes: int


def _floor(db: Database, batches: list[tuple[str, list[ResourceGroup]]], threads: int, postmaster: int | None,
           min_seconds: float = 1.0, min_passes: int = 3) -> Floor:
    """``queries.JOIN_SQL`` for each batch's groups, ``threads`` threads on open connections;
    passes over all the batches until ``min_seconds`` went by (at least ``min_passes``), so
    that the CPU clock's ticks (10 ms) do not swamp a small fleet's figure."""
    work: queue.Queue[tuple[str, str, str]] = queue.Queue()
    args = [(backend, ",".join({g.provider_ref for g in groups}),
             ",".join({g.provider_ref for g in groups if g.primary_id is None})) for backend, groups in batches]
    conns = [connect(db.info) for _ in range(threads)]
    pids = [backend_pid(c) for c in conns]
    seconds = [0.0] * threads

    def target(i: int) -> None:
        while True:
            try:
                backend, refs, left = work.get_nowait()
            except queue.Empty:
                return
            start = time.perf_counter()
            conns[i].run(queries.JOIN_SQL, refs=refs, leftover=left, backend=backend)
            seconds[i] += time.perf_counter() - start

    try:
        cpu0, own0 = server_cpu(postmaster), sum(process_cpu(p) for p in pids)
        start = time.perf_counter()
        passes = 0
        while passes < min_passes or time.perf_counter() - start < min_seconds:
            for a in args:
                work.put(a)
            workers = [threading.Thread(target=target, args=(i,)) for i in range(threads)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            passes += 1
        wall = time.perf_counter() - start
        cpu, own = server_cpu(postmaster) - cpu0, sum(process_cpu(p) for p in pids) - own0
    finally:
        for c in conns:
            c.close()
    return Floor(wall / passes, sum(seconds) / passes, cpu / passes, own / passes, len(batches), passes)


# ---- one size ---------------------------------------------------------------------------------------


@dataclass
class SizeResult:
    size: Size
    cycles: list[Cycle]
    floor: Floor
    orphans: int
    deleted: int
    setup_seconds: float


def _measure_size(server: PgServer, size: Size, cfg: Config) -> SizeResult:
    db = server.fresh_database("oc_bench_fleet")
    try:
        t0 = time.perf_counter()
        clouds = _seed(db, size)
        setup = time.perf_counter() - t0
        postmaster = server_pid(db)
        settings = Settings.model_validate({"ORPHAN_CLEANUP_MODE": "delete", "ORPHAN_CLEANUP_CONFIRM_SECONDS": 0}
                                           if cfg.delete else {"ORPHAN_CLEANUP_MODE": "report"})
        cycles = []
        for _ in range(2 if cfg.delete else 1):
            _make_due(db)
            cycles.append(_run_cycle(db, clouds, size, cfg, settings, postmaster))
        errors = [e for c in cycles for e in c.errors]
        if errors:
            raise RuntimeError(f"fleet cycle failed at {size.backends} backends: {errors[:3]}")
        floor = _floor(db, [b for c in cycles for b in c.batches], cfg.classifiers, postmaster)
        with db.connection() as conn:
            orphans = int(conn.run("SELECT count(*) FROM orphans")[0][0])
        deleted = sum(len(c.deleted) for c in clouds.values())
        result = SizeResult(size, cycles, floor, orphans, deleted, setup)
        _check(result, cfg)
        return result
    finally:
        server.drop(db)


def _check(r: SizeResult, cfg: Config) -> None:
    """A broken model must not pass: every leaked VM found, nothing else."""
    size, first = r.size, r.cycles[0]
    assert first.groups == size.vms, f"listed {first.groups} groups of {size.vms} VMs"
    assert r.orphans == size.leaked, f"{r.orphans} orphans recorded, {size.leaked} VMs leaked"
    assert first.orphan_verdicts == size.leaked, f"{first.orphan_verdicts} orphan verdicts, {size.leaked} leaked"
    if cfg.delete:  # each leaked VM's instance and root volume
        assert r.deleted == 2 * size.leaked, f"{r.deleted} resources deleted, {size.leaked} VMs leaked"
    else:
        assert r.deleted == 0, f"report mode deleted {r.deleted} resources"


# ---- the tables -------------------------------------------------------------------------------------


def figures(r: SizeResult) -> dict[str, Any]:
    """The figures of one size (every cycle of it summed), keyed by column."""
    n = r.size.backends
    phases = {p: PhaseStats() for p in PHASES}
    wall = cpu = 0.0
    peak = 0
    for c in r.cycles:
        wall += c.wall
        cpu += c.server_cpu
        peak = max(peak, c.meter.peak)
        for p, s in c.meter.phases.items():
            phases[p].statements += s.statements
            phases[p].db_seconds += s.db_seconds
            phases[p].connections += s.connections
            phases[p].backend_cpu += s.backend_cpu
            phases[p].started = 0.0
            phases[p].ended = (phases[p].ended or 0.0) + s.span()
    statements = sum(s.statements for s in phases.values())
    out: dict[str, Any] = {"backends": n, "accounts": r.size.accounts, "VMs": r.size.vms,
                           "cycles": len(r.cycles), "wall s": wall}
    for p in PHASES:
        out[f"{p} wall s"] = phases[p].span()
        out[f"{p} DB s"] = phases[p].db_seconds
        out[f"{p} stmts/backend"] = phases[p].statements / n
        out[f"{p} CPU s"] = phases[p].backend_cpu
    out |= {"stmts/backend": statements / n, "statements": statements,
            "connections opened": sum(s.connections for s in phases.values()), "peak connections": peak,
            "server CPU s": cpu, "floor CPU s": r.floor.server_cpu,
            "CPU x floor": cpu / r.floor.server_cpu if r.floor.server_cpu > 0 else None,
            "other CPU s": cpu - sum(s.backend_cpu for s in phases.values()),
            "floor backends CPU s": r.floor.backend_cpu,
            "classify CPU x floor": (phases["classify"].backend_cpu / r.floor.backend_cpu
                                     if r.floor.backend_cpu > 0 else None),
            "floor wall s": r.floor.wall, "floor DB s": r.floor.db_seconds, "floor passes": r.floor.passes,
            "orphans": r.orphans, "leaked": r.size.leaked, "deleted": r.deleted, "setup s": r.setup_seconds}
    return out


def _tables(cfg: Config, results: list[SizeResult]) -> list[Table]:
    mode = ("delete mode, confirm window 0, two cycles" if cfg.delete
            else "report mode, one cycle")
    caps = f"{cfg.listers} listers, {cfg.classifiers} classifiers, {cfg.deleters} deleters"
    rows = [figures(r) for r in results]
    time_t = Table(f"Fleet cycle: wall and DB time per phase ({mode}; {caps})",
                   ["backends", "accounts", "VMs", "wall s"] + [f"{p} {k}" for p in PHASES for k in ("wall s", "DB s")])
    stmt_t = Table(f"Fleet cycle: statements and connections ({mode})",
                   ["backends", "statements", "stmts/backend"] + [f"{p} stmts/backend" for p in PHASES]
                   + ["connections opened", "peak connections", "orphans", "leaked", "deleted"])
    cpu_t = Table(f"Fleet cycle: the database server's CPU against the classifier's join alone ({mode})",
                  ["backends", "server CPU s", "floor CPU s", "CPU x floor"] + [f"{p} CPU s" for p in PHASES]
                  + ["other CPU s", "floor backends CPU s", "classify CPU x floor", "floor wall s", "floor DB s",
                     "floor passes"])
    for row in rows:
        time_t.add(**row)
        stmt_t.add(**row)
        cpu_t.add(**row)
    sizes = ", ".join(f"{r.size.backends:,} backends ({r.size.accounts:,} account{'s' if r.size.accounts > 1 else ''}, "
                      f"{r.size.vms:,} VMs)" for r in results)
    s0 = results[0].size
    time_t.notes += [
        f"sizes: {sizes}; per account {s0.regions} regions, {s0.backends_per_account} backends (each lists one "
        f"region: one listing per backend), {s0.vms_per_account:,} VMs (instance + root volume), "
        f"{200 / LEAK_EVERY:g}% leaked (terminated owner, or owner row gone)",
        "the phases overlap as deployed (classifiers take batches as listers publish them): a phase's wall is its "
        "span; DB s = time inside its statements (pg8000's run, as the client sees it: the round trip, the "
        "server's work, and waits for the GIL while other threads run Python), summed over its threads",
        "setup (clouds, ledger by SQL, VACUUM ANALYZE), not counted: "
        + ", ".join(f"{r.setup_seconds:.1f} s" for r in results),
    ]
    stmt_t.notes += [
        f"peak connections: opened minus closed, highest at any time; goal <= caps + "
        f"{GOAL_CONNECTIONS_OVER_CAPS} = {cfg.caps + GOAL_CONNECTIONS_OVER_CAPS} (one idle connection kept per "
        "thread, as the deployed functions keep theirs; each thread closes its own at its end)",
        "orphans: rows of the orphans table after the run, asserted equal to the leaked VMs",
    ]
    if cfg.delete:
        stmt_t.notes.append("two cycles summed; deleter outcomes per cycle: " + "; ".join(
            f"{r.size.backends} backends: " + " / ".join(str(c.deletes or "none") for c in r.cycles)
            for r in results) + "; deleted = cloud resources deleted (instance and root volume of each leaked VM)")
    cpu_t.notes += [
        "server CPU: utime+stime of the postmaster and all its children (reaped ones included) over the cycle(s), "
        "/proc; background processes (checkpointer, autovacuum) included",
        "<phase> CPU s: utime+stime of the server processes serving that phase's connections (read as each "
        "closes); other = server CPU less the phases' (postmaster, background processes, connection ends); "
        "/proc counts in 10 ms ticks per process, so small figures are coarse (a negative other is that rounding)",
        f"floor: queries.JOIN_SQL alone on the cycle's batches (the same groups, one statement a batch), "
        f"{cfg.classifiers} threads on open connections, after the cycle (warm cache), per pass (mean of the "
        f"passes); goal: CPU x floor <= {GOAL_CPU_RATIO}; classify CPU x floor: the classifier's connections' "
        "server processes against the floor's",
    ]
    tables = [time_t, stmt_t, cpu_t]
    if len(rows) >= 2:
        tables.append(_growth(rows[0], rows[-1]))
    tables.append(_statements(results[0], results[-1]))
    return tables


def _by_sql(r: SizeResult) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for c in r.cycles:
        for key, (n, secs) in c.meter.by_sql.items():
            seen = out.setdefault(key, [0, 0.0])
            seen[0] += n
            seen[1] += secs
    return out


def _statements(small: SizeResult, large: SizeResult) -> Table:
    """The statements with the most DB time at the larger size, against the smaller."""
    a, b = _by_sql(small), _by_sql(large)
    na, nb = small.size.backends, large.size.backends
    t = Table(f"Fleet cycle: the {TOP_STATEMENTS} statements with the most DB time at {nb:,} backends "
              f"(against {na:,})", ["phase", "statement", f"calls/backend at {na:,}", f"calls/backend at {nb:,}",
                                   f"ms/call at {na:,}", f"ms/call at {nb:,}", f"DB s at {nb:,}"])
    for key, (n, secs) in sorted(b.items(), key=lambda kv: -kv[1][1])[:TOP_STATEMENTS]:
        n0, secs0 = a.get(key, (0, 0.0))
        t.add(**{"phase": key[0], "statement": key[1], f"calls/backend at {na:,}": n0 / na,
                 f"calls/backend at {nb:,}": n / nb, f"ms/call at {na:,}": secs0 / n0 * 1000 if n0 else None,
                 f"ms/call at {nb:,}": secs / n * 1000, f"DB s at {nb:,}": secs})
    t.notes.append(f"a statement is its first {SQL_CHARS} characters; ms/call as the client sees it (GIL waits "
                   "included, see the first table)")
    return t


GROWN = ("wall s", "tick wall s", "listing wall s", "classify wall s", "delete wall s", "tick DB s", "listing DB s",
         "classify DB s", "delete DB s", "statements", "stmts/backend", "connections opened", "peak connections",
         "server CPU s", "listing CPU s", "classify CPU s", "floor CPU s", "CPU x floor", "classify CPU x floor",
         "orphans")


def _growth(small: dict[str, Any], large: dict[str, Any]) -> Table:
    k = large["backends"] / small["backends"]
    t = Table(f"Fleet cycle: growth from {small['backends']:,} to {large['backends']:,} backends (x{k:g} backends)",
              ["figure", f"at {small['backends']:,}", f"at {large['backends']:,}", "growth", "verdict"])
    for name in GROWN:
        a, b = small.get(name), large.get(name)
        if not a or b is None:
            t.add(figure=name, **{f"at {small['backends']:,}": a, f"at {large['backends']:,}": b})
            continue
        g = b / a
        per_backend = name in ("stmts/backend", "CPU x floor", "classify CPU x floor")
        verdict = ("flat or better" if g <= 1.1 else "grows") if per_backend or name == "peak connections" \
            else ("linear or better" if g <= k * 1.1 else "worse than linear")
        t.add(**{"figure": name, f"at {small['backends']:,}": a, f"at {large['backends']:,}": b, "growth": g,
                 "verdict": verdict})
    t.notes.append(f"growth = figure at the larger size / at the smaller; linear = x{k:g} (per-backend figures, "
                   "ratios and peak connections: flat); 10% of slack for noise")
    return t


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 and 100 backends (default: 100 and 1,000)")
    p.add_argument("--mode", choices=(*MODES, "both"), default="both",
                   help="report (one cycle), delete (two cycles, confirm window 0) or both (default)")
    args = p.parse_args(argv)
    print_tables(lambda: run(PgServer(), quick=args.quick, modes=MODES if args.mode == "both" else (args.mode,)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
