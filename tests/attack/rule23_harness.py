"""Shared set-up for the rule 23 (mark, then sweep) attack reproductions: the whole pipeline
on real Postgres and the in-memory cloud, with an injected clock the test moves."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import db_now
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

WINDOW = 600


class Clock:
    def __init__(self, db: Database) -> None:
        self.t = db_now(db) + timedelta(minutes=1)

    def __call__(self) -> datetime:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)


def pipeline(db: Database, cloud: MemoryCloud, clock: Clock, provider_for: Any = None, **settings: Any) -> Pipeline:
    settings.setdefault("confirm_seconds", WINDOW)
    settings.setdefault("mode", "delete")
    return Pipeline(settings=Settings.explicit(**settings), db=db,
                    provider_for=provider_for or (lambda b: MemoryProvider(b, cloud)),
                    listing_queue=InProcessQueue(), delete_queue=InProcessQueue(), clock=clock)


def actions(report: Any) -> dict[str, tuple[str, str, str]]:
    return {g.primary_id or g.provider_ref: (g.verdict, g.reason, g.action) for g in report.groups}
