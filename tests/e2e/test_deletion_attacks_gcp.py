"""Attacks on the GCP deleter through a forged listing message (SAFETY.md rule 21), on real parts: the
real google-cloud-compute client against the fake Compute REST server (which deletes a VM's
``autoDelete`` disks with it and refuses to delete a disk in use, as Compute Engine does),
``GcpProvider.delete_resource_group`` as the deleter calls it, and for the in-use case a
whole delete cycle on a real Postgres ledger.

A listing message reaches the deleter through a queue anyone with queue access may write
to, so every field of a listed group can be forged. New rule 21 (with rules 3, 12 and 15):
of the listing, the deleter uses only the group's ref, the kinds, the immutable numeric ids
and the zone or region to look them up in; everything else (self links, names, attachments,
device names, creation times, states) comes from its own fresh reads. Each attack below
builds an honest group with ``collect``, forges it with pydantic ``model_copy`` and asserts
what must survive. A, C, D and E (and B's forged ``self_link``) failed on the deleter before
the one algorithm over ids (``providers.deletion``): each deleted what must survive, or (E)
answered "not yet" for a disk something outside the group uses.

- A. **Forged self link**: a member data disk (not ``autoDelete``) of an orphan VM whose
  listed ``self_link`` names a protected disk of someone else attached to the same VM with
  ``autoDelete``. The rule-15 blast check matches attached disks to members by self link,
  so the protected disk passes for the member and ``instances.delete`` takes it (rules 15, 21).
- B. **Every field but the ids forged**, one at a time, on each member of an honest orphan
  group (VM, labelled boot and data disks) that a protected ``autoDelete`` disk of someone
  else blocks: whatever the field, nothing at all is deleted (the protected disk blocks the
  VM, and the VM's dependents never go before it: rules 3, 15, 21). A forged zone may make
  the deleter find nothing there, or refuse the group: still nothing is deleted.
- C. **Boot swap**: on a stopped orphan VM someone detaches its boot disk and attaches an
  unlabelled disk of their own, created a day earlier, as ``boot`` with ``autoDelete``. Only
  the boot disk created with the instance is its own (rule 15): the attached-later one is
  ``blast_foreign``. A control keeps the honest case (boot disk created with its VM) deleted.
- D. **Name reuse during a delete**: while the delete of one disk of a primary-less group is
  in flight, the group's other disk is deleted and re-created under its name (new id, a
  protect label). Compute Engine deletes by name, so only a re-read by id right before each
  call keeps the newcomer (rule 3). The instance variant: a VM deleted and re-created under
  its name between the listing and the delete.
- E. **In use**: a disk of an orphan primary-less group attached to a live VM that is not in
  the group is left alone, ``skipped`` / ``in_use``; its cycles stay ``unsettled``, never
  ``failed`` (rule 20: one bad group never holds the backend failed).
- F. **Forged snapshot facts** (``retain_snapshots_days`` set): a forged batch that claims an
  old ``created_at`` for a fresh snapshot of ours, or points an old one's name at it, does
  not get it deleted: its age is judged as re-read (rule 15).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import Outcome
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.provider import GcpProvider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend
from tests.support.listing import collect
from tests.support.seams import delete_results

REF = "aaaaaaaaaaa1"
ZONE, OTHER_ZONE, REGION = "us-central1-a", "us-central1-b", "us-central1"
TAG, PROTECT, SOURCE = "provider_ref", "orphan-cleanup-protect", "orphan-cleanup-source"
INSTANCE_DELETE, DISK_DELETE = "compute.instances.delete", "compute.disks.delete"


# --- the parts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    call: str
    target: str
    region: str | None
    blast: tuple[str, ...]


@dataclass
class RecordingJournal:
    """The journal port (``core.journal.Journal``, SAFETY.md rule 19), kept in memory."""

    intents: list[Intent] = field(default_factory=list)
    results: list[tuple[int, Outcome, str | None]] = field(default_factory=list)

    def intent(self, call: str, target: str, *, region: str | None, blast: Sequence[str] = ()) -> object:
        self.intents.append(Intent(call, target, region, tuple(blast)))
        return len(self.intents) - 1

    def result(self, intent: object, outcome: Outcome, error: str | None = None) -> None:
        assert isinstance(intent, int)
        self.results.append((intent, outcome, error))

    def named(self) -> set[str]:
        """Every id an intent names, as its target or in its blast."""
        return {i for intent in self.intents for i in (intent.target, *intent.blast)}


def provider(gcp: FakeCompute, **settings: Any) -> GcpProvider:
    backend = Backend(id="gcp-attacks", provider="gcp", account=gcp.project, regions=[REGION], settings=settings)
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url), timeout=5.0,
                       poll_interval=0.01)


def only_group(p: GcpProvider) -> ResourceGroup:
    listing = collect(p)
    assert listing.failures == ()
    [group] = listing.groups
    return group


def forge(group: ResourceGroup, resource_id: str, *, details: dict[str, Any] | None = None,
          **fields: Any) -> ResourceGroup:
    """The group with one resource's ``fields`` and ``details`` keys replaced, as a forged
    listing message would carry it."""
    def forged(r: Resource) -> Resource:
        return r.model_copy(update={**fields, "details": {**r.details, **(details or {})}})

    assert resource_id in group.resource_ids()
    return group.model_copy(update={"resources": tuple(forged(r) if r.id == resource_id else r
                                                       for r in group.resources)})


def world(gcp: FakeCompute) -> set[tuple[str, str, str]]:
    """Every resource the fake holds, as (collection, name, id)."""
    return {(coll, name, body["id"]) for coll in ("instances", "disks", "addresses")
            for name in gcp.names(coll) for body in [gcp.get(coll, zone_of(gcp, coll, name), name)] if body}


def zone_of(gcp: FakeCompute, coll: str, name: str) -> str:
    for loc in (ZONE, OTHER_ZONE, REGION):
        if gcp.get(coll, loc, name) is not None:
            return loc
    raise KeyError(name)


def skips(result: DeleteResult) -> set[tuple[str, str]]:
    return {(s.id, s.reason) for s in result.skipped}


# --- A. a forged self link ---------------------------------------------------------------------


def test_a_forged_self_link_does_not_hand_a_protected_disk_to_instances_delete(gcp: FakeCompute) -> None:
    # Given: an orphan VM with its data disk (ref R, kept on delete) and someone's protected
    # disk attached with autoDelete; the listed data disk's self link names the protected disk
    vm = gcp.add_instance("vm", zone=ZONE, labels={TAG: REF})
    data = gcp.add_disk("vm-data", zone=ZONE, labels={TAG: REF}, attached_to="vm", auto_delete=False)
    precious = gcp.add_disk("precious", zone=ZONE, labels={PROTECT: "yes"}, attached_to="vm", auto_delete=True)
    p = provider(gcp)
    forged = forge(only_group(p), data["id"], details={"self_link": precious["selfLink"]})
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(forged, journal)

    # Then: the protected disk blocks the VM's delete, as it does in the honest group
    assert (gcp.get("disks", ZONE, "precious") or {}).get("id") == precious["id"], "precious deleted"
    assert gcp.names("instances") == {"vm"}
    assert result.status is DeleteStatus.SKIPPED
    assert (precious["id"], "blast_protected") in skips(result)
    assert not [i for i in journal.intents if i.call == INSTANCE_DELETE and i.target == vm["id"]]


# --- B. every field but the ids forged -----------------------------------------------------------

#: field -> (what ``forge`` gets for a disk, for the VM); ``precious`` / ``bystander`` stand for
#: that resource's self link, name or id (filled in by the test).
FORGERIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "self_link": ({"details": {"self_link": "precious.selfLink"}}, {"details": {"self_link": "bystander.selfLink"}}),
    "name": ({"details": {"name": "precious"}}, {"details": {"name": "bystander"}}),
    "zone": ({"details": {"zone": OTHER_ZONE}}, {"details": {"zone": OTHER_ZONE}}),
    "users": ({"details": {"users": ["bystander.selfLink"]}}, {"details": {"users": ["precious.selfLink"]}}),
    "attached_to": ({"attached_to": "bystander.id"}, {"attached_to": "bystander.id"}),
    "created_at": ({"created_at": datetime(2020, 1, 1, tzinfo=UTC)}, {"created_at": datetime(2020, 1, 1, tzinfo=UTC)}),
    "status": ({"details": {"status": "READY"}}, {"details": {"status": "STOPPING"}}),
    "state": ({"state": ResourceState.AVAILABLE}, {"state": ResourceState.TERMINATING}),
    "sizes": ({"details": {"size_gb": 1}}, {"details": {"machine_type": "e2-micro", "gpus": 0}}),
    "device_name": ({"details": {"device_name": "precious"}}, {"details": {"device_name": "precious"}}),
}
#: (target, field) pairs that the deleter as it is gets wrong: what it does.


def fill(value: Any, made: dict[str, dict[str, Any]]) -> Any:
    """``precious.selfLink`` -> that resource's self link, in any nested value."""
    if isinstance(value, dict):
        return {k: fill(v, made) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, made) for v in value]
    if isinstance(value, str) and value.split(".")[0] in made and "." in value:
        what, key = value.split(".", 1)
        return made[what][key]
    return value


