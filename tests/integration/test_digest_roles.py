"""The digest from a function's own database role (docs/DATABASE.md "One role per function";
README, "Digests"): whichever function finishes a cycle reads what its digest tells (the
owner from the platform's tables, the creation from the listing, the cost from the backend's
``prices``) and records the notification, as its role may, on a real Postgres after
roles.sql, migrate and roles.sql again."""

from __future__ import annotations

from typing import Any

import pytest

from orphan_cleanup.core.digest import slack_text
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.notify_step import NotifyStep
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import in_process_queues
from orphan_cleanup.ledger.records import FinishedCycle
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.notify.base import Notifier
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_db_function_roles import ledger, role  # noqa: F401 (the fixture)
from tests.integration.test_db_roles import PSQL
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")


class Inbox(Notifier):
    """A channel that keeps what it was sent."""

    channel = "inbox"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, digest: dict[str, Any]) -> None:
        self.sent.append(digest)


def test_each_function_role_sends_a_digest_that_names_owner_and_creation(ledger):  # noqa: F811
    cloud = MemoryCloud()
    add_backend(ledger.db(ledger.owner), settings='{"prices": {"instance_hour": {}, "disk_gb_month": 0.1}}')
    platform = Platform(ledger.db(ledger.platform), cloud)
    ref, _, vm = platform.terminated_leak()
    listing, deletes = InProcessQueue(), InProcessQueue()
    pipelines = {fn: Pipeline(settings=Settings.explicit(confirm_seconds=0), db=role(ledger, fn), listing_queue=listing,
                              delete_queue=deletes, provider_for=lambda b: MemoryProvider(b, cloud))
                 for fn in ("lister", "classifier")}
    started = pipelines["lister"].run_lister("mem", mode="report", manual=True)
    lq, _ = in_process_queues(pipelines["classifier"])
    while (body := lq.pop()) is not None:
        pipelines["classifier"].handle_batch(ListingBatch.model_validate_json(body))
    assert LedgerStore(ledger.db(ledger.owner)).cycle_report(started.cycle_id).outcome == "clean"
    finished = FinishedCycle(backend_id="mem", cycle_id=started.cycle_id, mode="report", outcome="clean")

    for fn in ("lister", "classifier", "deleter"):
        inbox = Inbox()
        # when the function that finished the cycle sends its digest, as its own role
        doc = NotifyStep(settings=Settings.explicit(), db=role(ledger, fn), notifiers=[inbox])(finished)

        # then the orphan names its owner, its creation as listed and since when it is one
        assert doc is not None and inbox.sent == [doc], fn
        [item] = [g for g in doc["new_orphans"] if g["primary_id"] == vm]
        assert item["provider_ref"] == ref and item["owner_name"] == "tracked"
        assert item["created_at"] is not None and item["orphan_since"] is not None
        assert item["age_seconds"] >= 7200  # the harness creates its VMs two hours back
        # the memory cloud lists no size: a price table that prices nothing of it gives no cost
        assert item["size"] == {} and item["cost_per_hour"] is None
        assert "owner tracked" in slack_text(doc)
    with ledger.db(ledger.owner).connection() as conn:
        assert conn.run("SELECT count(*) FROM events WHERE cycle_id = :c AND kind = 'digest_sent'",
                        c=started.cycle_id) == [[3]]
    for p in pipelines.values():
        p.db.close()
