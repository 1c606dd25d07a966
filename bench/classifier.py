"""Benchmark 1: the classifier (STEP 3-6) on real Postgres.

Drives the real ``Pipeline.handle_batch`` with real ``ListingBatch`` messages
of a scheduled cycle (``start_cycle(..., manual=False)``: ``record_all`` off,
report mode) against ledgers of 10k, 100k and 1M refs built with
``generate_series`` (see ``ledger_data``). Every figure is a median over
several batches, measured interleaved with its baselines:

- the floor: the shipped ``JOIN_SQL`` alone, fetched with pg8000 on an open
  connection (no classification, no apply);
- "before": ``handle_batch`` with the join and ``build_payload`` of commit
  caf2dda (``legacy``), and its own floor (the row-per-ref join).

Statements are counted by a proxy around the connection's ``run``; opening the
connection (startup + ``SET statement_timeout``) is counted apart.

A full ``gc.collect()`` precedes every timed sample: otherwise a generation-2
collection over the whole heap (hundreds of ms with the bench's batches alive)
lands in a random sample and says more about the heap than about the code.
"""

from __future__ import annotations

import gc
import logging
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench import floors, legacy
from bench import ledger_data as data
from bench.common import CountingDatabase, PgServer, StatementCounter, Table, median
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.policy import classify_context, limits_for
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle import cycle_state
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.python_gc import paused_gc
from orphan_cleanup.cycle.reporting import Reporter
from orphan_cleanup.ledger import queries
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.session import apply_payload
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.queues.base import MAX_MESSAGE_BYTES
from orphan_cleanup.queues.memory import InProcessQueue

NAME = "classifier"


@dataclass
class Config:
    ledgers: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    batch_sizes: tuple[int, ...] = (1_000, 10_000)
    reps: dict[int, int] = field(default_factory=lambda: {1_000: 15, 10_000: 5})
    message_batch: bool = True  # also the largest batch the lister puts in one queue message
    before: bool = True  # also measure the code of caf2dda in the same run
    floor_variants: bool = True


def quiet_reporter() -> Reporter:
    """A reporter whose log lines go nowhere (but are still formatted as in production)."""
    logger = logging.getLogger("bench.quiet")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.setLevel(logging.INFO)
    return Reporter(logger)