def forgery_cases() -> list[Any]:
    cases: list[Any] = [pytest.param(None, None, id="honest")]
    for name in FORGERIES:
        for target in ("vm", "data", "boot"):
            cases.append(pytest.param(target, name, id=f"{target}-{name}"))
    return cases


@pytest.mark.parametrize(("target", "forged_field"), forgery_cases())
def test_no_single_forged_field_deletes_anything_outside_the_group(gcp: FakeCompute, target: str | None,
                                                                  forged_field: str | None) -> None:
    # Given: an honest orphan group (VM, labelled boot disk going with it, labelled data disk
    # kept), someone's protected disk attached to the VM with autoDelete (it blocks the VM),
    # a live bystander VM, and same-named protected decoys in the zone a forged zone names
    made = {
        "vm": gcp.add_instance("vm", zone=ZONE, labels={TAG: REF}),
        "boot": gcp.add_disk("vm-boot", zone=ZONE, labels={TAG: REF}, attached_to="vm", auto_delete=True, boot=True),
        "data": gcp.add_disk("vm-data", zone=ZONE, labels={TAG: REF}, attached_to="vm", auto_delete=False),
        "precious": gcp.add_disk("precious", zone=ZONE, labels={PROTECT: "yes"}, attached_to="vm", auto_delete=True),
        "bystander": gcp.add_instance("bystander", zone=ZONE),
    }
    gcp.add_instance("vm", zone=OTHER_ZONE, labels={PROTECT: "yes"})
    for name in ("vm-boot", "vm-data"):
        gcp.add_disk(name, zone=OTHER_ZONE, labels={PROTECT: "yes"})
    p = provider(gcp)
    group = only_group(p)
    assert set(group.resource_ids()) == {made[k]["id"] for k in ("vm", "boot", "data")}
    if target is not None and forged_field is not None:
        for_disk, for_vm = FORGERIES[forged_field]
        group = forge(group, made[target]["id"], **fill(for_vm if target == "vm" else for_disk, made))
    before = world(gcp)
    journal = RecordingJournal()

    # When
    try:
        result: DeleteResult | None = p.delete_resource_group(group, journal)
    except ProviderError:
        result = None  # refused as a whole: nothing deleted either

    # Then: nothing at all is deleted, the protected disk and everything else survive
    assert (gcp.get("disks", ZONE, "precious") or {}).get("id") == made["precious"]["id"], "precious deleted"
    assert world(gcp) == before, before - world(gcp)
    assert journal.intents == []
    assert result is None or result.status is DeleteStatus.SKIPPED, result


