"""The provider contract, once, on both clouds.

One scenario table, written against the provider port in cloud-neutral terms (roles such
as ``vm``, ``vm.boot``, ``vm.data``; ``clouds.Driver``'s primitives), each row run on AWS
(``AwsProvider`` over HTTP against the moto server) and on GCP (``GcpProvider``, the real
google-cloud-compute client against the fake Compute REST server, which deletes
``autoDelete`` disks with their instance as Compute Engine does), through the real
pipeline (``bootstrap.build_pipeline``, ``runner.run_cycle`` in delete mode, its
``confirm`` callback being "between listing and deletion") on a real Postgres ledger.

For every row both clouds must give the same verdicts, the same survivors (what exists
afterwards), the same delete result reasons for the roles that matter, the same region
failures and outcome, and the same journal (``provider_journal``, SAFETY.md rule 19)
once normalised to ``(phase, action, target role, outcome, blast roles)``; and every
mutating request the cloud saw has its intent and result rows.

The ``forged_*`` rows forge the listing (``forgery.py``, rule 21): every batch the lister
publishes has one field (or all) of every listed resource altered on the listing queue,
the ids, kinds, ref and region / zone kept; each such row must give what its honest row
gives (or, where the forgery changes the classification, the same thing on both clouds),
and the cycle must have recorded the forged groups, not the honest ones.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import Resource
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.cycle.plan import Plan
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.records import CycleReport
from tests.contract.clouds import ACTIONS, BACKEND, PROTECT, Driver
from tests.contract.forgery import ALL, ALL_BUT_VM_CREATED_AT, COMBINED, FORGERIES, Forgery, ForgingQueue
from tests.support.seams import delete_results, query

MAIN, OTHER = 0, 1  # the backend's two regions, by index into ``Driver.regions``
Row = tuple[str, str, str, str | None, tuple[str, ...]]  # (phase, action, role, outcome, blast roles)


def intent(action: str, role: str, *blast: str) -> Row:
    return ("intent", action, role, None, tuple(sorted(blast)))


def result(action: str, role: str, *blast: str, outcome: str = "ok") -> Row:
    return ("result", action, role, outcome, tuple(sorted(blast)))


def journaled_ok(action: str, role: str, *blast: str) -> list[Row]:
    """A journaled call that went through: its intent, then its result ``ok`` (which takes
    the call, target and blast from its intent: migration 0012)."""
    return [intent(action, role, *blast), result(action, role, *blast)]


class Ledger:
    """The platform's side, as the ledger protocol has it (``LedgerClient``): refs issued
    before any provider call, owners recorded, and every time backdated an hour (outside
    the margin) before the cycle."""

    def __init__(self, driver: Driver) -> None:
        self.client = LedgerClient(driver.db)
        self.driver = driver

    def gone_ref(self) -> str:
        """A ref whose owner row was hard-deleted (a failed placeholder): its VMs are orphans."""
        issued = self.client.issue_ref(owner_name="placeholder")
        self.client.hard_delete(issued.owner_id)
        return issued.provider_ref

    def live_owner(self, role: str, *, primary: Callable[[str], str] = lambda vm: vm) -> str:
        """A busy owner with its VM (``role``) in the main region, recording ``primary(vm id)``."""
        issued = self.client.issue_ref(owner_name=role)
        vm = self.driver.vm(role, issued.provider_ref)
        self.client.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=primary(vm),
                                      region=self.driver.regions[MAIN], status=OwnerStatus.BUSY)
        return issued.provider_ref

    def gone_volume_ref(self) -> str:
        """A volume owner's ref (README, C1) whose volumes row was hard-deleted."""
        issued = self.client.issue_volume_ref(owner_name="placeholder")
        self.client.hard_delete_volume(issued.owner_id)
        return issued.provider_ref

    def live_volume(self, role: str, *, near: str, lost: str | None = None) -> str:
        """An active volume owner with its volume (``role``) beside the instance ``near``,
        recording it; ``lost``: the role of an earlier attempt's volume of the same ref made
        two hours before (before the owner's provisioning, once aged: a lost attempt)."""
        issued = self.client.issue_volume_ref(owner_name=role)
        if lost is not None:
            self.driver.volume(lost, near=near, labels={DEFAULT_TAG_KEY: issued.provider_ref},
                               created_ago=timedelta(hours=2))
        vol = self.driver.volume(role, near=near, labels={DEFAULT_TAG_KEY: issued.provider_ref})
        thing = self.driver.things[role]  # recorded in its region (AWS) or zone (GCP)
        self.client.mark_volume_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=vol,
                                             region=thing.location or thing.region)
        self.client.mark_volume_active(issued.owner_id)
        return issued.provider_ref

    def age(self) -> None:
        with self.driver.db.transaction() as conn:
            conn.run("UPDATE instances SET created_at = created_at - interval '1 hour',"
                     " provisioned_at = provisioned_at - interval '1 hour',"
                     " terminated_at = terminated_at - interval '1 hour'")
            conn.run("UPDATE volumes SET created_at = created_at - interval '1 hour',"
                     " provisioned_at = provisioned_at - interval '1 hour',"
                     " deleted_at = deleted_at - interval '1 hour'")
            conn.run("UPDATE provider_refs SET issued_at = issued_at - interval '1 hour'")


