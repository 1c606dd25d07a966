"""The GCP kinds forwarding-rule and image, end to end on real parts: a real Postgres ledger, the
real google-cloud-compute client against the fake Compute REST server (which speaks the v1 wire
format of ``forwardingRules`` and ``images``), the in-process runner (``run_cycle``).

Forwarding rules (regional). Listed by the ``forwardingRules`` aggregated list filtered on the ref
label; no listing call ties a rule to an instance (even one behind a target instance), so a ref's
rules join its primary-less group of their region, with its unattached addresses: protected while
its owner lives (``unattached_of_live_owner``), deleted once it is gone. A rule on a static address
holds it (the address is ``IN_USE``, the rule in its ``users``): the address is deleted after the
group's rules (``depends_on``). Deleting a rule takes nothing else.

Images (global). Listed by ``images.list`` filtered on the ref label, placed in the zone of their
``sourceDisk`` (an image made from no disk of the backend's zones is not listed). Nothing holds an
image; deleting one takes nothing else.

Both are read by numeric id (a list filtered on ``id = N``) and deleted by name only while that name
still names the id read (SAFETY.md rule 21); a protect label on either keeps its whole group
(rule 3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.client import LedgerClient, gcp_labels
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.queues.memory import InProcessQueue
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend
from tests.support.seams import delete_results, query, skip_reasons

ZONE, REGION = "us-central1-a", "us-central1"
BACKEND = "gcp-main"
PROTECT = "orphan-cleanup-protect"


# ---- helpers ---------------------------------------------------------------------------------------

def setup(db: Database, gcp: FakeCompute) -> LedgerClient:
    add_backend(db, BACKEND, provider="gcp", account=gcp.project, regions=(REGION,), mode="delete")
    return LedgerClient(db)


def gone_ref(ledger: LedgerClient) -> str:
    """A ref whose owner row was hard-deleted (a failed placeholder)."""
    issued = ledger.issue_ref(owner_name="placeholder")
    ledger.hard_delete(issued.owner_id)
    return issued.provider_ref


def live_ref(ledger: LedgerClient, gcp: FakeCompute) -> tuple[str, dict[str, Any]]:
    """A live owner with its tracked VM."""
    owner = ledger.issue_ref(owner_name="live")
    vm = gcp.add_instance("live-vm", zone=ZONE, labels=gcp_labels(owner.provider_ref))
    ledger.mark_provisioning(owner.owner_id, backend_id=BACKEND, primary_id=vm["id"], region=REGION,
                             status=OwnerStatus.BUSY)
    return owner.provider_ref, vm


def age_ledger(db: Database) -> None:
    with db.transaction() as conn:
        conn.run("UPDATE instances SET created_at = created_at - interval '1 hour',"
                 " provisioned_at = provisioned_at - interval '1 hour'")
        conn.run("UPDATE provider_refs SET issued_at = issued_at - interval '1 hour'")


def labels(ref: str, *, protect: bool = False) -> dict[str, str]:
    return {**gcp_labels(ref), **({PROTECT: "yes"} if protect else {})}


def cycle(db: Database, gcp: FakeCompute, mode: str, between: Callable[[], None] = lambda: None) -> Any:
    """One in-process cycle; ``between`` runs between classification and deletion."""
    def confirm(plan: Any) -> bool:
        between()
        return True

    settings = Settings.explicit(confirm_seconds=0, margin_seconds=0, gcp_endpoint=gcp.url)
    pipeline = bootstrap.build_pipeline(settings, db=db, listing_queue=InProcessQueue(),
                                        delete_queue=InProcessQueue())
    return run_cycle(pipeline, BACKEND, mode=mode, confirm=confirm)


def groups_of(report: Any) -> dict[str, dict[str, Any]]:
    doc = report.c3()
    return {f"{g['provider_ref']}/{g['region']}": {"members": {r["id"]: r["kind"] for r in g["resources"]},
                                                   "verdict": g["verdict"], "reason": g["reason"]}
            for g in doc["groups"]}


def group_of(groups: dict[str, dict[str, Any]], member: str) -> dict[str, Any]:
    [group] = [g for g in groups.values() if member in g["members"]]
    return group


def intents(db: Database) -> list[tuple[str, str]]:
    return [(c, t) for c, t in query(db, "SELECT call, target FROM provider_journal WHERE phase = 'intent'"
                                         " ORDER BY id")]


def deletes(gcp: FakeCompute) -> list[str]:
    """The paths of the DELETE requests the fake accepted, in order."""
    return [c.path for c in gcp.calls if c.method == "DELETE" and c.status == 200]


def rule_on_address(gcp: FakeCompute, name: str, ref: str | None, *, protect: bool = False) -> tuple[dict, dict]:
    """A static address and a forwarding rule using it (the address ``IN_USE``), both carrying ``ref``."""
    tags = labels(ref, protect=protect) if ref else {}
    ip = gcp.add_address(f"{name}-ip", region=REGION, labels=labels(ref) if ref else {})
    rule = gcp.add_forwarding_rule(name, region=REGION, labels=tags, address=f"{name}-ip")
    return rule, ip


def image(gcp: FakeCompute, name: str, ref: str | None, *, protect: bool = False) -> dict[str, Any]:
    return gcp.add_image(name, zone=ZONE, labels=labels(ref, protect=protect) if ref else {})


# ---- listing and classification ------------------------------------------------------------------

def test_forwarding_rules_and_images_are_listed_label_filtered_and_classified(db, gcp):
    """Given an orphan ref's forwarding rule (on its address) and image, a live owner's own pair, and
    an unlabelled rule and image; when a report cycle runs; then the orphan's rule and address are
    one primary-less orphan group of the region, its image an orphan group of the zone of its source
    disk, the live owner's rule and image are protected, and the unlabelled ones are not listed (every
    list call carried the label filter)."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    rule, ip = rule_on_address(gcp, "lost-fr", ref)
    img = image(gcp, "lost-img", ref)
    live, _ = live_ref(ledger, gcp)
    live_rule, live_ip = rule_on_address(gcp, "live-fr", live)
    live_img = image(gcp, "live-img", live)
    foreign_rule, _ = rule_on_address(gcp, "foreign-fr", None)
    foreign_img = image(gcp, "foreign-img", None)
    age_ledger(db)

    groups = groups_of(cycle(db, gcp, "report"))

    assert group_of(groups, rule["id"]) == {"members": {rule["id"]: "forwarding-rule", ip["id"]: "address"},
                                            "verdict": "orphan", "reason": "owner_deleted"}
    assert group_of(groups, img["id"]) == {"members": {img["id"]: "image"}, "verdict": "orphan",
                                           "reason": "owner_deleted"}
    assert group_of(groups, live_rule["id"]) == {"members": {live_rule["id"]: "forwarding-rule",
                                                             live_ip["id"]: "address"},
                                                 "verdict": "protected", "reason": "unattached_of_live_owner"}
    assert group_of(groups, live_img["id"])["verdict"] == "protected"
    assert not [g for g in groups.values() if {foreign_rule["id"], foreign_img["id"]} & set(g["members"])]
    lists = [c for c in gcp.calls if c.path.endswith(("/aggregated/forwardingRules", "/global/images"))]
    assert len(lists) == 2 and all(c.query["filter"] == "labels.provider_ref:*" for c in lists)
    assert gcp.count("DELETE") == 0