# --- C. a boot disk swapped on a stopped VM -------------------------------------------------------


def test_a_foreign_disk_swapped_in_as_boot_disk_keeps_the_stopped_vm(gcp: FakeCompute) -> None:
    # Given: an orphan VM, stopped, whose own unlabelled boot disk was swapped for someone's
    # unlabelled disk created a day earlier, attached as boot with autoDelete
    vm = gcp.add_instance("vm", zone=ZONE, labels={TAG: REF}, status="TERMINATED")
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", auto_delete=True, boot=True)
    foreign = gcp.add_disk("foreign", zone=ZONE, created=datetime.now(UTC) - timedelta(days=1))
    gcp.swap_boot_disk("vm", "foreign", zone=ZONE, auto_delete=True)
    p = provider(gcp)
    group = only_group(p)
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(group, journal)

    # Then
    assert (gcp.get("disks", ZONE, "foreign") or {}).get("id") == foreign["id"], "foreign boot disk deleted"
    assert gcp.names("instances") == {"vm"}
    assert result.status is DeleteStatus.SKIPPED
    assert (foreign["id"], "blast_foreign") in skips(result)
    assert not [i for i in journal.intents if i.call == INSTANCE_DELETE and i.target == vm["id"]]


def test_a_stopped_vms_own_unlabelled_boot_disk_goes_with_it(gcp: FakeCompute) -> None:
    # Given: an orphan VM, stopped, with the unlabelled boot disk it was created with (same time)
    created = datetime.now(UTC) - timedelta(days=3)
    vm = gcp.add_instance("vm", zone=ZONE, labels={TAG: REF}, status="TERMINATED", created=created)
    boot = gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", auto_delete=True, boot=True, created=created)
    p = provider(gcp)
    group = only_group(p)
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(group, journal)

    # Then: deleted with its boot disk, and the journal says so
    assert result.status is DeleteStatus.DELETED and vm["id"] in result.deleted
    assert gcp.names("instances") == gcp.names("disks") == set()
    assert [(i.call, i.target, i.blast) for i in journal.intents] == [(INSTANCE_DELETE, vm["id"], (boot["id"],))]


