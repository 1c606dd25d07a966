"""A listing batch altered in the listing queue, on both clouds (moto server, the fake
Compute server): the creation time of a VM is what makes another VM of a live owner's ref
a retry leak (created before the owner's provisioning) rather than a copy (after it), and
what the margin reads; the deleter judges both on the time the provider reports, never on
the message's (SAFETY.md rules 12 and 17). The forger replays the genuine batch (same
cycle, seq, listed_at) with the copy's creation time moved to 2000, before the genuine one
is delivered (which then applies as a duplicate)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient
from tests.contract.clouds import BACKEND, Driver
from tests.contract.conftest import driver  # noqa: F401  (the fixture)
from tests.contract.test_provider_contract import Ledger
from tests.support.seams import delete_results, query, skip_reasons

CLOUDS = pytest.mark.parametrize("cloud", ["aws", "gcp"])
FORGED_TIME = "2000-01-01T00:00:00Z"


def delete_cycle(d: Driver, edit: Callable[[dict[str, Any]], None]) -> str:
    """A manual delete cycle whose every listing batch is delivered edited first, then as listed."""
    p = d.pipeline()
    cycle_id = p.run_lister(BACKEND, mode="delete", manual=True).cycle_id
    while (body := p.listing_queue.pop()) is not None:
        doc = json.loads(body)
        edit(doc)
        p.handle_batch(ListingBatch.model_validate(doc))
        p.handle_batch(ListingBatch.model_validate_json(body))
    while (body := p.delete_queue.pop()) is not None:
        p.handle_delete(DeleteRequest.model_validate_json(body))
    return cycle_id


def groups(d: Driver, cycle_id: str) -> dict[str, tuple[str, str]]:
    """primary role -> (verdict, reason) of the cycle's recorded groups."""
    rows = query(d.db, "SELECT primary_id, verdict, reason FROM cycle_groups WHERE cycle_id = :c", c=cycle_id)
    return {d.role_of(p): (v, r) for p, v, r in rows if p is not None}


def owner_with_copy(d: Driver) -> str:
    """A busy owner recording its VM ``vm``, provisioned an hour ago, and ``copy``, a VM of
    its ref launched now ("launch more like this"). Returns the copy's id."""
    ledger = Ledger(d)
    d.add_backend()
    ref = ledger.live_owner("vm")
    ledger.age()
    return d.vm("copy", ref)


def ages_the_copy(copy_id: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for g in doc["groups"]:
            if g["primary_id"] == copy_id:
                for r in g["resources"]:
                    r["created_at"] = FORGED_TIME
    return edit


@CLOUDS
def test_a_forged_creation_time_never_deletes_a_copy(driver: Driver) -> None:  # noqa: F811
    """The forged batch makes the classifier call the copy a retry leak (``primary_mismatch``);
    the deleter re-reads the copy's creation time, finds it is not the message's, and skips."""
    copy_id = owner_with_copy(driver)
    cycle_id = delete_cycle(driver, ages_the_copy(copy_id))

    assert groups(driver, cycle_id)["copy"] == ("orphan", "primary_mismatch")  # the forgery took
    assert driver.exists("copy"), "the user's copy VM was deleted"
    assert driver.exists("vm") and driver.exists("copy.boot")
    (recorded,) = delete_results(driver.db, cycle_id)
    assert skip_reasons(recorded) == {"*": "owner_changed:created_at_changed"}, recorded
    assert driver.wire_mutations() == []


@CLOUDS
def test_control_the_genuine_batch_keeps_the_copy_protected(driver: Driver) -> None:  # noqa: F811
    owner_with_copy(driver)
    cycle_id = delete_cycle(driver, lambda doc: None)

    assert groups(driver, cycle_id) == {"vm": ("tracked", "tracked"), "copy": ("protected", "suspected_copy")}
    assert driver.exists("copy")
    assert delete_results(driver.db, cycle_id) == []


@CLOUDS
def test_control_a_genuine_retry_leak_is_still_deleted(driver: Driver) -> None:  # noqa: F811
    """A retry's first VM ``leak``, created before the owner's provisioning (margin 0: the
    ledger is not backdated, the owner is provisioned after both VMs exist): deleted, on the
    provider's creation time, which is the listing's."""
    driver.add_backend()
    client = LedgerClient(driver.db)
    issued = client.issue_ref(owner_name="vm")
    driver.vm("leak", issued.provider_ref)
    vm = driver.vm("vm", issued.provider_ref)
    client.mark_provisioning(issued.owner_id, backend_id=BACKEND, primary_id=vm, region=driver.regions[0],
                             status=OwnerStatus.BUSY)
    cycle_id = delete_cycle(driver, lambda doc: None)

    assert groups(driver, cycle_id) == {"vm": ("tracked", "tracked"), "leak": ("orphan", "primary_mismatch")}
    assert not driver.exists("leak")
    assert driver.exists("vm")
    (recorded,) = delete_results(driver.db, cycle_id)
    assert recorded["state"] == "done" and not recorded.get("skipped"), recorded
