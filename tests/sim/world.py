"""Shared pieces of the simulation: the simulated clock, seeded fault dice and
the trace of recent events printed with a violation.

Every random decision comes from a ``random.Random`` seeded with a string
(``"<seed>:<stream>"``), so one seed always replays the same run, and a change
in how often one component rolls (say, the number of SQL statements of a step)
does not reshuffle the decisions of the others.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

#: The run's fixed settings: STEP 5 margin, the interval, cycle deadline (lease), the settle
#: phase's scheduler tick and the runs it allows (L1), the cap on STEP 7 backoff.
MARGIN = 120
INTERVAL = 60  # ORPHAN_CLEANUP_INTERVAL_SECONDS, and the confirmation window of most seeds (rule 23)
DEADLINE = 600
SETTLE_INTERVAL = 30
SETTLE_RUNS = 5
MAX_BACKOFF = 1200
BACKEND = "sim"
#: The other backends a seed may have: two sharing the first one's AWS account
#: (same SimCloud; ``sim-c`` always in the first one's regions, sometimes with other
#: credentials), a failover backend in another account (its own SimCloud), and the
#: backend id a misconfigured platform writes that names no backend row.
BACKEND_B, BACKEND_C, BACKEND_FO, UNKNOWN_BACKEND = "sim-b", "sim-c", "sim-fo", "aws"
ACCOUNT, FAILOVER_ACCOUNT, STRANGER_ACCOUNT = "123456789012", "210987654321", "999999999999"

#: Simulated time starts here (far from the wall clock, so a timestamp taken
#: from the wrong clock stands out in a trace).
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class SimClock:
    """The one clock of a run: the pipeline, the platform's timestamps, the
    provider's creation times and the database's activity stamps all read it."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.now = start
        self._listeners: list[Callable[[int], None]] = []

    def __call__(self) -> datetime:
        return self.now

    def on_advance(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def advance(self, seconds: int) -> None:
        if seconds <= 0:
            return
        self.now += timedelta(seconds=seconds)
        for listener in self._listeners:
            listener(seconds)

    def offset(self) -> int:
        return int((self.now - EPOCH).total_seconds())


def stream(seed: int, name: str) -> random.Random:
    return random.Random(f"{seed}:{name}")


#: Base probabilities of each fault kind (per opportunity), scaled per seed by
#: an intensity in {0, 0.5, 1, 2}: some seeds are calm (clean cycles happen and
#: STEP 1 gets to skip), some are stormy.
BASE_RATES: dict[str, float] = {
    # database boundary
    "db_connect_error": 0.004,      # per connection checkout
    "db_drop": 0.002,               # per statement, before it runs (the transaction is lost)
    "db_ack_lost": 0.002,           # per statement, after it ran (committed, caller sees an error)
    "db_kill_backends": 0.03,       # per step: pg_terminate_backend on idle pooled connections
    # queues and functions
    "queue_duplicate": 0.08,
    "queue_delay": 0.15,
    "queue_drop": 0.015,
    "publish_error": 0.008,
    "crash_before_handler": 0.03,
    "crash_after_handler": 0.04,
    # provider
    "region_failure": 0.04,         # per region listed: error / unavailable / timeout / throttled
    "listing_crash": 0.008,         # per region listed: the whole listing raises
    "delete_unavailable": 0.12,
    "delete_timeout_after": 0.08,   # the delete happened, then the call timed out
    "delete_throttled": 0.03,
    "delete_error": 0.03,
    "concurrent_delete": 0.35,       # another delete message is handled while a provider delete runs
    "visibility_timeout": 0.15,     # a slow delete outlives its visibility timeout: redelivered meanwhile
    "concurrent_lister": 0.03,      # a lister run overlaps a provider delete
    # time
    "lease_expiry_jump": 0.02,      # per step: the clock jumps past the cycle deadline
    "idle_spell": 0.04,             # per step: the platform goes quiet for a while (nights, weekends)
    # platform (crashes at every point of the ledger protocol)
    "crash_after_ref": 0.12,
    "error_after_create": 0.12,
    "create_error": 0.06,
    "crash_after_create": 0.1,
    "crash_terminating": 0.08,
    "termination_gave_up": 0.25,
    "volume_left_behind": 0.2,
    "commit_lag": 0.3,
    # people and other platforms
    "user_copy": 0.25,
    "user_protect": 0.3,
    "user_untag": 0.25,
    "foreign_resource": 0.2,
    "mass_terminate": 0.0,          # set per seed (blast-radius seeds)
    "mode_flip": 0.0,               # set per seed
    # several backends, forged messages, operators, credentials (issue #18)
    "failover": 0.0,                # per platform action on a seed with a failover backend: an owner moves
    "unknown_backend": 0.0,         # per provisioning, set per seed: the platform writes backend_id 'aws'
    "message_forged": 0.25,         # per batch published: an altered copy is injected next to it (2/5 of
                                    # those of delete-mode batches are dropped: report-mode ones matter more)
    "request_forged": 0.3,          # per delete request published: an altered copy is injected next to it
    "backend_edit": 0.0,            # per platform action, set per seed: an operator edits a backends row
    "wrong_credentials": 0.0,       # per lister run, set per seed: the credentials reach another account
    "mode_override": 0.05,          # per lister run: an operator's one-off mode in the event
    # the tick (one schedule per stack) and its listing jobs
    "job_forged": 0.2,              # per listing job published: an altered copy (other backends) next to it
    # rule 14 (seeds with other controllers and protections; drawn from the seed's own
    # "rule14" streams, so the other kinds draw as before)
    "user_termination_protect": 0.0,  # per people action, set per seed: termination protection enabled
    # the deletion's worlds (deletion_worlds.py; each set per seed and drawn from the
    # world's own streams, so the other kinds draw as before)
    "user_reuse_name": 0.0,         # per people action: a name reused right after a deletion's read
    "user_swap_root": 0.0,          # per people action: a stopped instance's root swapped for theirs
    "user_borrow_volume": 0.0,      # per people action: an orphan's volume attached to their instance
    "snapshot_forged_young": 0.0,   # per batch published: a forged copy adds a young snapshot of ours
    "user_deregister_image": 0.0,   # per people action: an image that used a snapshot of ours goes
    "settings_broken": 0.0,         # per step: a backend row's settings become no JSON object
    "backend_moved": 0.0,           # per step: sim-d's row moved to another account for a while
    "user_inflate_group": 0.0,      # per people action: volumes tagged with a finished owner's ref
    "message_forged2": 0.0,         # per batch published: a copy with every field but the ids altered
    "message_forged_mode": 0.0,     # per report-mode batch, set per seed (world "modes"): a copy saying
                                    # delete, read first, then on every later one of that backend
}

INTENSITIES = (0.0, 0.5, 1.0, 1.0, 2.0)


def swarm(rates: dict[str, float], rng: random.Random, exempt: set[str]) -> dict[str, float]:
    """Swarm testing: each seed switches a random subset of fault kinds off and
    boosts another, so seeds differ in *which* faults meet, not only how often."""
    out = {}
    for kind, p in rates.items():
        roll = rng.random()
        out[kind] = p if kind in exempt else 0.0 if roll < 0.25 else min(1.0, p * 3) if roll > 0.8 else p
    return out


@dataclass
class Dice:
    """Seeded fault decisions, counted by kind. ``enabled`` goes off for the settle phase."""

    rng: random.Random
    rates: dict[str, float]
    counts: Counter = field(default_factory=Counter)
    enabled: bool = True

    def roll(self, kind: str, scale: float = 1.0) -> bool:
        """Whether a ``kind`` fault happens at this opportunity (``scale``: opportunities
        that stand for several of the rate's unit, capped at certain)."""
        if not self.enabled:
            return False
        p = min(1.0, self.rates.get(kind, 0.0) * scale)
        if p > 0 and self.rng.random() < p:
            self.counts[kind] += 1
            return True
        return False


class Trace:
    """The last events of a run, for a minimal trace when an invariant breaks."""

    def __init__(self, clock: SimClock, keep: int = 60) -> None:
        self.clock = clock
        self.events: deque[str] = deque(maxlen=keep)
        self.step = 0

    def __call__(self, message: str) -> None:
        self.events.append(f"#{self.step:03d} t+{self.clock.offset():>5}s {message}")

    def dump(self) -> str:
        return "\n".join(self.events)