Setup = Callable[[Driver, Ledger], None]
Between = Callable[[Driver, Ledger], None]


#: In ``Scenario.failures``: the driver's own word for a region all of whose calls are
#: refused for their rate (``Driver.region_throttled``, see ``GcpDriver``).
REGION_THROTTLED = "<region throttled>"


@dataclass(frozen=True)
class Scenario:
    """One row: a setup on the cloud and the ledger, what happens between classification
    and deletion (``between``), and what both clouds must show afterwards.

    ``verdicts``: every listed group, by its primary's role (a primary-less group by its
    resources' roles joined with ``+``) -> (verdict, reason, action); ``survivors``: the
    roles that exist afterwards (the blast is everything else); ``journal``: the cycle's
    journal rows, normalised; ``deleted``: the roles the deleter's results count as
    deleted (gone already included); ``left``: the roles its results name as left alone,
    and ``reasons``: the reason of those whose reason both clouds must give; ``failures``:
    region index -> a word its failure's error must contain; ``forge``: the field every
    listing batch is forged in on its way to the classifier (``forgery.py``); ``margin``:
    the cycle's margin in seconds (STEP 5; 0: the clouds stamp creation times now)."""

    name: str
    setup: Setup
    verdicts: dict[str, tuple[str, str, str]]
    outcome: str
    survivors: frozenset[str]
    journal: list[Row] = field(default_factory=list)
    deleted: frozenset[str] = frozenset()
    left: frozenset[str] = frozenset()
    reasons: dict[str, str] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    between: Between | None = None
    clouds: tuple[str, ...] = ("aws", "gcp")
    forge: Forgery | None = None
    margin: int = 0
    xfail: str | None = None  # a product bug: the row shows what must happen, and does not yet (strict)


# --- the setups, cloud-neutral ------------------------------------------------------------------------------

def plain_orphan(d: Driver, ledger: Ledger) -> None:
    """An orphan VM (owner hard-deleted long ago) with its own auto-delete boot disk."""
    d.vm("vm", ledger.gone_ref())


def orphan_with_data(d: Driver, ledger: Ledger, **labels: str) -> None:
    """An orphan VM with a data disk / volume of its own ref (attached, not auto-delete)."""
    ref = ledger.gone_ref()
    d.vm("vm", ref)
    d.disk("vm.data", attach_to="vm", labels={DEFAULT_TAG_KEY: ref, **labels}, auto_delete=False)


def protected_member(d: Driver, ledger: Ledger) -> None:
    orphan_with_data(d, ledger, **PROTECT)


def protected_non_member_auto_delete(d: Driver, ledger: Ledger) -> None:
    """An orphan VM with an auto-delete disk labelled only with the protect key (no ref)."""
    plain_orphan(d, ledger)
    d.disk("vm.keep", attach_to="vm", labels=PROTECT, auto_delete=True)


def foreign_auto_delete(d: Driver, ledger: Ledger) -> None:
    """An orphan VM with a live, tracked owner's data disk attached to it with auto-delete."""
    plain_orphan(d, ledger)
    live_ref = ledger.live_owner("live")
    d.disk("live.data", attach_to="vm", labels={DEFAULT_TAG_KEY: live_ref}, auto_delete=True)


