"""The stack's protect key (ORPHAN_CLEANUP_PROTECT_TAG_KEY) protects whatever the rows say
(SAFETY.md rule 16), also when a backend row names it as its ref ``tag_key``: then every resource
of that backend carries the key that protects it. Such a row starts no cycle (one line naming
the setting), and a cycle's classifier and deleter never drop the key. Real pipeline, memory
cloud, real Postgres, each function on its own role."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core import policy
from orphan_cleanup.core.backends import Backend, account_view
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.queues.memory import InProcessQueue
from tests.integration.test_db_function_roles import ledger, role  # noqa: F401
from tests.integration.test_db_roles import PSQL
from tests.support.memory_cloud import MemoryCloud, MemoryProvider
from tests.support.platform import Platform, add_backend

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")
STACK_KEY = "orphan-cleanup-protect"  # Settings.explicit()'s protect_tag_key (the default)


def test_a_row_whose_tag_key_is_the_stack_protect_key_starts_no_cycle(ledger):  # noqa: F811
    backend = "mem-a33-key"
    # the platform's row: its ref tag key is the stack's protect key, its own protect key another
    add_backend(ledger.db(ledger.owner), backend_id=backend,
                settings=json.dumps({"tag_key": STACK_KEY, "protect_tag_key": "keep-me"}))
    cloud = MemoryCloud()
    platform = Platform(ledger.db(ledger.platform), cloud, backend_id=backend)
    client = LedgerClient(ledger.db(ledger.platform))
    issued = client.issue_ref(owner_name="leak")
    when = datetime.now(UTC) - timedelta(hours=2)
    vm = cloud.create(ResourceKind.INSTANCE, "r1", {STACK_KEY: issued.provider_ref}, created_at=when)
    client.mark_provisioning(issued.owner_id, backend_id=backend, primary_id=vm, region="r1",
                             status=OwnerStatus.BUSY)
    client.mark_terminated(issued.owner_id)
    platform.age(issued.owner_id)

    lister = Pipeline(settings=Settings.explicit(confirm_seconds=0),
                      db=role(ledger, "lister"), listing_queue=InProcessQueue(),
                      delete_queue=InProcessQueue(), provider_for=lambda b: MemoryProvider(b, cloud))
    started = lister.run_lister(backend, mode="delete", manual=True)
    lister.db.close()

    assert not started.started and started.reason == "stack_protect_key"
    assert "ORPHAN_CLEANUP_PROTECT_TAG_KEY" in (started.error or "") and "\n" not in (started.error or "")
    assert cloud.exists(vm), f"a VM carrying the stack's protect key {STACK_KEY!r} was deleted"


def test_the_classifier_and_the_deleter_keep_the_stack_key_a_row_names_as_its_tag_key():
    backend = Backend(id="b", provider="aws", account="123456789012", regions=("r1",),
                      settings={"tag_key": STACK_KEY, "protect_tag_key": "keep-me"})
    settings = Settings.explicit(confirm_seconds=0)
    ctx = policy.classify_context(settings, backend, datetime.now(UTC), policy.limits_for(settings, backend))
    assert STACK_KEY in ctx.protect_keys
    assert STACK_KEY in account_view(backend, [backend.settings.model_dump()], STACK_KEY).protect_keys