class TimedConnection:
    """Counts and times each statement, by kind (backend, join, apply)."""

    def __init__(self, conn: Any, probe: Probe) -> None:
        self._conn, self._probe = conn, probe

    def run(self, sql: str, *a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._conn.run(sql, *a, **kw)
        finally:
            self._probe.statement(sql, time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class Probe(CountingDatabase):
    """A ``Database`` that counts connections and statements and times both."""

    def __init__(self, db: Database) -> None:
        super().__init__(db.info, StatementCounter())
        # As the deployed functions open it (bootstrap): a warm function reuses its connection.
        self.keep_idle = True
        self.times: dict[str, float] = defaultdict(float)

    def statement(self, sql: str, seconds: float) -> None:
        self.counter.statements += 1
        kind = ("join" if "provider_refs r" in sql else "apply" if "oc_apply_batch" in sql
                else "backend" if "FROM backends" in sql else "other")
        self.times[kind] += seconds

    def connect(self) -> Any:
        start = time.perf_counter()
        conn = Database.connect(self)
        self.times["connect"] += time.perf_counter() - start
        self.counter.connections += 1
        return TimedConnection(conn, self)

    def reset(self) -> None:
        self.counter.reset()
        self.times.clear()


def message_batch_size(n_refs: int) -> int:
    """How many groups of this shape the lister packs into one queue message."""
    groups = data.make_groups(n_refs, 2_000, random.Random(0))
    limit = MAX_MESSAGE_BYTES - 4096
    size = n = 0
    for g in groups:
        size += len(g.model_dump_json()) + 1
        if size > limit:
            break
        n += 1
    return n


def _split(groups: list) -> tuple[str, str]:
    # As load_records passes them (a set, in no order), without its check of each ref.
    refs = {g.provider_ref for g in groups}
    left = {g.provider_ref for g in groups if g.primary_id is None}
    return ",".join(refs), ",".join(left)


def floor_shipped(conn: Any, groups: list) -> Any:
    refs, left = _split(groups)
    return conn.run(queries.JOIN_SQL, refs=refs, leftover=left, backend=data.BACKEND)


def floor_before(conn: Any, groups: list) -> Any:
    refs = sorted({g.provider_ref for g in groups})
    left = sorted({g.provider_ref for g in groups if g.primary_id is None})
    return conn.run(legacy.JOIN_SQL, refs=refs, leftover=left, backend=data.BACKEND)


class Bench:
    def __init__(self, server: PgServer, cfg: Config) -> None:
        self.server, self.cfg = server, cfg
        self.db = server.fresh_database("oc_bench_classifier")
        self.probe = Probe(self.db)
        self.settings = Settings()
        self.pipeline = Pipeline(settings=self.settings, db=self.probe, provider_for=_no_provider,
                                 listing_queue=InProcessQueue(), delete_queue=InProcessQueue(),
                                 reporter=quiet_reporter())
        self.rng = random.Random(10)
        self.seq = 0
        self.checked = 0  # groups whose records and payload both decoders agreed on
        self.conn = self.db.connect()
        data.add_backend(self.db)

    def close(self) -> None:
        self.conn.close()
        self.probe.close()  # its idle connection, before the database is dropped
        self.server.drop(self.db)

    def start_cycle(self) -> tuple[str, datetime]:
        with self.db.transaction() as conn:  # the previous size's cycle is still open: release it
            conn.run("UPDATE cycles SET outcome = 'failed', finished_at = now() WHERE outcome IS NULL")
            conn.run("UPDATE cleanup SET lease_owner = NULL, lease_expires_at = NULL, clean_at = NULL")
        with self.db.connection() as conn:
            backend = queries.get_backend(conn, data.BACKEND)
        limits = limits_for(self.settings, backend)
        started = cycle_state.start_cycle(LedgerStore(self.db), data.BACKEND, "report", limits, manual=False)
        assert started.cycle is not None, started.reason
        listed_at = datetime.now(UTC)
        cycle_state.set_listed_at(LedgerStore(self.db), started.cycle.id, listed_at)
        return started.cycle.id, listed_at

    def batch(self, cycle_id: str, listed_at: datetime, n_refs: int, size: int) -> tuple[ListingBatch, float]:
        groups = data.make_groups(n_refs, size, self.rng)
        raw = ListingBatch(cycle_id=cycle_id, backend=data.BACKEND, seq=self.seq, listed_at=listed_at,
                           mode="report", record_all=False, groups=tuple(groups)).model_dump_json()
        self.seq += 1
        gc.collect()  # see module docstring
        start = time.perf_counter()
        with paused_gc():  # as the classifier entry points decode a queue body
            batch = ListingBatch.model_validate_json(raw)
        return batch, time.perf_counter() - start

    def handle(self, batch: ListingBatch, *, before: bool, pydantic: bool = False) -> dict[str, Any]:
        """``before``: the code of caf2dda; ``pydantic``: the shipped code with the records
        decoded by pydantic, as before msgspec (the reference, reachable from the bench only)."""
        self.probe.reset()
        gc.collect()  # see module docstring
        start = time.perf_counter()
        if before:
            with legacy.installed():
                result = self.pipeline.handle_batch(batch)
        elif pydantic:
            with pydantic_records():
                result = self.pipeline.handle_batch(batch)
        else:
            result = self.pipeline.handle_batch(batch)
        total = time.perf_counter() - start
        assert result.status == "applied", result
        t = dict(self.probe.times)
        sql = sum(t.values())
        return {"total": total, "statements": self.probe.counter.statements,
                "connections": self.probe.counter.connections, "connect": t.get("connect", 0.0),
                "backend": t.get("backend", 0.0), "join": t.get("join", 0.0), "apply": t.get("apply", 0.0),
                "python": total - sql, "verdicts": result.verdicts}

    def check_decoders(self, batch: ListingBatch, listed_at: datetime) -> None:
        """The shipped record decoder (msgspec) against the pydantic one it replaced, on
        this batch's join: equal records, and so equal verdicts and an equal payload."""
        refs, left = _split(list(batch.groups))
        doc = floor_shipped(self.conn, list(batch.groups))[0][0]
        fast = {r.provider_ref: r for r in queries.records_from_json(doc)}
        slow = {r.provider_ref: r for r in floors._RECORDS.validate_json(doc)}
        assert fast.keys() == slow.keys() and all(
            floors.fields(fast[k]) == floors.fields(v) and floors._types(fast[k]) == floors._types(v)
            for k, v in slow.items())
        backend = queries.get_backend(self.conn, data.BACKEND)
        ctx = classify_context(self.settings, backend, listed_at, limits_for(self.settings, backend),
                               listed=ListedInstances(batch.groups, backend.settings.tag_key))
        payloads = [apply_payload(classify_batch(batch, recs, ctx, mode="report", record_all=False))
                    for recs in (fast, slow)]
        assert payloads[0] == payloads[1], "the msgspec records changed a verdict or the payload"
        self.checked += len(batch.groups)

    def timed_floor(self, fn: Any, groups: list) -> float:
        gc.collect()
        start = time.perf_counter()
        fn(self.conn, groups)
        return time.perf_counter() - start

    def measure(self, n_refs: int, size: int, reps: int) -> dict[str, Any]:
        cycle_id, listed_at = self.start_cycle()
        variants = ["after", "pydantic", "before"] if self.cfg.before else ["after", "pydantic"]
        samples: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        floors: dict[str, list[float]] = {v: [] for v in variants}
        parse: list[float] = []
        for v in variants:  # warm-up: plans, caches, imports
            b, _ = self.batch(cycle_id, listed_at, n_refs, size)
            self.check_decoders(b, listed_at)  # before any timing
            self.handle(b, before=v == "before", pydantic=v == "pydantic")
        for k in range(reps):
            order = variants if k % 2 == 0 else variants[::-1]
            for v in order:
                b, p = self.batch(cycle_id, listed_at, n_refs, size)
                parse.append(p)
                fl = floor_before if v == "before" else floor_shipped
                if k % 2:
                    floors[v].append(self.timed_floor(fl, list(b.groups)))
                    samples[v].append(self.handle(b, before=v == "before", pydantic=v == "pydantic"))
                else:
                    samples[v].append(self.handle(b, before=v == "before", pydantic=v == "pydantic"))
                    floors[v].append(self.timed_floor(fl, list(b.groups)))
        out: dict[str, Any] = {"parse": median(parse), "verdicts": samples["after"][-1]["verdicts"]}
        for v in variants:
            s = samples[v]
            out[v] = {key: median([x[key] for x in s]) for key in
                      ("total", "connect", "backend", "join", "apply", "python")}
            out[v]["statements"] = max(x["statements"] for x in s)
            out[v]["connections"] = max(x["connections"] for x in s)
            out[v]["floor"] = median(floors[v])
        return out


@contextmanager
def pydantic_records() -> Iterator[None]:
    """The shipped join with its records validated by pydantic (the decoder msgspec replaced)."""
    real = queries.records_from_json
    queries.records_from_json = floors._RECORDS.validate_json  # type: ignore[assignment]
    try:
        yield
    finally:
        queries.records_from_json = real


def _no_provider(_backend: Any) -> Any:
    raise AssertionError("the classifier makes no provider call")


def run(server: PgServer, cfg: Config | None = None) -> list[Table]:
    cfg = cfg or Config()
    bench = Bench(server, cfg)
    main = Table("Classifier: join + classify + apply per batch (real Postgres, report mode, record_all off)",
                 ["ledger refs", "batch groups", "code", "groups/s", "ms/batch", "speed-up", "floor ms", "x floor",
                  "x v0 floor", "stmts/batch", "conns/batch"])
    parts = Table("Classifier: where one batch's time goes (median ms; python = records + classify + payload + log)",
                  ["ledger refs", "batch groups", "code", "connect", "get_backend", "join+fetch", "python", "apply",
                   "parse msg"])
    floors_t = Table("Classifier floor: the STEP 3 join alone on an open connection, by shape (median ms)",
                     ["ledger refs", "batch groups", "shape", "fetch ms", "+ records ms", "x v0"])
    built = 0
    build_notes = []
    try:
        for n_refs in cfg.ledgers:
            start = time.perf_counter()
            data.populate(bench.db, built, n_refs)
            build_notes.append(f"{n_refs - built:,} refs in {time.perf_counter() - start:.1f} s")
            built = n_refs
            sizes = list(cfg.batch_sizes)
            if cfg.message_batch:
                sizes.insert(0, message_batch_size(n_refs))
            for size in sizes:
                reps = cfg.reps.get(size, 15)
                m = bench.measure(n_refs, size, reps)
                v0_floor = m["before"]["floor"] if "before" in m else None
                for code in ("after", "pydantic", "before"):
                    if code not in m:
                        continue
                    r = m[code]
                    label = {"after": "shipped", "pydantic": "pydantic records", "before": "v0 (caf2dda)"}[code]
                    speedup = m["before"]["total"] / r["total"] if code == "after" and "before" in m else None
                    main.add(**{"ledger refs": n_refs, "batch groups": size, "code": label,
                                "groups/s": size / r["total"], "ms/batch": r["total"] * 1000, "speed-up": speedup,
                                "floor ms": r["floor"] * 1000, "x floor": r["total"] / r["floor"],
                                "x v0 floor": r["total"] / v0_floor if v0_floor else None,
                                "stmts/batch": r["statements"], "conns/batch": r["connections"]})
                    parts.add(**{"ledger refs": n_refs, "batch groups": size, "code": label,
                                 "connect": r["connect"] * 1000, "get_backend": r["backend"] * 1000,
                                 "join+fetch": r["join"] * 1000, "python": r["python"] * 1000,
                                 "apply": r["apply"] * 1000, "parse msg": m["parse"] * 1000})
            if cfg.floor_variants:
                size = max(cfg.batch_sizes)
                fv = floors.measure(bench.conn, n_refs, size, max(3, cfg.reps.get(size, 5)), bench.rng)
                base = fv["v0 rows, timestamptz"]["records"]
                for name, r in fv.items():
                    floors_t.add(**{"ledger refs": n_refs, "batch groups": size, "shape": name,
                                    "fetch ms": r["fetch"] * 1000, "+ records ms": r["records"] * 1000,
                                    "x v0": r["records"] / base})
    finally:
        bench.close()
    main.notes += [
        "speed-up = v0 ms/batch / shipped ms/batch, same batch sizes, interleaved in this run.",
        "floor = the same code's JOIN_SQL alone, fetched with pg8000 on an open connection; "
        "x v0 floor = against the join of caf2dda (row per ref, timestamptz decoded in Python).",
        f"batch mix: {dict(data.BATCH_MIX)}; the first batch size is the most the lister puts in one "
        f"queue message ({MAX_MESSAGE_BYTES // 1024} KiB).",
        "stmts = statements on the connection (get_backend, join, apply); conns = connections opened "
        "(startup + SET statement_timeout): 0 once warm, the pipeline's Database keeps its idle connection "
        "(keep_idle, as bootstrap opens it for the functions).",
        "ledger built with generate_series: " + "; ".join(build_notes),
        f"records: msgspec (queries.records_from_json); checked equal to the pydantic decoder, with equal "
        f"verdicts and apply payloads, on {bench.checked:,} groups of this run before timing.",
    ]
    parts.notes.append("parse msg = ListingBatch.model_validate_json of the queue body under paused_gc, as the "
                       "entry points decode it (the profile bench has it with the collector on); before handle_batch, "
                       "not in ms/batch).")
    floors_t.notes.append("+ records = fetch and turn into {ref: LedgerRecord}; every shape returns equal records.")
    return [main, parts, floors_t] if cfg.floor_variants else [main, parts]