def precious_attached(d: Driver, ledger: Ledger) -> None:
    """An orphan VM with its data disk (its ref, kept on delete) and ``precious``: someone
    else's disk, protect label and no ref, attached to the VM with auto-delete (the cloud
    would delete it with the VM)."""
    orphan_with_data(d, ledger)
    d.disk("precious", attach_to="vm", labels=PROTECT, auto_delete=True)


def precious_attached_protected_member(d: Driver, ledger: Ledger) -> None:
    """``precious_attached`` whose data disk carries the protect label too."""
    precious_attached(d, ledger)
    d.label("vm.data", **PROTECT)


def precious_attached_managed(d: Driver, ledger: Ledger) -> None:
    """``precious_attached`` whose VM a controller would re-create (rule 14)."""
    precious_attached(d, ledger)
    d.manage("vm")


def boot_swapped(d: Driver, ledger: Ledger) -> None:
    """An orphan VM launched an hour ago, stopped, whose boot disk / root volume (labelled
    with its ref) someone swapped for an unlabelled one of theirs (``foreign``) at the same
    device, auto-delete; the old one stays, detached."""
    d.vm("vm", ledger.gone_ref(), launched_ago=timedelta(hours=1))
    d.swap_boot("vm", "foreign")


def fresh_member(d: Driver, ledger: Ledger) -> None:
    """An orphan VM launched an hour ago (its boot device with it) and a data disk of its ref
    made and attached now: within a ten-minute margin (rule 2)."""
    ref = ledger.gone_ref()
    d.vm("vm", ref, launched_ago=timedelta(hours=1))
    d.disk("vm.data", attach_to="vm", labels={DEFAULT_TAG_KEY: ref}, auto_delete=False)


def retag_vm(d: Driver, ledger: Ledger) -> None:
    d.label("vm", **{DEFAULT_TAG_KEY: ledger.gone_ref()})


def protect_data(d: Driver, ledger: Ledger) -> None:
    d.label("vm.data", **PROTECT)


def protect_boot(d: Driver, ledger: Ledger) -> None:
    d.label("vm.boot", **PROTECT)


def vanish_data(d: Driver, ledger: Ledger) -> None:
    d.vanish("vm.data")


def mangled_primary(d: Driver, ledger: Ledger) -> None:
    """A busy owner whose recorded primary_id is its VM's id mangled (no such instance)."""
    ledger.live_owner("vm", primary=d.mangled)


def untagged_spot_request(d: Driver, ledger: Ledger) -> None:
    """An orphan spot VM whose persistent spot request carries no ref."""
    d.spot_vm("vm", ledger.gone_ref())


def orphan_per_region(d: Driver, ledger: Ledger) -> None:
    d.vm("vm", ledger.gone_ref(), region=d.regions[MAIN])
    d.vm("far", ledger.gone_ref(), region=d.regions[OTHER])


def throttled_region(d: Driver, ledger: Ledger) -> None:
    """An orphan VM in each region; the other region refuses every call for its rate."""
    orphan_per_region(d, ledger)
    d.throttle(d.regions[OTHER])


def throttled_listing(d: Driver, ledger: Ledger) -> None:
    """An orphan VM in each region; every listing call is refused for its rate."""
    orphan_per_region(d, ledger)
    d.throttle_listing()


def volume_owners(d: Driver, ledger: Ledger) -> None:
    """Volume owners (README, C1) beside a live instance owner's VM (``live``): an active one
    recording ``kept``, whose first attempt ``lost`` leaked; a hard-deleted one whose volume
    ``held`` is attached to ``live``."""
    ledger.live_owner("live")
    ledger.live_volume("kept", near="live", lost="lost")
    d.volume("held", near="live", labels={DEFAULT_TAG_KEY: ledger.gone_volume_ref()})
    d.attach("held", to="live")


def leaked_volume(d: Driver, ledger: Ledger) -> None:
    """A hard-deleted volume owner's volume ``free``, detached, beside a live owner's VM ``live``."""
    ledger.live_owner("live")
    d.volume("free", near="live", labels={DEFAULT_TAG_KEY: ledger.gone_volume_ref()})


def attach_free(d: Driver, ledger: Ledger) -> None:
    d.attach("free", to="live")


