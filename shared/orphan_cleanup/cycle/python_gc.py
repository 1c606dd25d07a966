"""Pausing Python's cyclic garbage collector over one batch (docs/PERFORMANCE.md, the classifier).

Decoding and classifying a 10k-group batch allocates a few hundred thousand objects
(models, dicts, strings) that reference counting frees as soon as the batch is done:
they hold no reference cycles. With the collector on, those allocations trigger
collections, and each generation-2 pass walks every live object of the process (the
SDKs' service models included) to find nothing: `python -m bench --only profile`
measured it at about half of the decode and of `handle_batch`. So the collector is
paused while a batch is decoded and handled, and resumed afterwards; a cycle made
meanwhile is collected by the first collection after that.

The collector is process-wide and batches run on several threads (the CLI classifies
in a worker thread while it lists), so pauses are counted: the first pause disables
it, the last one to end enables it again, and only if it was enabled to begin with.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

_lock = threading.Lock()
_depth = 0
_resume = False

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside the block (nested and concurrent blocks included)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()


def gc_paused(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` run under ``paused_gc``."""

    @wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused_gc():
            return func(*args, **kwargs)

    return run