# ---- deletion ----------------------------------------------------------------------------------------

def test_an_orphan_forwarding_rule_goes_before_its_address_and_the_image_is_deleted(db, gcp):
    """Given an orphan ref's forwarding rule holding its address (IN_USE), and its image; when a delete
    cycle runs; then the rule is deleted before the address (journal and the fake's request log), the
    image is deleted, each journaled by its numeric id, and the cycle is clean."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    rule, ip = rule_on_address(gcp, "lost-fr", ref)
    img = image(gcp, "lost-img", ref)
    assert gcp.get("addresses", REGION, "lost-fr-ip")["status"] == "IN_USE"  # type: ignore[index]
    age_ledger(db)

    report = cycle(db, gcp, "delete")

    assert gcp.names("forwardingRules") == gcp.names("addresses") == set() and gcp.image_names() == set()
    calls = intents(db)
    assert calls.index(("compute.forwardingRules.delete", rule["id"])) < calls.index(("compute.addresses.delete",
                                                                                       ip["id"]))
    assert ("compute.images.delete", img["id"]) in calls
    paths = deletes(gcp)
    assert paths.index(f"/compute/v1/projects/{gcp.project}/regions/{REGION}/forwardingRules/lost-fr") \
        < paths.index(f"/compute/v1/projects/{gcp.project}/regions/{REGION}/addresses/lost-fr-ip")
    assert f"/compute/v1/projects/{gcp.project}/global/images/lost-img" in paths
    assert report.outcome == "clean"


def test_an_address_a_forwarding_rule_outside_the_group_uses_is_left_in_use(db, gcp):
    """Given an orphan ref's address used by a forwarding rule of a live owner; when a delete cycle
    runs; then the address is left (in_use), the rule untouched, nothing deleted."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    live, _ = live_ref(ledger, gcp)
    ip = gcp.add_address("lost-ip", region=REGION, labels=labels(ref))
    gcp.add_forwarding_rule("live-fr", region=REGION, labels=labels(live), address="lost-ip")
    age_ledger(db)

    report = cycle(db, gcp, "delete")

    assert gcp.names("addresses") == {"lost-ip"} and gcp.names("forwardingRules") == {"live-fr"}
    assert gcp.count("DELETE") == 0
    [recorded] = delete_results(db, report.cycle_id)
    assert skip_reasons(recorded) == {ip["id"]: "in_use"}
    assert report.outcome == "unsettled"