VM = frozenset({"vm", "vm.boot"})
VM_DATA = VM | {"vm.data"}
LEFT_IN_PLACE = ("orphan", "owner_deleted", "reported")  # an orphan its delete left in place
DELETED = ("orphan", "owner_deleted", "deleted")
#: The honest rows of the forged ones: an orphan VM with its data disk and ``precious``, someone
#: else's protected disk, attached with auto-delete (it blocks the VM's delete); the same VM
#: whose boot device someone swapped (the old one, detached, is a leftover of its own and
#: goes; the swapped-in one blocks the VM).
PRECIOUS_HONEST = Scenario(
    "precious_honest", precious_attached,
    verdicts={"vm": LEFT_IN_PLACE}, outcome="unsettled", survivors=VM_DATA | {"precious"},
    left=VM_DATA | {"precious"},
    reasons={"vm": "blast_protected", "precious": "blast_protected", "vm.boot": "owner_skipped",
             "vm.data": "owner_skipped"})
BOOT_SWAPPED_HONEST = Scenario(
    "boot_swapped", boot_swapped,
    verdicts={"vm": LEFT_IN_PLACE, "vm.boot": DELETED}, outcome="unsettled", survivors=frozenset({"vm", "foreign"}),
    journal=journaled_ok("delete-disk", "vm.boot"), deleted=frozenset({"vm.boot"}), left=frozenset({"vm", "foreign"}),
    reasons={"vm": "blast_foreign", "foreign": "blast_foreign"})
FRESH_MEMBER_HONEST = Scenario(
    "fresh_member", fresh_member, margin=600,
    verdicts={"vm": ("skipped", "recent_resource", "none")}, outcome="unsettled", survivors=VM_DATA)
#: Skipped as a whole by the deleter's own read of the VM's creation time (``cycle.deleter``).
CREATED_AT_CHANGED: dict[str, Any] = {"left": frozenset({"vm:*"}),
                                      "reasons": {"vm:*": "owner_changed:created_at_changed"}}


def forged(field: str, honest: Scenario = PRECIOUS_HONEST, *, victim: str = "precious", name: str | None = None,
           **changes: Any) -> Scenario:
    """``honest`` with its listing batches forged in ``field`` (naming ``victim``), and what
    the forgery changes in what both clouds must show (nothing, unless ``changes`` say so)."""
    return dataclasses.replace(honest, name=name or f"forged_{field}", forge=Forgery(field, victim), **changes)


