"""Benchmark 5: where ``handle_batch`` spends its time, before and after.

cProfile over ``Pipeline.handle_batch`` of 10k-group batches against a 100k-ref
ledger, with the code of caf2dda (``legacy``) and the shipped code, in the
same run. Own time (cProfile's ``tottime``) is summed into hot-spot buckets;
absolute figures are inflated by the profiler, the shares are what matter.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
from collections import defaultdict

from bench import ledger_data as data
from bench.classifier import Bench, Config
from bench.common import PgServer, Table, median
from orphan_cleanup.cycle.pipeline import Pipeline

#: handle_batch without its gc pause (the profile and the gc table vary the collector themselves).
handle = Pipeline.handle_batch.__wrapped__  # type: ignore[attr-defined]

LEDGER = 100_000
BATCH = 10_000
REPS = 3

# (bucket, predicate on "file:function") in match order.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("timestamptz decode (pg8000 strptime)", ("_strptime", "timestamptz_in", "locale.py", "strptime",
                                              "converters.py:timestamp")),
    ("waiting for Postgres (socket)", ("recv_into", "sendall", "_flush")),
    ("parameter encode (pg8000 arrays)", ("converters.py:array", "converters.py:make_param", "array_string_escape",
                                          "converters.py:_", "converters.py:<genexpr>")),
    ("row decode (pg8000)", ("pg8000/core.py", "pg8000/native.py", "_read")),
    ("records: LedgerRecord validation", ("validate_json", "queries.py", "legacy.py:record_from_row",
                                          "legacy.py:load_records")),
    ("classify (classify.py, Verdict models)", ("classify.py",)),
    ("payload rows (classify_batch, model_dump)", ("build_payload", "to_python", "model_dump", "models.py:key",
                                                  "classifier.py:<listcomp>", "legacy.py:<listcomp>",
                                                  "classifier.py:<genexpr>", "legacy.py:<genexpr>",
                                                  "classifier.py:<dictcomp>", "classify_batch.py:", "decisions.py:",
                                                  "store.py:apply_payload", "store.py:row", "store.py:<listcomp>")),
    ("payload json.dumps", ("json/encoder.py", "json/__init__.py")),
    ("reporting (log lines)", ("logging/", "reporting.py")),
]


# Helpers used by several buckets: charged to whoever called them.
GENERIC = ("validate_python", "pydantic/main.py:__init__", "enum.py", "functools.py")


def bucket_of(key: str) -> str:
    for name, needles in BUCKETS:
        if any(n in key for n in needles):
            return name
    return "other"


def _key(file: str, func: str) -> str:
    return f"{file}:{func}"


def own_time_by_bucket(stats: pstats.Stats) -> dict[str, float]:
    """Own time per bucket. Shared helpers (builtins such as ``list.append``,
    pydantic's ``__init__``/``validate_python``, ``enum`` properties) are
    charged to their callers' buckets, in proportion to the time each caller
    spent in them, up to three levels up."""
    raw = stats.stats  # type: ignore[attr-defined]
    out: dict[str, float] = defaultdict(float)

    def charge(fn: tuple[str, int, str], amount: float, depth: int) -> None:
        file, _line, func = fn
        bucket = bucket_of(_key(file, func))
        generic = bucket == "other" and (file == "~" or any(g in _key(file, func) for g in GENERIC))
        callers = raw.get(fn, (0, 0, 0, 0, {}))[4]
        if not generic or depth >= 3 or not callers:
            out[bucket] += amount
            return
        shares = {c: v[2] for c, v in callers.items()}
        total = sum(shares.values()) or 1.0
        for caller, share in shares.items():
            charge(caller, amount * share / total, depth + 1)

    for fn, (_cc, _nc, tt, _ct, _callers) in raw.items():
        if not _skip(fn[0], fn[2]):
            charge(fn, tt, 0)
    return out


def _skip(file: str, func: str) -> bool:
    return ("bench/classifier.py" in file or "bench/common.py" in file or "_lsprof.Profiler" in func
            or "gc.collect" in func)


def profile_variant(bench: Bench, before: bool) -> tuple[dict[str, float], float, list[tuple[str, int, float]]]:
    cycle_id, listed_at = bench.start_cycle()
    warm, _ = bench.batch(cycle_id, listed_at, LEDGER, BATCH)
    bench.handle(warm, before=before)
    prof = cProfile.Profile()
    for _ in range(REPS):
        b, _ = bench.batch(cycle_id, listed_at, LEDGER, BATCH)
        gc.collect()  # a full collection left pending by the setup would land inside the profile
        prof.enable()
        bench.handle(b, before=before)
        prof.disable()
        del b
    stats = pstats.Stats(prof)
    buckets = {k: v / REPS for k, v in own_time_by_bucket(stats).items()}
    funcs: list[tuple[str, int, float]] = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if _skip(file, func):
            continue
        short = f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}({func})"
        funcs.append((short, nc // REPS, tt / REPS))
    funcs.sort(key=lambda f: -f[2])
    return buckets, sum(buckets.values()), funcs[:10]


def gc_share(bench: Bench) -> dict[str, dict[bool, float]]:
    """Parse and handle_batch of 10k-group batches with the cyclic GC on (default
    thresholds) and off, interleaved: what allocation-driven collections cost."""
    from orphan_cleanup.core.messages import ListingBatch

    cycle_id, listed_at = bench.start_cycle()
    out: dict[str, dict[bool, list[float]]] = {"parse": {True: [], False: []}, "handle": {True: [], False: []}}
    for k in range(2 * REPS):
        enabled = k % 2 == 0
        b, _ = bench.batch(cycle_id, listed_at, LEDGER, BATCH)
        raw = b.model_dump_json()
        del b
        gc.collect()
        if not enabled:
            gc.disable()
        try:
            start = time.perf_counter()
            batch = ListingBatch.model_validate_json(raw)
            out["parse"][enabled].append(time.perf_counter() - start)
            start = time.perf_counter()
            handle(bench.pipeline, batch)  # unwrapped: the collector is what this table varies
            out["handle"][enabled].append(time.perf_counter() - start)
        finally:
            gc.enable()
    return {k: {e: median(v) for e, v in d.items()} for k, d in out.items()}


def run(server: PgServer, quick: bool = False) -> list[Table]:
    bench = Bench(server, Config(before=True))
    try:
        data.populate(bench.db, 0, LEDGER)
        before, total_b, _ = profile_variant(bench, before=True)
        after, total_a, top_after = profile_variant(bench, before=False)
        gcs = gc_share(bench)
    finally:
        bench.close()
    spots = Table(f"Profile: handle_batch of one {BATCH:,}-group batch, {LEDGER:,}-ref ledger, own time by hot spot "
                  "(cProfile ms per batch)",
                  ["hot spot", "v0 (caf2dda) ms", "shipped ms", "v0 share", "shipped share", "saved ms"])
    names = [n for n, _ in BUCKETS] + ["other"]
    for name in sorted(names, key=lambda n: -before.get(n, 0.0)):
        b, a = before.get(name, 0.0) * 1000, after.get(name, 0.0) * 1000
        spots.add(**{"hot spot": name, "v0 (caf2dda) ms": b, "shipped ms": a,
                     "v0 share": f"{b / (total_b * 1000):.0%}", "shipped share": f"{a / (total_a * 1000):.0%}",
                     "saved ms": b - a})
    spots.add(**{"hot spot": "total", "v0 (caf2dda) ms": total_b * 1000, "shipped ms": total_a * 1000,
                 "v0 share": "100%", "shipped share": "100%", "saved ms": (total_b - total_a) * 1000})
    spots.notes.append(f"mean of {REPS} profiled batches per version after a warm-up (gc.collect() before each); "
                       "profiler overhead inflates Python-heavy buckets.")
    top = Table("Profile: top functions of the shipped handle_batch by own time (cProfile ms per batch)",
                ["function", "calls", "own ms"])
    for func, calls, tt in top_after:
        top.add(function=func, calls=calls, **{"own ms": tt * 1000})
    gct = Table(f"Cyclic GC: one {BATCH:,}-group batch with the collector on (default thresholds, the baseline) "
                "and off (what python_gc.paused_gc ships; no profiler, median ms)",
                ["step", "gc on ms", "gc off ms", "gc share"])
    for step, label in (("parse", "ListingBatch.model_validate_json (queue body)"),
                        ("handle", "Pipeline.handle_batch (shipped, its pause unwrapped)")):
        on, off = gcs[step][True] * 1000, gcs[step][False] * 1000
        gct.add(step=label, **{"gc on ms": on, "gc off ms": off, "gc share": f"{max(0.0, 1 - off / on):.0%}"})
    gct.notes += ["the share depends on the whole heap (this process also loaded moto, boto3 and the Google "
                  "clients for the other benchmarks): a generation-2 pass walks every live object.",
                  "shipped: the classifier entry points and Pipeline.handle_batch pause the collector over a "
                  "batch (orphan_cleanup.cycle.python_gc); its objects are acyclic and freed by reference counting."]
    return [spots, top, gct]
