"""SAFETY.md rule 14 on GCP: the real google-cloud-compute client against the fake
Compute server. A managed instance group's member (metadata ``created-by``) and an
instance with ``deletionProtection`` are seen by the listing, checked again by the
delete's re-read, and never deleted; a reply whose fields do not fit the API's
types fails the listing (fail closed), never yields an orphan."""

from __future__ import annotations

from typing import Any

import pytest

from orphan_cleanup.core.verdicts import DeleteStatus
from tests.integration.test_gcp_delete import REF, ZONE, listed_group, owner_group, provider
from tests.support.gcp_fake import FakeCompute
from tests.support.listing import collect


def test_the_listing_records_a_mig_member_and_deletion_protection(gcp: FakeCompute) -> None:
    gcp.add_instance("mig-1", zone=ZONE, labels={"provider_ref": REF}, created_by="web",
                     metadata={"startup-script": "true"})
    gcp.add_instance("guarded", zone=ZONE, labels={"provider_ref": REF}, deletion_protection=True)
    gcp.add_instance("plain", zone=ZONE, labels={"provider_ref": REF}, metadata={"ssh-keys": "x"})

    listing = collect(provider(gcp))

    by_name = {r.details["name"]: r for g in listing.groups for r in g.resources}
    number = gcp.number_of()
    assert by_name["mig-1"].controller == f"mig:projects/{number}/zones/{ZONE}/instanceGroupManagers/web"
    assert by_name["mig-1"].protection is None
    assert by_name["guarded"].protection == "deletion_protection" and by_name["guarded"].controller is None
    assert by_name["plain"].controller is None and by_name["plain"].protection is None


@pytest.mark.parametrize("change, reason", [
    ({"metadata": {"kind": "compute#metadata", "fingerprint": "x", "items": [
        {"key": "created-by", "value": "projects/1/zones/us-central1-a/instanceGroupManagers/web"}]}},
     "managed_by_controller"),
    ({"deletionProtection": True}, "deletion_protection"),
], ids=["joined-a-mig", "protected"])
def test_the_re_read_refuses_what_became_managed_or_protected(gcp: FakeCompute, change: dict[str, Any],
                                                             reason: str) -> None:
    # Given: an orphan group listed while it was neither
    made = owner_group(gcp)
    p = provider(gcp)
    group = listed_group(p)
    # When: it changes before the delete
    for field, value in change.items():
        gcp.set_field("instances", ZONE, "vm", field, value)
    result = p.delete_resource_group(group)
    # Then: nothing is deleted, and the result says why
    assert result.status is DeleteStatus.PROTECTED and result.protection == reason
    assert made["vm"]["id"] in (result.protection_detail or "")
    assert gcp.count("DELETE") == 0 and gcp.names("instances") == {"vm"}


@pytest.mark.parametrize("field, value", [
    ("deletionProtection", "yes"),
    ("deletionProtection", {"on": True}),
    ("metadata", {"items": {"key": "created-by", "value": "x"}}),  # items not a list
    ("metadata", {"items": [{"key": "created-by", "value": 7}]}),  # created-by not a string
], ids=["protection-yes", "protection-object", "items-not-a-list", "created-by-int"])
def test_a_field_of_the_wrong_type_fails_the_listing_closed(gcp: FakeCompute, field: str, value: Any) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.set_field("instances", ZONE, "vm", field, value)

    listing = collect(provider(gcp))

    assert listing.groups == ()  # nothing to classify, let alone delete
    assert {f.region for f in listing.failures} == {"us-central1", "europe-west1"}


@pytest.mark.parametrize("field, value", [("deletionProtection", None), ("deletionProtection", ...),
                                          ("metadata", None), ("metadata", {"items": None}), ("metadata", {})],
                         ids=["protection-null", "protection-missing", "metadata-null", "items-null",
                              "metadata-empty"])
def test_absent_or_null_fields_read_as_the_api_default(gcp: FakeCompute, field: str, value: Any) -> None:
    # The API's defaults: no metadata items, deletionProtection false. The re-read checks again.
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.set_field("instances", ZONE, "vm", field, value)

    [group] = collect(provider(gcp)).groups

    assert group.primary is not None and group.primary.controller is None and group.primary.protection is None