SCENARIOS = [
    Scenario(
        "control", plain_orphan,
        verdicts={"vm": DELETED}, outcome="clean", survivors=frozenset(),
        journal=journaled_ok("delete-instance", "vm", "vm.boot"), deleted=VM),
    Scenario(
        "protect_tag", protected_member,
        verdicts={"vm": ("protected", "protect_tag", "reported")}, outcome="clean", survivors=VM_DATA),
    Scenario(
        "blast_protected", protected_non_member_auto_delete,
        verdicts={"vm": LEFT_IN_PLACE}, outcome="unsettled", survivors=VM | {"vm.keep"},
        left=VM | {"vm.keep"},
        reasons={"vm": "blast_protected", "vm.keep": "blast_protected", "vm.boot": "owner_skipped"}),
    Scenario(
        "blast_foreign", foreign_auto_delete,
        verdicts={"vm": LEFT_IN_PLACE, "live": ("tracked", "tracked", "none"),
                  "live.data": ("protected", "unattached_of_live_owner", "reported")},
        outcome="unsettled", survivors=VM | {"live", "live.boot", "live.data"},
        left=VM | {"live.data"},
        reasons={"vm": "blast_foreign", "live.data": "blast_foreign", "vm.boot": "owner_skipped"}),
    Scenario(
        "retagged_ref", plain_orphan, between=retag_vm,
        verdicts={"vm": LEFT_IN_PLACE}, outcome="unsettled", survivors=VM,
        left=VM, reasons={"vm": "ref_changed", "vm.boot": "owner_skipped"}),
    Scenario(
        "retagged_protect", orphan_with_data, between=protect_data,
        verdicts={"vm": LEFT_IN_PLACE}, outcome="unsettled", survivors=VM_DATA,
        # (AWS terminated the VM here until every member was re-read before TerminateInstances)
        left=VM_DATA, reasons={"vm.data": "protected", "vm": "group_protected", "vm.boot": "group_protected"}),
    Scenario(
        "retagged_protect_boot", plain_orphan, between=protect_boot,
        verdicts={"vm": LEFT_IN_PLACE}, outcome="unsettled", survivors=VM, left=VM,
        reasons={"vm.boot": "protected", "vm": "group_protected"}),
    Scenario(
        "vanished", orphan_with_data, between=vanish_data,
        verdicts={"vm": DELETED}, outcome="clean", survivors=frozenset(),
        journal=journaled_ok("delete-instance", "vm", "vm.boot"), deleted=VM_DATA),
    Scenario(
        "primary_not_listed", mangled_primary,
        verdicts={"vm": ("skipped", "primary_not_listed", "none")}, outcome="unsettled", survivors=VM),
    Scenario(
        "spot_request_ref_missing", untagged_spot_request,
        verdicts={"vm": LEFT_IN_PLACE}, outcome="unsettled", survivors=VM | {"vm.request"},
        left=VM | {"vm.request"}, reasons={"vm": "spot_request_ref_missing", "vm.request": "ref_missing"},
        clouds=("aws",)),
    Scenario(
        "throttled_region", throttled_region,
        verdicts={"vm": DELETED}, outcome="unsettled", survivors=frozenset({"far", "far.boot"}),
        journal=journaled_ok("delete-instance", "vm", "vm.boot"), deleted=VM,
        failures={OTHER: REGION_THROTTLED}),
    Scenario(
        "throttled_listing", throttled_listing,
        verdicts={}, outcome="unsettled", survivors=VM | {"far", "far.boot"},
        failures={MAIN: "ProviderThrottled", OTHER: "ProviderThrottled"}),
    # --- volume owners (README, C1): a volume group's primary is the volume; a leaked one goes
    # alone (a lost attempt only beside its recorded volume, rule 17), one an instance holds never
    Scenario(
        "volume_owners", volume_owners,
        verdicts={"live": ("tracked", "tracked", "none"), "kept": ("tracked", "tracked", "none"),
                  "lost": ("orphan", "primary_mismatch", "deleted"), "held": ("skipped", "in_use", "none")},
        outcome="unsettled", survivors=frozenset({"live", "live.boot", "kept", "held"}),
        journal=journaled_ok("delete-disk", "lost"), deleted=frozenset({"lost"})),
    Scenario(
        "volume_leaked", leaked_volume,
        verdicts={"live": ("tracked", "tracked", "none"), "free": DELETED},
        outcome="clean", survivors=frozenset({"live", "live.boot"}),
        journal=journaled_ok("delete-disk", "free"), deleted=frozenset({"free"})),
    # a listing forged to show every volume detached: the classifier takes the held one for an
    # orphan, the deleter's own read finds it in use and leaves it (rules 12, 21)
    Scenario(
        "forged_volume_detached", volume_owners, forge=Forgery("detached", victim="held"),
        verdicts={"live": ("tracked", "tracked", "none"), "kept": ("tracked", "tracked", "none"),
                  "lost": ("orphan", "primary_mismatch", "deleted"),
                  "held": ("orphan", "owner_deleted", "deleting")},
        outcome="unsettled", survivors=frozenset({"live", "live.boot", "kept", "held"}),
        journal=journaled_ok("delete-disk", "lost"), deleted=frozenset({"lost"}),
        left=frozenset({"held"}), reasons={"held": "in_use"}),
    # a volume attached between the plan and its delete: the deleter's own read refuses it (rule 21)
    Scenario(
        "volume_attached_after_plan", leaked_volume, between=attach_free,
        verdicts={"live": ("tracked", "tracked", "none"), "free": ("orphan", "owner_deleted", "deleting")},
        outcome="unsettled", survivors=frozenset({"live", "live.boot", "free"}),
        left=frozenset({"free"}), reasons={"free": "in_use"}),
    # --- forged listing batches (rule 21): one field of every listed resource altered, the
    # ids, kinds, ref and region / zone kept; the honest row first
    PRECIOUS_HONEST,
    *(forged(f) for f in FORGERIES if f not in ("created_at", "tags", "controller", "detached")),
    # the VM's creation time forged: the deleter reads it again before anything and, finding
    # another time, leaves the whole group (rules 12, 17); its members' are judged on the times
    # the deleter reads (the row above: as honest)
    forged("created_at", **CREATED_AT_CHANGED),
    # every listed resource claims the ref and no other tag; with a protected member, its
    # protect tag is stripped from the listing: the classifier sees an orphan, the deleter's
    # re-read the protect tag
    forged("tags", setup=precious_attached_protected_member, left=VM_DATA,
           reasons={"vm.data": "protected", "vm": "group_protected", "vm.boot": "group_protected"}),
    # a VM a controller would re-create: the controller (and any provider protection) the
    # listing saw, stripped: the deleter's re-read finds the controller (rule 14)
    Scenario(
        "managed_honest", precious_attached_managed,
        verdicts={"vm": ("protected", "managed_by_controller", "reported")}, outcome="clean",
        survivors=VM_DATA | {"precious"}),
    forged("controller", setup=precious_attached_managed,
           verdicts={"vm": ("protected", "managed_by_controller", "reported")}, outcome="clean",
           left=VM_DATA | {"vm:*"}, reasons={"vm": "managed_by_controller", "vm:*": "managed_by_controller",
                                              "vm.boot": "owner_skipped", "vm.data": "owner_skipped"}),
    # the members aged past the margin (the VM's own time kept, which the deleter checks):
    # the margin is judged again on the times the deleter reads (rules 2, 21)
    FRESH_MEMBER_HONEST,
    # (before the deleter read every member's creation time, both clouds deleted the fresh disk
    # with the VM here: the margin was judged again on the listed member times)
    forged("created_at_members", FRESH_MEMBER_HONEST, name="forged_created_at_fresh_member",
           verdicts={"vm": LEFT_IN_PLACE}, left=frozenset({"vm:*"}), reasons={"vm:*": "owner_changed:recent_resource"}),
    forged(ALL, **CREATED_AT_CHANGED),
    forged(ALL_BUT_VM_CREATED_AT),
    # a boot device swapped on a stopped VM; forged, the batch makes the old one look the
    # VM's own, attached, and the VM look deletable
    BOOT_SWAPPED_HONEST,
    forged(ALL_BUT_VM_CREATED_AT, BOOT_SWAPPED_HONEST, victim="foreign", name="forged_boot_swapped"),
]