@pytest.mark.parametrize("protected", ["rule", "image"])
def test_a_protect_label_keeps_the_whole_group(db, gcp, protected):
    """Given an orphan ref's forwarding rule on its address and an image of the same zone's disk,
    one of them carrying the protect label; when a delete cycle runs; then its group is kept whole
    (the protected rule keeps its address too), nothing of that group is deleted."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    rule_on_address(gcp, "lost-fr", ref, protect=protected == "rule")
    image(gcp, "lost-img", ref, protect=protected == "image")
    age_ledger(db)

    cycle(db, gcp, "delete")

    if protected == "rule":
        assert gcp.names("forwardingRules") == {"lost-fr"} and gcp.names("addresses") == {"lost-fr-ip"}
        assert gcp.image_names() == set()  # its own group, not protected
    else:
        assert gcp.image_names() == {"lost-img"}
        assert gcp.names("forwardingRules") == gcp.names("addresses") == set()


def test_a_forwarding_rule_whose_name_was_reused_before_the_call_is_not_deleted(db, gcp):
    """Given an orphan ref's forwarding rule on its address; when, right before the deleter's get by
    name (after its read by id), the rule is replaced by another of the same name (a new id); then
    neither is deleted, nor the address it holds: the name no longer names the id read."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    rule, ip = rule_on_address(gcp, "lost-fr", ref)
    age_ledger(db)
    new: dict[str, Any] = {}

    def arm() -> None:
        gcp.before_request("GET", f"/regions/{REGION}/forwardingRules/lost-fr",
                           lambda: new.update(gcp.replace("forwardingRules", REGION, "lost-fr")))

    report = cycle(db, gcp, "delete", between=arm)

    assert new and new["id"] != rule["id"]
    assert gcp.get("forwardingRules", REGION, "lost-fr")["id"] == new["id"]  # type: ignore[index]
    assert gcp.names("addresses") == {"lost-fr-ip"}
    assert gcp.count("DELETE") == 0
    assert intents(db) == []
    # the rule is left as replaced; its address waits for it (depends_on): the cycle is unsettled
    [recorded] = delete_results(db, report.cycle_id)
    assert skip_reasons(recorded) == {rule["id"]: "replaced"}
    assert set(recorded["result"]["pending"]) == {rule["id"], ip["id"]}
    assert report.outcome == "unsettled"


def test_an_image_whose_name_was_reused_before_the_call_is_not_deleted(db, gcp):
    """Given an orphan ref's image; when, right before the deleter's get by name, another image of
    that name (a new id) replaces it; then no image is deleted."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    img = image(gcp, "lost-img", ref)
    age_ledger(db)
    new: dict[str, Any] = {}

    def arm() -> None:
        gcp.before_request("GET", "/global/images/lost-img",
                           lambda: new.update(gcp.replace_image("lost-img")))

    report = cycle(db, gcp, "delete", between=arm)

    assert new and new["id"] != img["id"]
    assert gcp.image("lost-img")["id"] == new["id"]  # type: ignore[index]
    assert gcp.count("DELETE") == 0 and intents(db) == []
    [recorded] = delete_results(db, report.cycle_id)
    assert skip_reasons(recorded) == {img["id"]: "replaced"}
    assert report.outcome == "unsettled"


def test_an_image_made_from_no_disk_is_not_listed(db, gcp):
    """Given an orphan ref's image made from no disk (a file or a snapshot: no sourceDisk); when a
    delete cycle runs; then it is not listed and not deleted (it cannot be placed in a zone)."""
    ledger = setup(db, gcp)
    ref = gone_ref(ledger)
    img = gcp.add_image("raw-img", labels=labels(ref), source_disk="")
    age_ledger(db)

    report = cycle(db, gcp, "delete")

    assert gcp.image_names() == {"raw-img"} and gcp.count("DELETE") == 0
    assert img["id"] not in {r["id"] for g in report.c3()["groups"] for r in g["resources"]}
