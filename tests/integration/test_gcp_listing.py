"""GcpProvider listing: the real google-cloud-compute client against the fake Compute server."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.provider import GcpProvider, build_gcp_provider
from tests.support.gcp_fake import FakeCompute
from tests.support.listing import collect

REF_A, REF_B, REF_C = "aaaaaaaaaaa1", "bbbbbbbbbbb2", "ccccccccccc3"


def provider(gcp: FakeCompute, *regions: str, **kw: object) -> GcpProvider:
    backend = Backend(id="gcp-test", provider="gcp", account=gcp.project, regions=regions)
    kw.setdefault("timeout", 5.0)
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url), **kw)  # type: ignore[arg-type]


def by_region(p: GcpProvider) -> dict[str, object]:
    return {r.region: r for r in p.iter_listing()}


def test_lists_groups_over_pages_with_failures_isolated(gcp: FakeCompute) -> None:
    # Given: an owner with disks and an address, a second owner, leftovers, noise
    vm_a = gcp.add_instance("a", zone="us-central1-a", labels={"provider_ref": REF_A})
    boot = gcp.add_disk("a-boot", zone="us-central1-a", labels={"provider_ref": REF_A}, attached_to="a", boot=True)
    ip = gcp.add_address("a-ip", region="us-central1", labels={"provider_ref": REF_A}, attached_to="a")
    vm_b = gcp.add_instance("b", zone="us-central1-c", labels={"provider_ref": REF_B}, status="TERMINATED")
    left = gcp.add_disk("c-data", zone="europe-west1-d", labels={"provider_ref": REF_C})
    gcp.add_instance("not-ours", zone="us-central1-a")  # no label: the filter never returns it
    bad = gcp.add_disk("bad-ref", zone="us-central1-a", labels={"provider_ref": "short"})
    for n in range(12):  # enough to need several pages of 4
        gcp.add_instance(f"filler-{n}", zone="us-west1-a", labels={"provider_ref": REF_C})
    gcp.add_instance("x", zone="asia-east1-a", labels={"provider_ref": REF_A})
    gcp.make_unreachable("asia-east1-b")
    gcp.add_instance("y", zone="us-east1-b", labels={"provider_ref": REF_B})
    gcp.fail_region("us-east1")

    # When
    listing = by_region(provider(gcp, "us-central1", "europe-west1", "asia-east1", "us-east1-b", page_size=4))

    # Then: exact groups for the healthy regions
    central = listing["us-central1"]
    assert central.failure is None
    groups = {g.primary_id: g for g in central.groups if not g.malformed_ref}
    assert set(groups) == {vm_a["id"], vm_b["id"]}
    # a label value that is not a ref: shown as its own group, never one of ours
    assert [(g.provider_ref, g.primary_id, g.resource_ids()) for g in central.groups if g.malformed_ref] == [
        ("short", None, [bad["id"]])]
    a = groups[vm_a["id"]]
    assert (a.provider_ref, a.region) == (REF_A, "us-central1-a")
    assert {(r.kind, r.id) for r in a.resources} == {
        (ResourceKind.INSTANCE, vm_a["id"]), (ResourceKind.DISK, boot["id"]), (ResourceKind.ADDRESS, ip["id"])}
    disk = next(r for r in a.resources if r.kind is ResourceKind.DISK)
    assert disk.attached_to == vm_a["id"] and disk.details["name"] == "a-boot" and disk.details["zone"] == "us-central1-a"
    assert next(r for r in a.resources if r.kind is ResourceKind.ADDRESS).details["region"] == "us-central1"
    stopped = groups[vm_b["id"]].primary
    assert stopped is not None and stopped.state is ResourceState.ACTIVE  # TERMINATED = stopped, still exists
    europe = listing["europe-west1"]
    assert europe.failure is None
    assert [(g.primary_id, g.region, g.resource_ids()) for g in europe.groups] == [(None, "europe-west1-d", [left["id"]])]
    # and failures for the unreachable zone's region and the failing region
    assert "UNREACHABLE" in (listing["asia-east1"].failure or "") and not listing["asia-east1"].groups
    assert "us-east1-b" in (listing["us-east1-b"].failure or "")
    # and the label filter on every list call, several pages each
    lists = [c for c in gcp.calls if "/aggregated/" in c.path]
    assert {c.query.get("filter") for c in lists} == {"labels.provider_ref:*"}
    assert gcp.count("GET", "/aggregated/instances") >= 4
    assert all(c.query.get("maxResults") == "4" for c in lists)


def test_fake_rejects_a_list_without_label_filter(gcp: FakeCompute) -> None:
    clients = build_gcp_clients(BackendSettings(), endpoint=gcp.url)
    with pytest.raises(gexc.BadRequest):
        list(clients["instances"].aggregated_list(request={"project": gcp.project}, timeout=5, retry=None))


def test_custom_tag_key_is_the_filter(gcp: FakeCompute) -> None:
    vm = gcp.add_instance("a", labels={"owner_ref": REF_A, "provider_ref": REF_B})
    backend = Backend(id="g", provider="gcp", account="ignored", regions=["us-central1"],
                      settings=BackendSettings(tag_key="owner_ref", project=gcp.project))
    listing = collect(build_gcp_provider(backend, endpoint=gcp.url, timeout=5))
    assert [(g.provider_ref, g.primary_id) for g in listing.groups] == [(REF_A, vm["id"])]
    assert {c.query["filter"] for c in gcp.calls} == {"labels.owner_ref:*"}


def test_failed_list_call_fails_every_region_without_retrying_503(gcp: FakeCompute) -> None:
    gcp.add_instance("a", labels={"provider_ref": REF_A})
    gcp.add_fault("GET", "/aggregated/disks", status=503)
    listing = collect(provider(gcp, "us-central1", "europe-west1"))
    assert listing.groups == ()
    assert {f.region for f in listing.failures} == {"us-central1", "europe-west1"}
    assert all("ProviderUnavailable" in f.error for f in listing.failures)
    assert gcp.count("GET", "/aggregated/disks") == 1


def test_throttled_list_is_retried(gcp: FakeCompute) -> None:
    vm = gcp.add_instance("a", labels={"provider_ref": REF_A})
    gcp.add_fault("GET", "/aggregated/instances", status=429, times=1)
    listing = collect(provider(gcp, "us-central1"))
    assert listing.failures == () and [g.primary_id for g in listing.groups] == [vm["id"]]
    assert gcp.count("GET", "/aggregated/instances") == 2


def test_slow_list_times_out_as_a_failure(gcp: FakeCompute) -> None:
    gcp.add_fault("GET", "/aggregated/addresses", status=None, delay=1.0)
    listing = collect(provider(gcp, "us-central1", timeout=0.3))
    assert [f.region for f in listing.failures] == ["us-central1"]
    assert "ProviderTimeout" in listing.failures[0].error


def test_zone_entry_keeps_its_instances_and_their_addresses_only(gcp: FakeCompute) -> None:
    vm = gcp.add_instance("a", zone="us-central1-a", labels={"provider_ref": REF_A})
    ip = gcp.add_address("a-ip", region="us-central1", labels={"provider_ref": REF_A}, attached_to="a")
    gcp.add_instance("b", zone="us-central1-b", labels={"provider_ref": REF_B})
    gcp.add_address("spare", region="us-central1", labels={"provider_ref": REF_C})
    listing = by_region(provider(gcp, "us-central1-a"))
    (group,) = listing["us-central1-a"].groups
    assert (group.primary_id, set(group.resource_ids())) == (vm["id"], {vm["id"], ip["id"]})


def test_instances_sharing_a_ref_are_two_groups_and_address_users_map_to_ids(gcp: FakeCompute) -> None:
    one = gcp.add_instance("one", zone="europe-west1-b", labels={"provider_ref": REF_A})
    two = gcp.add_instance("two", zone="europe-west1-c", labels={"provider_ref": REF_A})
    ip = gcp.add_address("two-ip", region="europe-west1", labels={"provider_ref": REF_A}, attached_to="two")
    groups = {g.primary_id: g for g in collect(provider(gcp, "europe-west1")).groups}
    assert set(groups) == {one["id"], two["id"]}
    assert set(groups[two["id"]].resource_ids()) == {two["id"], ip["id"]}
    assert groups[two["id"]].region == "europe-west1-c"


def test_unknown_region_is_a_failure_not_an_empty_listing(gcp: FakeCompute) -> None:
    listing = by_region(provider(gcp, "us-central1", "us-centrall"))
    assert listing["us-central1"].failure is None
    assert "no such zone or region" in (listing["us-centrall"].failure or "")
