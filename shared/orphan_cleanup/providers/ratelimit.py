"""Client-side request budgets: one token bucket per (account, region, API class),
shared by every thread and every SDK client of the process (SAFETY.md rule 5).

EC2 throttles per account and region with token buckets (non-mutating calls: 100
tokens refilled at 20/s, shared with every other client of the account); Compute
Engine with per-project per-minute quotas. The defaults stay at a quarter of those
numbers so that other tools of the account keep room. A bucket is *adaptive*
(AIMD): a throttling reply halves its rate (down to ``min_rate``), each success
gives a small share of the configured rate back. Waiting happens outside the lock
(a token is reserved, then slept for), so threads queue without holding each other.

Nothing here reads the environment or the clock on import: ``clock`` and ``sleep``
are parameters, so the buckets' own tests need no sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ApiClass",
    "Budget",
    "RateLimits",
    "TokenBucket",
    "aws_api_class",
    "attach_to_boto3_client",
    "process_limits",
]

ApiClass = str
"""``describe`` (reads), ``mutate`` (other writes), ``terminate`` (``TerminateInstances``)."""

DESCRIBE: ApiClass = "describe"
MUTATE: ApiClass = "mutate"
TERMINATE: ApiClass = "terminate"

#: A throttling reply multiplies the rate by this; each success adds ``RECOVERY`` x the configured rate.
DECREASE = 0.5
RECOVERY = 0.05
MIN_SHARE = 0.1  # the rate never drops below this share of the configured one


@dataclass(frozen=True)
class Budget:
    """A bucket's configured refill ``rate`` (tokens per second) and ``burst`` (its size)."""

    rate: float
    burst: float

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError(f"a budget needs rate > 0 and burst >= 1, got {self}")


class TokenBucket:
    """A thread-safe, adaptive token bucket. ``acquire`` takes one token, sleeping
    until it is there; ``throttled`` / ``succeeded`` report a call's fate (AIMD)."""

    def __init__(self, budget: Budget, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.budget = budget
        self.rate = budget.rate
        self.min_rate = budget.rate * MIN_SHARE
        self._tokens = float(budget.burst)
        self._clock, self._sleep = clock, sleep
        self._stamp = clock()
        self._lock = threading.Lock()
        self.acquired = self.throttles = 0
        self.waited = 0.0

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.budget.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def acquire(self) -> float:
        """Take one token; returns how long it slept for it (0.0 when one was there)."""
        with self._lock:
            self._refill(self._clock())
            self._tokens -= 1.0  # reserved: a later caller waits for the next one
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            self.acquired += 1
            self.waited += wait
        if wait > 0:
            self._sleep(wait)
        return wait

    def throttled(self) -> None:
        """The provider refused a call for its rate: halve ours (not below ``min_rate``)
        and drop the tokens left, so the next call waits for a fresh one."""
        with self._lock:
            self._refill(self._clock())
            self.rate = max(self.min_rate, self.rate * DECREASE)
            self._tokens = min(self._tokens, 0.0)
            self.throttles += 1

    def succeeded(self) -> None:
        """A call went through: win back a little of the configured rate."""
        with self._lock:
            if self.rate < self.budget.rate:
                self._refill(self._clock())
                self.rate = min(self.budget.rate, self.rate + self.budget.rate * RECOVERY)


Key = tuple[str, str, str, ApiClass]
"""``(account or project, region, service, api class)``."""


class RateLimits:
    """The buckets of one process, created on first use, keyed by ``Key``.

    ``budgets`` maps each API class to its ``Budget``; a class not listed uses
    ``budgets["describe"]``. Every caller asking for the same key gets the same
    bucket, whatever thread or client it comes from."""

    def __init__(self, budgets: Mapping[ApiClass, Budget], *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if DESCRIBE not in budgets:
            raise ValueError("budgets must name the describe class")
        self.budgets = dict(budgets)
        self._clock, self._sleep = clock, sleep
        self._buckets: dict[Key, TokenBucket] = {}
        self._lock = threading.Lock()

    def bucket(self, account: str, region: str, service: str, api_class: ApiClass) -> TokenBucket:
        key = (account, region, service, api_class)
        with self._lock:
            found = self._buckets.get(key)
            if found is None:
                budget = self.budgets.get(api_class, self.budgets[DESCRIBE])
                found = self._buckets[key] = TokenBucket(budget, clock=self._clock, sleep=self._sleep)
            return found

    def buckets(self) -> dict[Key, TokenBucket]:
        with self._lock:
            return dict(self._buckets)


_PROCESS: dict[tuple[tuple[ApiClass, Budget], ...], RateLimits] = {}
_PROCESS_LOCK = threading.Lock()


def process_limits(budgets: Mapping[ApiClass, Budget]) -> RateLimits:
    """The process-wide ``RateLimits`` for these budgets (the real clock): every
    adapter built with equal budgets shares its buckets."""
    key = tuple(sorted(budgets.items()))
    with _PROCESS_LOCK:
        found = _PROCESS.get(key)
        if found is None:
            found = _PROCESS[key] = RateLimits(budgets)
        return found


# --- AWS: botocore events -----------------------------------------------------------

_READ_PREFIXES = ("Describe", "Get", "List")


def aws_api_class(operation: str) -> ApiClass:
    """EC2's throttling classes, by operation name."""
    if operation == "TerminateInstances":
        return TERMINATE
    return DESCRIBE if operation.startswith(_READ_PREFIXES) else MUTATE


def attach_to_boto3_client(client: Any, limits: RateLimits, *, account: str, region: str,
                           throttling_codes: frozenset[str]) -> None:
    """Make every HTTP attempt of ``client`` (retries included) take a token from its
    operation's bucket (``before-send``), and feed each attempt's fate back
    (``needs-retry``, which botocore emits after every attempt)."""
    service = client.meta.service_model.service_id.hyphenize()

    def bucket_of(event_name: str) -> TokenBucket:
        operation = event_name.rsplit(".", 1)[-1]
        return limits.bucket(account, region, service, aws_api_class(operation))

    def before_send(event_name: str, **_: Any) -> None:
        bucket_of(event_name).acquire()

    def after_attempt(event_name: str, response: Any = None, **_: Any) -> None:
        if not response:
            return  # a connection error: says nothing about the rate
        http, parsed = response
        code = parsed.get("Error", {}).get("Code") if isinstance(parsed, Mapping) else None
        if code in throttling_codes:
            bucket_of(event_name).throttled()
        elif getattr(http, "status_code", 500) < 400:
            bucket_of(event_name).succeeded()

    client.meta.events.register(f"before-send.{service}", before_send)
    client.meta.events.register_first(f"needs-retry.{service}", after_attempt)


# --- budgets from the settings ----------------------------------------------------------

def settings_budgets(settings: Any) -> dict[ApiClass, Budget]:
    """The three classes' budgets from ``Settings`` (``ORPHAN_CLEANUP_*_RATE`` / ``*_BURST``)."""
    return {
        DESCRIBE: Budget(settings.describe_rate, settings.describe_burst),
        MUTATE: Budget(settings.mutate_rate, settings.mutate_burst),
        TERMINATE: Budget(settings.terminate_rate, settings.terminate_burst),
    }


#: The settings' defaults, for adapters built without settings (benchmarks, tests).
DEFAULT_BUDGETS: Mapping[ApiClass, Budget] = {
    DESCRIBE: Budget(5.0, 25), MUTATE: Budget(1.25, 12), TERMINATE: Budget(1.25, 25)}