# --- D. a name reused while a delete is in flight -------------------------------------------------


def test_a_disk_recreated_under_its_name_during_the_groups_delete_survives(gcp: FakeCompute) -> None:
    # Given: an orphan primary-less group of two unattached disks of ref R
    listed = {name: gcp.add_disk(name, zone=ZONE, labels={TAG: REF}) for name in ("disk-a", "disk-b")}
    p = provider(gcp)
    group = only_group(p)
    assert set(group.resource_ids()) == {d["id"] for d in listed.values()}
    # while the first disk's delete is in flight, the other is deleted and re-created under
    # its name: a new id and a protect label
    newcomer: dict[str, Any] = {}

    def reuse_the_other_name() -> None:
        first = "disk-a" if gcp.get("disks", ZONE, "disk-a") is None else "disk-b"
        other = "disk-b" if first == "disk-a" else "disk-a"
        gcp.remove("disks", ZONE, other)
        newcomer.update(gcp.add_disk(other, zone=ZONE, labels={TAG: REF, PROTECT: "yes"}), first=first)

    gcp.on_operation("/disks/disk-", reuse_the_other_name, method="DELETE")
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(group, journal)

    # Then: the newcomer is there with its protect label, no journaled call names it, the
    # result names only the listed disks, and the first one is deleted
    assert newcomer, "no disk of the group was deleted"
    now = gcp.get("disks", ZONE, newcomer["name"])
    assert now is not None and now["id"] == newcomer["id"], "the re-created disk deleted"
    assert now["labels"].get(PROTECT) == "yes"
    assert newcomer["id"] not in journal.named()
    assert {*result.deleted, *result.pending, *(s.id for s in result.skipped)} <= {d["id"] for d in listed.values()}
    assert listed[newcomer["first"]]["id"] in result.deleted


def test_a_vm_recreated_under_its_name_after_the_listing_survives(gcp: FakeCompute) -> None:
    # Given: an orphan VM with its boot disk, listed; then deleted and re-created under its
    # name (a new id, a protect label) with a new boot disk
    gcp.add_instance("vm", zone=ZONE, labels={TAG: REF})
    gcp.add_disk("vm-boot", zone=ZONE, labels={TAG: REF}, attached_to="vm", auto_delete=True, boot=True)
    p = provider(gcp)
    group = only_group(p)
    gcp.remove("instances", ZONE, "vm")  # its autoDelete boot disk goes with it
    new_vm = gcp.add_instance("vm", zone=ZONE, labels={TAG: REF, PROTECT: "yes"})
    new_boot = gcp.add_disk("vm-boot", zone=ZONE, labels={TAG: REF}, attached_to="vm", auto_delete=True, boot=True)
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(group, journal)

    # Then
    assert (gcp.get("instances", ZONE, "vm") or {}).get("id") == new_vm["id"]
    assert (gcp.get("disks", ZONE, "vm-boot") or {}).get("id") == new_boot["id"]
    assert not {new_vm["id"], new_boot["id"]} & journal.named()
    assert not {new_vm["id"], new_boot["id"]} & {*result.deleted, *result.pending}
    assert gcp.count("DELETE") == 0


# --- E. a disk in use by a VM outside the group -----------------------------------------------------


def disk_used_by_a_live_vm(gcp: FakeCompute, ref: str = REF) -> tuple[dict[str, Any], dict[str, Any]]:
    """A disk of ref ``ref`` (a primary-less group) attached to a live VM with no ref label."""
    user = gcp.add_instance("user-vm", zone=ZONE)
    disk = gcp.add_disk("left", zone=ZONE, labels={TAG: ref}, attached_to="user-vm")
    return user, disk


def test_a_disk_used_by_a_vm_outside_the_group_is_skipped_in_use(gcp: FakeCompute) -> None:
    # Given
    user, disk = disk_used_by_a_live_vm(gcp)
    p = provider(gcp)
    group = only_group(p)
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(group, journal)

    # Then
    assert (gcp.get("disks", ZONE, "left") or {}).get("id") == disk["id"]
    assert (gcp.get("instances", ZONE, "user-vm") or {}).get("id") == user["id"]
    assert journal.intents == []
    # in use is a verdict, never a failure: named, and not finished (the group stays unsettled)
    assert result.status is DeleteStatus.DELETING, result
    assert skips(result) == {(disk["id"], "in_use")} and disk["id"] in result.pending


