"""A simulated at-least-once queue behind the product's queue port.

Faults: a publish fails (the caller sees an error), a message is duplicated,
delayed, lost (e.g. dead-lettered after a poison run), delivered in any
order, or altered in flight: ``forger`` (set by the simulation) makes an
altered copy that is injected next to the real message, which still flows
(``message_forged``, ``request_forged``, ``job_forged``); the product must refuse
the copy, or for a listing job treat it as the hint it is (SAFETY.md rule 12).
A delivery that fails (the function raised or crashed) is redelivered
after a visibility timeout; after ``max_receives`` (5; 3 for the jobs queue, as
template.yaml sets it) it goes to the dead-letter queue, i.e. is dropped for the pipeline.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel

from orphan_cleanup.queues.base import Queue
from tests.sim.world import Dice, SimClock, Trace

MAX_RECEIVES = 5
VISIBILITY_TIMEOUT = 30
#: The jobs queue as template.yaml configures it (6 x the lister's timeout; 3 receives).
JOBS_VISIBILITY_TIMEOUT, JOBS_MAX_RECEIVES = 1800, 3
FORGE_KINDS = {"listing": "message_forged", "delete": "request_forged", "jobs": "job_forged"}


class PublishFailed(RuntimeError):
    """The queue refused a message (as boto3 or the Pub/Sub client would raise)."""


@dataclass
class Message:
    id: int
    body: str
    ready_at: datetime
    receives: int = 0
    forged: bool = False


class SimQueue(Queue):
    def __init__(self, name: str, clock: SimClock, dice: Dice, rng: random.Random, trace: Trace,
                 max_message_bytes: int, max_receives: int = MAX_RECEIVES,
                 visibility_timeout: int = VISIBILITY_TIMEOUT) -> None:
        self.name = name
        self.clock = clock
        self.dice = dice
        self.rng = rng
        self.trace = trace
        self.max_message_bytes = max_message_bytes
        self.max_receives = max_receives
        self.visibility_timeout = visibility_timeout
        self.messages: list[Message] = []
        self._ids = itertools.count(1)
        self.published = 0
        self.dead_lettered = 0
        self.forger: Callable[[str], str | None] | None = None
        self.forge_kind = FORGE_KINDS[name]
        #: Called with every message the queue accepted (lost in flight or not).
        self.on_publish: Callable[[BaseModel], None] | None = None
        #: More forgers, each with the dice of its own world and its kind of fault: their
        #: copies are injected the same way, drawing only from their world's streams.
        self.extra_forgers: list[tuple[Dice, str, Callable[[str], str | None]]] = []
        #: Kinds of forgery by a persistent attacker: its copy is read before the message it
        #: copies, and once it has forged one (``continues(body)``) it forges every later one
        #: without a roll. With rule 23 a claim must win every listing until the sweep.
        self.persistent: dict[str, Callable[[str], bool]] = {}

    def publish(self, message: BaseModel) -> None:
        body = message.model_dump_json()
        if len(body.encode()) > self.max_message_bytes:
            raise PublishFailed(f"{self.name}: message of {len(body)} bytes is too large")
        if self.dice.roll("publish_error"):
            self.trace(f"{self.name}: publish failed")
            raise PublishFailed(f"{self.name}: publish failed (injected)")
        self.published += 1
        if self.on_publish is not None:
            self.on_publish(message)
        if self.dice.roll("queue_drop"):
            self.trace(f"{self.name}: message lost")
            return
        self._put(body)
        real = self.messages[-1]
        if self.dice.roll("queue_duplicate"):
            self._put(body)
        if self.forger is not None and self.dice.roll(self.forge_kind):
            forged = self.forger(body)
            if forged is not None:
                self._put(forged, forged=True)
        for dice, kind, forger in self.extra_forgers:
            continues = self.persistent.get(kind)
            if ((continues is not None and continues(body)) or dice.roll(kind)) \
                    and (forged := forger(body)) is not None:
                self._put(forged, forged=True, dice=dice, ahead_of=real if continues is not None else None)

    def _put(self, body: str, forged: bool = False, dice: Dice | None = None, ahead_of: Message | None = None) -> None:
        dice = dice or self.dice
        delay = (self.rng if dice is self.dice else dice.rng).randint(5, 240) if dice.roll("queue_delay") else 0
        message = Message(next(self._ids), body, self.clock() + timedelta(seconds=delay), forged=forged)
        if ahead_of is not None and ahead_of in self.messages:
            message.ready_at = min(message.ready_at, ahead_of.ready_at)
            self.messages.insert(self.messages.index(ahead_of), message)
        else:
            self.messages.append(message)

    def ready(self) -> list[Message]:
        now = self.clock()
        return [m for m in self.messages if m.ready_at <= now]

    def take_many(self, n: int) -> list[Message]:
        """Up to ``n`` ready messages for one invocation, in any order."""
        ready = self.ready()
        batch = self.rng.sample(ready, min(n, len(ready)))
        for msg in batch:
            msg.receives += 1
        return batch

    def ack(self, msg: Message) -> None:
        self.messages = [m for m in self.messages if m is not msg]

    def nack(self, msg: Message, delay: int | None = None) -> None:
        """The delivery failed: redelivered later (after the visibility timeout unless
        ``delay`` says otherwise), or dead-lettered."""
        if msg.receives >= self.max_receives:
            self.ack(msg)
            self.dead_lettered += 1
            self.trace(f"{self.name}: message {msg.id} dead-lettered after {msg.receives} receives")
            return
        msg.ready_at = self.clock() + timedelta(seconds=self.visibility_timeout if delay is None else delay)

    def __len__(self) -> int:
        return len(self.messages)