def cases() -> list[Any]:
    out = []
    for s in SCENARIOS:
        for cloud in s.clouds:  # a row of one cloud only (a spot request) is not run on the other
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=s.xfail)] if s.xfail else []
            out.append(pytest.param(s, cloud, id=f"{s.name}-{cloud}", marks=marks))
    return out


# --- what a cycle did, normalised ---------------------------------------------------------------------------

def group_roles(d: Driver, report: CycleReport) -> dict[str, tuple[str, str, str]]:
    out = {}
    for g in report.groups:
        key = d.role_of(g.primary_id) if g.primary_id else "+".join(sorted(d.role_of(r.id) for r in g.resources))
        assert key not in out, f"two groups of {key}"
        out[key] = (g.verdict, g.reason, g.action)
    return out


def journal_rows(d: Driver) -> list[Row]:
    """Every journal row of the backend (the test's one cycle, or none of any), in order."""
    rows = query(d.db, "SELECT phase, call, target, outcome, blast::text FROM provider_journal"
                       " WHERE backend_id = :b ORDER BY id", b=BACKEND)
    return [(phase, ACTIONS[call], d.role_of(target), outcome,
             tuple(sorted(d.role_of(b) for b in json.loads(blast or "[]")))) for phase, call, target, outcome, blast
            in rows]


def unpaired_journal(d: Driver, cycle_id: str) -> list[Any]:
    """Journal rows that are not one intent of this cycle with exactly one result naming it."""
    return query(d.db, "SELECT i.id, i.call, i.target, i.cycle_id, count(r.id) FROM provider_journal i"
                       " LEFT JOIN provider_journal r ON r.phase = 'result' AND r.intent_id = i.id"
                       " WHERE i.phase = 'intent' GROUP BY i.id HAVING count(r.id) <> 1 OR i.cycle_id <> :c"
                       " UNION ALL SELECT r.id, r.call, r.target, r.cycle_id, 0 FROM provider_journal r"
                       " WHERE r.phase = 'result' AND (r.intent_id IS NULL OR r.cycle_id <> :c)", c=cycle_id)


def recorded_resources(d: Driver, cycle_id: str) -> dict[str, tuple[Resource, ...]]:
    """Group key -> its resources as the cycle recorded them (``cycle_groups``: what the
    classifier judged and the deleter is handed)."""
    rows = query(d.db, "SELECT group_key, resources::text FROM cycle_groups WHERE cycle_id = :c", c=cycle_id)
    return {key: tuple(Resource.model_validate(r) for r in json.loads(resources)) for key, resources in rows}


