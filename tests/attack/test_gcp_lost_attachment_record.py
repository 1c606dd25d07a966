"""F6 (P2 silent leak, P3 lost record): on GCP the owner's delete waits for its operation, so
the VM is usually gone when the same run goes on to its dependents. If any dependent's call
then raises (a 503, throttling past the retries: ``ProviderUnavailable``; any other
``ProviderError``), ``delete_group`` raises and the deleter records only an error: the
``DeleteResult`` (what went: the VM; what the VM used: ``attached``) is dropped. The journal
has the delete, but ``orphan_resources`` never learns what the deleted retry-leak VM used.

The next listing regroups the leak's data disk as a primary-less group of the LIVE owner, and
a primary-less group of a live owner is an orphan only when every member is a known orphan
resource (``leftover_of_orphan``); otherwise ``protected`` / ``unattached_of_live_owner``,
every cycle, forever: a silent leak of exactly the disk the deleter set out to delete. The
cycle that terminated the VM also reports the group as ``delete_failed``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.gcp.provider import build_gcp_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.attack.helpers import REF, REGION, ZONE
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend, add_instance


def test_a_retry_leaks_disk_is_deleted_after_a_dependent_failed_once(gcp: FakeCompute, db: Database) -> None:
    now = datetime.now(UTC)
    add_backend(db, "gcp-attack", provider="gcp", account=gcp.project, regions=(REGION,))
    # the owner is live on its second VM ``good``; ``leak`` is the first attempt's VM (created before provisioning)
    leak = gcp.add_instance("leak", zone=ZONE, labels={"provider_ref": REF}, created=now - timedelta(hours=3))
    gcp.add_disk("leak-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="leak",
                 created=now - timedelta(hours=3))
    good = gcp.add_instance("good", zone=ZONE, labels={"provider_ref": REF}, created=now - timedelta(hours=2))
    add_instance(db, ref=REF, status="busy", backend_id="gcp-attack", primary_id=good["id"], region=ZONE,
                 issued_at=now - timedelta(hours=4), created_at=now - timedelta(hours=4),
                 provisioned_at=now - timedelta(hours=2))

    def provider_for(b: Any) -> Any:
        return build_gcp_provider(b, endpoint=gcp.url, timeout=5)

    pipeline = Pipeline(settings=Settings.explicit(confirm_seconds=0,
                                                   margin_seconds=0), db=db, provider_for=provider_for,
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    # the leak's disk delete meets one 503 (the region is skipped for this cycle: seed 004)
    gcp.add_fault("DELETE", f"/zones/{ZONE}/disks/leak-data", status=503, times=1)

    first = run_cycle(pipeline, "gcp-attack", mode="delete")
    [g1] = [g for g in first.groups if g.primary_id == leak["id"]]
    assert gcp.get("instances", ZONE, "leak") is None  # the VM went in the first cycle
    assert g1.reason == "primary_mismatch"

    second = run_cycle(pipeline, "gcp-attack", mode="delete")
    third = run_cycle(pipeline, "gcp-attack", mode="delete")
    seen = [(g.resources[0].id, g.verdict, g.reason, g.action) for g in (*second.groups, *third.groups)
            if g.primary_id is None]
    assert gcp.get("disks", ZONE, "leak-data") is None, \
        f"first cycle: {g1.action}; the leak's disk then: {seen}"
