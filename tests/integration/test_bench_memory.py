"""The memory benchmark measures what it says: a row per invocation, full messages, an
applied batch and a deleted group, each above its handler's import baseline.

Behaviour only; memory and time figures are the benchmark's business, never a test's."""

from __future__ import annotations

import pytest

from bench import memory
from bench.common import PgServer


@pytest.mark.slow  # children that import the handlers, a 100k-ref ledger (~10 s)
def test_quick_memory_bench_has_a_row_per_invocation_at_full_messages(pg_server):
    # when the memory benchmark runs (one child per figure)
    (table,) = memory.run(PgServer(pg_server), quick=True)
    rows = {(r["handler"], r["invocation"]): r for r in table.rows}
    memory_mb, batch_size = memory.template_figures()
    baselines = {h: r for (h, title), r in rows.items() if title.startswith("import baseline")}
    classifier = [r for (h, _), r in rows.items() if h == "classifier" and r["records"] is not None]
    deleter = [r for (h, _), r in rows.items() if h == "deleter" and r["records"] is not None]
    # then it has the interpreter floor, a baseline per handler and every invocation
    assert set(baselines) == {"classifier", "deleter"}
    assert len(classifier) == 3 and len(deleter) == 2 and len(table.rows) == 8
    # and the classifier's messages are full: within 10% below SQS's 256 KiB, never above, and applied
    at_limit = [r for r in classifier if "SQS limit" in r["invocation"]]
    assert len(at_limit) == 2
    assert all(0.9 * 256 * 1024 <= r["message bytes"] <= 256 * 1024 for r in at_limit)
    assert sorted(r["records"] for r in classifier) == [1, 1, batch_size]
    assert all(r["outcome"] == "applied" and r["groups"] > 0 for r in classifier)
    # and the deleter's request deleted its group
    assert all(r["outcome"] == "deleted" for r in deleter)
    # and every invocation's peak is above its handler's import baseline, at the template's memory size
    for r in classifier + deleter:
        assert r["peak MiB"] > baselines[r["handler"]]["peak MiB"]
        assert r["over import MiB"] > 0 and r["memory MiB"] == memory_mb
        assert r["headroom x"] == memory_mb / r["peak MiB"]
        assert r["fits 2x"] == ("yes" if r["peak MiB"] <= memory_mb / 2 else "no")