def delete_outcomes(d: Driver, cycle_id: str) -> tuple[set[str], dict[str, str]]:
    """Over every delete request of the cycle: the roles its results count as deleted, and
    role -> why it was left alone (a request skipped as a whole, by the re-classification,
    is named ``ROLE:*``, the role of its group's primary, or its resources' roles joined with
    ``+`` without one)."""
    gone: set[str] = set()
    left: dict[str, str] = {}
    groups = {key: "+".join(sorted(d.role_of(r["id"]) for r in json.loads(resources) if isinstance(r, dict)))
              for key, resources in query(d.db, "SELECT group_key, resources::text FROM cycle_groups"
                                                " WHERE cycle_id = :c", c=cycle_id)}
    for recorded in delete_results(d.db, cycle_id):
        outcome = recorded.get("result") or {}
        gone |= {d.role_of(i) for i in outcome.get("deleted") or []}
        left |= {d.role_of(s["id"]): s["reason"] for s in outcome.get("skipped") or []}
        if recorded.get("skipped"):
            primary = recorded["group_key"].rsplit("/", 1)[1]
            name = d.role_of(primary) if primary != "-" else groups.get(recorded["group_key"], recorded["group_key"])
            left[f"{name}:*"] = recorded["skipped"]
    return gone, left


# --- the test ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("scenario", "cloud"), cases())
def test_provider_contract(scenario: Scenario, cloud: str, driver: Driver) -> None:
    ledger = Ledger(driver)
    driver.add_backend()
    scenario.setup(driver, ledger)
    ledger.age()
    driver.margin_seconds = scenario.margin
    made = set(driver.things)

    def between(plan: Plan) -> bool:
        if scenario.between is not None:
            scenario.between(driver, ledger)
        return True

    listing_queue = ForgingQueue(driver, scenario.forge) if scenario.forge is not None else None
    report = run_cycle(driver.pipeline(listing_queue), BACKEND, mode="delete", confirm=between)
    if listing_queue is not None:  # the forgery changed what the listing said
        assert listing_queue.altered, "nothing forged"
        recorded = recorded_resources(driver, report.cycle_id)
        # (by resource: a volume owner's listed group is recorded as one group per volume, README C1)
        forged_resources = {r.id: r for resources in listing_queue.forged.values() for r in resources}
        recorded_by_id = {r.id: r for resources in recorded.values() for r in resources}
        assert recorded and recorded_by_id == forged_resources, "the honest listing recorded"

    # the verdicts, region failures and outcome
    assert group_roles(driver, report) == scenario.verdicts
    failed = {f.region: f.error for f in report.failures}
    assert set(failed) == {driver.regions[i] for i in scenario.failures}, failed
    for i, word in scenario.failures.items():
        assert (driver.region_throttled if word == REGION_THROTTLED else word) in failed[driver.regions[i]], failed
    assert report.outcome == scenario.outcome, report
    # the blast: what exists afterwards, and what the deleter says it deleted or left alone, and why
    assert driver.survivors() == set(scenario.survivors), f"made {sorted(made)}"
    gone, left = delete_outcomes(driver, report.cycle_id)
    assert gone == set(scenario.deleted)
    assert set(left) == set(scenario.left), left
    assert {role: left.get(role) for role in scenario.reasons} == scenario.reasons, left
    # the journal: the same rows on both clouds, each intent with its result, and no
    # mutation the cloud saw without them
    journal = journal_rows(driver)
    assert journal == scenario.journal
    assert unpaired_journal(driver, report.cycle_id) == []
    seen = Counter((ACTIONS[call], driver.role_of(target)) for call, target in driver.wire_mutations())
    assert seen == Counter((action, role) for phase, action, role, _, _ in journal if phase == "intent")


def test_the_table_is_well_formed() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names))
    for s in SCENARIOS:
        assert s.clouds and set(s.clouds) <= {"aws", "gcp"}, s.name
        assert set(s.reasons) <= s.left and not s.deleted & s.survivors, s.name
        assert {row[1] for row in s.journal} <= set(ACTIONS.values()), s.name
        assert s.forge is None or s.forge.field in {*FORGERIES, *COMBINED}, s.name
    assert DEFAULT_PROTECT_KEY in PROTECT
