"""A5 (P2 silent leak, P3 lost record): the previous round's fix of the "lost attachment
record after partial deletion" (``deletion.py: delete_group`` returns ``_Run.interrupted``
once ``run.deleted`` is non-empty) misses the owner's own call. ``_Run.owner_step`` appends
the owner to ``deleted`` only after ``ops.delete`` returns, and ``ops.delete`` makes the
delete call AND its confirming re-read (``gcp/operations.py: GcpOperations.delete``: the
``find`` after ``calls.delete``; ``aws/operations.py: AwsOperations.delete``: the
``DescribeInstances`` after ``TerminateInstances``). When that re-read raises (a 503, a
throttle past the retries), the VM is deleted but ``run.deleted`` is empty, so
``delete_group`` re-raises and ``cycle/deleter.py: Deleter._delete`` records only an error
(``Stop.provider_failed``): the ``DeleteResult`` with ``attached`` (what the deleted VM used)
is dropped and ``orphan_resources`` never learns it.

The next listings regroup the retry leak's data disk as a primary-less group of the LIVE
owner, which is an orphan only when every member is a known orphan resource: it is kept
(``unattached_of_live_owner``) every cycle, forever. Rule 12: "only those are remembered as
the orphan VM's leftovers"; rule 19 keeps the delete on record in the journal, the cycle's
record says the VM's group failed."""

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


def test_a_retry_leaks_disk_is_deleted_after_the_vms_confirm_read_failed_once(gcp: FakeCompute, db: Database) -> None:
    now = datetime.now(UTC)
    add_backend(db, "gcp-attack", provider="gcp", account=gcp.project, regions=(REGION,))
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
    # once the leak's delete is accepted, the next read of the zone's instances (the confirm) meets one 503
    gcp.on_operation("/instances/leak", lambda: gcp.add_fault("GET", f"/zones/{ZONE}/instances", status=503,
                                                              times=1), method="DELETE")

    first = run_cycle(pipeline, "gcp-attack", mode="delete")
    [g1] = [g for g in first.groups if g.primary_id == leak["id"]]
    assert gcp.get("instances", ZONE, "leak") is None  # the VM went in the first cycle
    assert g1.reason == "primary_mismatch"

    second = run_cycle(pipeline, "gcp-attack", mode="delete")
    third = run_cycle(pipeline, "gcp-attack", mode="delete")
    seen = [(g.resources[0].id, g.verdict, g.reason, g.action) for g in (*second.groups, *third.groups)
            if g.primary_id is None]
    assert gcp.get("disks", ZONE, "leak-data") is None, (
        f"first cycle: {g1.action}, failures {[f.error for f in first.failures]}; the leak's disk then: {seen}")


def test_the_deletion_result_survives_a_failed_confirm_read(gcp: FakeCompute) -> None:
    """The same at the provider port: the VM was deleted, yet ``delete_resource_group`` raises
    instead of returning what went (``deleted``, ``attached``) with the error."""
    from orphan_cleanup.core.errors import ProviderError
    from tests.attack.helpers import RecordingJournal, gcp_provider, groups_of

    vm = gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    disk = gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm")
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    gcp.on_operation("/instances/vm", lambda: gcp.add_fault("GET", f"/zones/{ZONE}/instances", status=503,
                                                            times=1), method="DELETE")
    journal = RecordingJournal()
    try:
        result = provider.delete_resource_group(group, journal)
    except ProviderError as exc:
        raise AssertionError(f"the VM was deleted ({journal.calls()}, results {journal.results}) but the result"
                             f" is lost: {type(exc).__name__}: {exc}") from exc
    assert gcp.get("instances", ZONE, "vm") is None
    assert vm["id"] in result.deleted and disk["id"] in result.attached and result.error
