"""Consent before deletion, the safety net behind the exit-2 check (cli/run.py): a run
without a terminal and without --yes whose backend was switched to delete after the CLI
read its mode (the cycle then starts in delete mode) deletes nothing. Real parts: the
pipeline on the in-memory cloud, a real Postgres ledger, stdin a real file (/dev/null)."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import pytest

from orphan_cleanup.cli import run as run_command
from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.ledger_helpers import add_backend, add_instance, db_now, make_ref
from tests.support.memory_cloud import MemoryCloud, MemoryProvider

BACKEND = "aws-prod"


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch):
    with open("/dev/null") as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        yield


def args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"backend": BACKEND, "mode": None, "json": False, "yes": False, **kw})


def test_a_backend_switched_to_delete_after_the_check_deletes_nothing(emptied_db: Database, no_terminal, capsys):
    db = emptied_db
    add_backend(db, BACKEND)  # report mode: the check lets the run go
    cloud = MemoryCloud()
    at = db_now(db) - timedelta(hours=2)
    ref = make_ref()
    iid = cloud.create(ResourceKind.INSTANCE, "us-east-1", {"provider_ref": ref}, created_at=at)
    add_instance(db, ref=ref, status="terminated", backend_id=BACKEND, primary_id=iid, region="us-east-1",
                 issued_at=at, created_at=at, provisioned_at=at, terminated_at=at)
    settings = Settings.explicit(confirm_seconds=0,
                                 max_mode="delete")  # the stack lets a row say delete (SAFETY.md rule 8)
    confirm = run_command.consent(settings, db, args())
    assert confirm is not None

    with db.connection() as conn:  # the platform switches the backend to delete meanwhile
        conn.run("UPDATE backends SET mode = 'delete' WHERE id = :b", b=BACKEND)
    pipeline = Pipeline(settings=settings, db=db, provider_for=lambda b: MemoryProvider(b, cloud),
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    report = run_cycle(pipeline, BACKEND, confirm=confirm)

    assert report.mode == "delete" and report.outcome == "unsettled"
    assert [(g.primary_id, g.verdict, g.action) for g in report.groups] == [(iid, "orphan", "reported")]
    assert cloud.exists(iid) and confirm.declined
    assert "no consent (no terminal, no --yes): nothing deleted" in capsys.readouterr().err
    # and asked again now, the same run is refused before anything is listed
    with pytest.raises(ConfigError, match="--yes"):
        run_command.consent(settings, db, args())
    assert run_command.consent(settings, db, args(yes=True)) is None