def test_cycles_of_a_backend_with_a_disk_in_use_end_unsettled_never_failed(db: Database, gcp: FakeCompute) -> None:
    # Given: a delete-mode backend whose only orphan is a disk (its owner hard-deleted an hour
    # ago) attached to a live VM outside its group
    add_backend(db, "gcp-main", provider="gcp", account=gcp.project, regions=(REGION,), mode="delete")
    ledger = LedgerClient(db)
    issued = ledger.issue_ref(owner_name="placeholder")
    ledger.hard_delete(issued.owner_id)
    with db.transaction() as conn:
        conn.run("UPDATE provider_refs SET issued_at = issued_at - interval '1 hour'")
    user, disk = disk_used_by_a_live_vm(gcp, issued.provider_ref)
    settings = Settings.explicit(confirm_seconds=0, margin_seconds=0, gcp_endpoint=gcp.url)

    # When: two delete cycles
    reports = []
    for _ in range(2):
        pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                            delete_queue=InProcessQueue())
        reports.append(run_cycle(pipeline, "gcp-main", mode="delete"))

    # Then: each cycle handed the orphan disk to the deleter and ended unsettled, never failed;
    # the disk and its user are untouched
    for report in reports:
        assert [(g.verdict, [r.id for r in g.resources]) for g in report.groups] == [("orphan", [disk["id"]])]
        [recorded] = delete_results(db, report.cycle_id)
        assert recorded["state"] != "failed" and recorded["error"] is None, recorded
    assert [r.outcome for r in reports] == ["unsettled", "unsettled"]
    assert (gcp.get("disks", ZONE, "left") or {}).get("id") == disk["id"]
    assert (gcp.get("instances", ZONE, "user-vm") or {}).get("id") == user["id"]
    assert gcp.count("DELETE") == 0


# --- F. forged snapshot facts -------------------------------------------------------------------------


def our_snapshot(gcp: FakeCompute, disk_id: str, **kw: Any) -> dict[str, Any]:
    """A snapshot as the deleter takes one: ``oc-<ref>-<disk id>``, the ref and source labels."""
    disk = {"selfLink": f"https://www.googleapis.com/compute/v1/projects/{gcp.project}/zones/{ZONE}/disks/d{disk_id}",
            "id": disk_id, "sizeGb": "10"}
    return gcp.add_snapshot(f"oc-{REF}-{disk_id}", disk=disk, zone=ZONE, labels={TAG: REF, SOURCE: disk_id}, **kw)


@pytest.mark.parametrize("forgery", ["fresh-listed-as-old", "old-named-as-fresh"])
def test_a_forged_snapshot_age_never_gets_a_fresh_snapshot_deleted(gcp: FakeCompute, forgery: str) -> None:
    # Given: retention 7 days; an old snapshot of ours (listed) and a fresh one (not listed)
    old = our_snapshot(gcp, "4100000000000000101", created=datetime.now(UTC) - timedelta(days=10))
    fresh = our_snapshot(gcp, "4100000000000000202")
    p = provider(gcp, retain_snapshots_days=7)
    group = only_group(p)
    [listed] = group.resources
    assert (listed.kind, listed.id) == (ResourceKind.SNAPSHOT, old["id"])
    if forgery == "fresh-listed-as-old":  # the fresh one added, with the old one's age
        claimed = listed.model_copy(update={"id": fresh["id"], "details": {
            **listed.details, "name": fresh["name"], "self_link": fresh["selfLink"],
            "source_disk_id": fresh["sourceDiskId"]}})
        group = group.model_copy(update={"resources": (listed, claimed)})
    else:  # the old one's name pointed at the fresh one
        group = forge(group, old["id"], details={"name": fresh["name"], "self_link": fresh["selfLink"]})
    journal = RecordingJournal()

    # When
    result = p.delete_resource_group(group, journal)

    # Then: the fresh snapshot survives and no journaled call names it
    assert (gcp.snapshot(fresh["name"]) or {}).get("id") == fresh["id"], "fresh snapshot deleted"
    assert fresh["id"] not in journal.named()
    assert fresh["id"] not in result.deleted
    if forgery == "fresh-listed-as-old":  # the honest part of the batch is still done
        assert gcp.snapshot(old["name"]) is None and old["id"] in result.deleted
        assert (fresh["id"], "snapshot_retained") in skips(result)
