"""Pure parts of the GCP adapter: kind table, state maps, conversion, operation
handling, composition (no sockets: clients are built, never called)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.cloud.compute_v1.types import compute

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.errors import ConfigError, DependencyNotReady, ProviderError, ProviderThrottled
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.providers.gcp.calls import GcpCalls
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.kinds import (
    AFTER_DELETE,
    INSTANCE_STATES,
    KIND_BY_RESOURCE,
    KINDS,
    SNAPSHOT_PROGRESS,
    link_key,
    listed_kinds,
    region_of,
    source_zone,
)
from orphan_cleanup.providers.gcp.listing import to_resource
from orphan_cleanup.providers.gcp.provider import GcpProvider
from orphan_cleanup.providers.gcp.snapshots import facts_of, snapshot_labels, snapshot_name
from orphan_cleanup.providers.operations import delete_order
from orphan_cleanup.providers.snapshots import expired

LINK = "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances/vm"


def test_kind_table_declares_instances_disks_addresses_rules_images_snapshots() -> None:
    assert [(k.kind, k.scope, k.primary, k.retained) for k in KINDS] == [
        (ResourceKind.INSTANCE, "zone", True, False), (ResourceKind.DISK, "zone", False, False),
        (ResourceKind.ADDRESS, "region", False, False), (ResourceKind.FORWARDING_RULE, "region", False, False),
        (ResourceKind.IMAGE, "global", False, False), (ResourceKind.SNAPSHOT, "global", False, True)]


def test_an_address_is_deleted_after_the_forwarding_rules_that_use_it() -> None:
    order = delete_order(KINDS)
    assert order.index(ResourceKind.FORWARDING_RULE) < order.index(ResourceKind.ADDRESS)
    assert order.index(ResourceKind.INSTANCE) < order.index(ResourceKind.FORWARDING_RULE)
    assert order.index(ResourceKind.INSTANCE) < order.index(ResourceKind.IMAGE)
    assert KIND_BY_RESOURCE[ResourceKind.FORWARDING_RULE].collection == "forwardingRules"


@pytest.mark.parametrize("status", sorted(INSTANCE_STATES))
def test_every_listed_instance_status_is_an_existing_vm(status: str) -> None:
    # TERMINATED is a stopped VM in GCE: it still exists and is never "gone".
    vm = compute.Instance(id=1, name="vm", status=status)
    assert KIND_BY_RESOURCE[ResourceKind.INSTANCE].state(vm) is ResourceState.ACTIVE


def test_only_stopping_or_stopped_confirm_a_delete() -> None:
    assert set(AFTER_DELETE) == {"STOPPING", "TERMINATED"}
    assert "RUNNING" not in AFTER_DELETE


@pytest.mark.parametrize(
    ("kind", "item", "state"),
    [
        (ResourceKind.DISK, compute.Disk(status="READY", users=[LINK]), ResourceState.ACTIVE),
        (ResourceKind.DISK, compute.Disk(status="READY"), ResourceState.AVAILABLE),
        (ResourceKind.ADDRESS, compute.Address(status="IN_USE", users=[LINK]), ResourceState.ACTIVE),
        (ResourceKind.ADDRESS, compute.Address(status="RESERVED"), ResourceState.AVAILABLE),
    ],
)
def test_dependent_states(kind: ResourceKind, item: Any, state: ResourceState) -> None:
    spec = KIND_BY_RESOURCE[kind]
    assert spec.state(item) is state
    assert spec.in_use(item) is (state is ResourceState.ACTIVE)


@pytest.mark.parametrize(("loc", "region"), [("us-central1-a", "us-central1"), ("us-central1", "us-central1"),
                                             ("northamerica-northeast1-b", "northamerica-northeast1"),
                                             ("us-central1-ai1a", "us-central1")])
def test_region_of(loc: str, region: str) -> None:
    assert region_of(loc) == region


def test_to_resource_uses_numeric_id_and_maps_users_to_instance_ids() -> None:
    other_host = "http://127.0.0.1:9/compute/v1/projects/p/zones/us-central1-a/instances/vm"
    disk = compute.Disk(id=18446744073709551615, name="vm-data", status="READY", users=[other_host],
                        labels={"provider_ref": "aaaaaaaaaaa1"}, creation_timestamp="2024-05-01T10:00:00.000-07:00",
                        self_link="https://x/projects/p/zones/us-central1-a/disks/vm-data")
    res = to_resource(KIND_BY_RESOURCE[ResourceKind.DISK], "us-central1-a", disk, {link_key(LINK): "42"})
    assert (res.id, res.attached_to, res.region) == ("18446744073709551615", "42", "us-central1-a")
    assert res.details["name"] == "vm-data" and res.details["zone"] == "us-central1-a"
    assert res.created_at is not None and res.created_at.utcoffset() is not None


class _Ops:
    def __init__(self, *ops: compute.Operation) -> None:
        self.ops = list(ops)

    def wait(self, request: dict[str, str], timeout: float, retry: Any) -> compute.Operation:
        return self.ops.pop(0)


class _Client:
    def __init__(self, op: compute.Operation) -> None:
        self.op = op

    def delete_unary(self, request: dict[str, str], timeout: float, retry: Any) -> compute.Operation:
        return self.op


def _calls(op: compute.Operation, *later: compute.Operation) -> GcpCalls:
    return GcpCalls("p", {"disks": _Client(op)}, {"zone": _Ops(*later)}, timeout=1, operation_timeout=5,
                    page_size=10, retry=None, sleep=lambda s: None)


def _failed(code: str, http: int = 400) -> compute.Operation:
    return compute.Operation(name="op", status="DONE", http_error_status_code=http,
                             error=compute.Error(errors=[compute.Errors(code=code)]))


def test_operation_error_in_use_is_dependency_not_ready() -> None:
    with pytest.raises(DependencyNotReady):
        _calls(compute.Operation(name="op", status="RUNNING"), _failed("RESOURCE_IN_USE_BY_ANOTHER_RESOURCE")) \
            .delete(KIND_BY_RESOURCE[ResourceKind.DISK], "us-central1-a", "d", target="1")


def test_operation_error_is_translated_by_http_status() -> None:
    with pytest.raises(ProviderThrottled):
        _calls(_failed("QUOTA_EXCEEDED", 429)).delete(KIND_BY_RESOURCE[ResourceKind.DISK], "us-central1-a", "d", target="1")
    with pytest.raises(ProviderError):
        _calls(_failed("SOMETHING", 0)).delete(KIND_BY_RESOURCE[ResourceKind.DISK], "us-central1-a", "d", target="1")


def test_operation_not_found_means_already_gone() -> None:
    _calls(_failed("RESOURCE_NOT_FOUND", 404)).delete(KIND_BY_RESOURCE[ResourceKind.DISK], "us-central1-a", "d", target="1")


def test_endpoint_clients_all_target_the_endpoint_over_http() -> None:
    clients = build_gcp_clients(BackendSettings(), endpoint="http://127.0.0.1:8123")
    assert set(clients) == {"instances", "disks", "addresses", "zone_operations", "region_operations", "projects",
                            "snapshots", "global_operations", "forwarding_rules", "images"}
    assert {c.transport._host for c in clients.values()} == {"http://127.0.0.1:8123"}


@pytest.mark.parametrize("endpoint", ["127.0.0.1:8123", "ftp://host:1", "http://"])
def test_bad_endpoint_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError):
        build_gcp_clients(BackendSettings(), endpoint=endpoint)


def test_bad_credentials_json_is_a_config_error() -> None:
    # The model refuses such a key (BackendSettings); the adapter checks again, for settings
    # built without validation.
    with pytest.raises(ConfigError):
        build_gcp_clients(BackendSettings.model_construct(credentials_json='{"type": "service_account"}'),
                          endpoint=None)


@pytest.mark.parametrize(("provider", "tag_key"), [("aws", "provider_ref"), ("gcp", "Provider Ref")])
def test_provider_rejects_bad_backends(provider: str, tag_key: str) -> None:
    # The model refuses a GCP label key like this one (core.backends.Backend); the adapter checks
    # again, for a Backend built without validation.
    backend = Backend.model_construct(id="b", provider=provider, account="p", regions=("us-central1",),
                                      settings=BackendSettings(tag_key=tag_key), mode=None)
    clients = dict.fromkeys(("instances", "disks", "addresses", "zone_operations", "region_operations", "projects"))
    with pytest.raises(ConfigError):
        GcpProvider(backend, **clients)


def test_project_defaults_to_account_and_settings_override() -> None:
    clients = dict.fromkeys(("instances", "disks", "addresses", "zone_operations", "region_operations", "projects"))
    # No region (the model refuses that for a row; built here without validation): lists nothing.
    plain = Backend.model_construct(id="b", provider="gcp", account="acct", regions=(), settings=BackendSettings(),
                                    mode=None)
    assert GcpProvider(plain, **clients).project == "acct"
    other = plain.model_copy(update={"settings": BackendSettings(project="proj")})
    assert GcpProvider(other, **clients).project == "proj"
    assert list(GcpProvider(plain, **clients).iter_listing()) == []


# ---- snapshots (issue #15 item 4) ------------------------------------------------------

SNAP = KIND_BY_RESOURCE[ResourceKind.SNAPSHOT]
SOURCE_LINK = "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/disks/d"


@pytest.mark.parametrize(("status", "state", "in_use"), [
    ("READY", ResourceState.AVAILABLE, False), ("FAILED", ResourceState.AVAILABLE, False),
    ("CREATING", ResourceState.ACTIVE, True), ("UPLOADING", ResourceState.ACTIVE, True),
    ("DELETING", ResourceState.TERMINATING, True), ("SOMETHING_NEW", ResourceState.ACTIVE, True),
    ("", ResourceState.ACTIVE, True)])
def test_snapshot_states_unknown_ones_exist_and_may_be_in_use(status: str, state: ResourceState,
                                                              in_use: bool) -> None:
    snap = compute.Snapshot(id=1, name="s", status=status)
    assert SNAP.state(snap) is state and SNAP.in_use(snap) is in_use


def test_only_ready_lets_a_disk_go_and_only_creating_or_uploading_is_not_yet() -> None:
    assert SNAPSHOT_PROGRESS == {"READY": "ready", "CREATING": "pending", "UPLOADING": "pending"}


def test_snapshots_are_listed_only_when_they_can_expire() -> None:
    assert SNAP not in listed_kinds(None) and SNAP in listed_kinds(7)
    assert [k for k in listed_kinds(None)] == [k for k in KINDS if k is not SNAP]


@pytest.mark.parametrize(("link", "zone"), [
    (SOURCE_LINK, "us-central1-a"), ("projects/p/zones/europe-west1-b/disks/d", "europe-west1-b"),
    ("projects/p/regions/us-central1/disks/d", None), ("", None), ("zones/us-central1-a", None),
    ("https://x/projects/p/zones/us-central1-a/disks/d/extra", None)])
def test_a_snapshot_is_placed_by_its_source_disks_zone(link: str, zone: str | None) -> None:
    assert source_zone(compute.Snapshot(source_disk=link)) == zone


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("created", "is_expired"), [
    ((NOW - timedelta(days=7)).isoformat(), True),
    ((NOW - timedelta(days=7) + timedelta(seconds=1)).isoformat(), False),
    ("2026-11-01T00:00:00.000-07:00", True), ("", False), ("yesterday", False), ("2026-11-01T00:00:00", False)],
    ids=["at-retention", "just-younger", "old-pacific", "none", "not-a-time", "naive"])
def test_a_snapshot_expires_only_with_a_readable_creation_older_than_the_retention(created: str,
                                                                                  is_expired: bool) -> None:
    assert expired(facts_of(compute.Snapshot(creation_timestamp=created)).created_at, retain_days=7,
                   now=NOW) is is_expired


def test_snapshot_names_and_labels_are_valid_gcp_values() -> None:
    name = snapshot_name("abcdefabcdef", "18446744073709551615")
    assert name == "oc-abcdefabcdef-18446744073709551615" and len(name) <= 63
    assert snapshot_labels("provider_ref", "abcdefabcdef", "123") == {
        "provider_ref": "abcdefabcdef", "orphan-cleanup-source": "123"}
    with pytest.raises(ProviderError):
        snapshot_name("abcdefabcdef", "Not An Id")
    with pytest.raises(ProviderError):
        snapshot_labels("provider_ref", "abcdefabcdef", "UPPER")


def test_a_listed_snapshot_is_addressed_globally_and_placed_in_its_zone() -> None:
    snap = compute.Snapshot(id=42, name="s", status="READY", labels={"provider_ref": "abcdefabcdef"},
                            source_disk=SOURCE_LINK, source_disk_id="7", creation_timestamp="2026-01-01T00:00:00+00:00")
    res = to_resource(SNAP, "us-central1-a", snap, {})
    assert res.kind is ResourceKind.SNAPSHOT and res.id == "42" and res.region == "us-central1-a"
    assert res.details["global"] == "global" and res.details["zone"] == "us-central1-a"
    assert res.state is ResourceState.AVAILABLE and res.attached_to is None


def test_the_snapshot_settings_need_the_snapshot_clients() -> None:
    clients = build_gcp_clients(BackendSettings(), endpoint="http://127.0.0.1:8123")
    backend = Backend(id="g", provider="gcp", account="acct", regions=("us-central1",),
                      settings={"snapshot_before_delete": True})
    GcpProvider(backend, **clients)
    with pytest.raises(ConfigError, match="snapshot"):
        GcpProvider(backend, **{**clients, "snapshots": None})


def test_a_key_file_path_gives_its_service_account_and_a_missing_file_is_one_line(tmp_path) -> None:
    from tests.integration.test_cli_lifecycle import service_account_key

    path = tmp_path / "sa-key.json"
    path.write_text(service_account_key())
    clients = build_gcp_clients(BackendSettings(credentials_file=str(path)), endpoint=None)
    creds = clients["instances"]._transport._credentials
    assert creds.service_account_email == "cleanup@my-project-42.iam.gserviceaccount.com"
    with pytest.raises(ConfigError) as err:
        build_gcp_clients(BackendSettings(credentials_file=str(tmp_path / "missing.json")), endpoint=None)
    assert "cannot be read" in str(err.value) and "\n" not in str(err.value)


# ---- forwarding rules and images ---------------------------------------------------------

RULE, IMAGE = KIND_BY_RESOURCE[ResourceKind.FORWARDING_RULE], KIND_BY_RESOURCE[ResourceKind.IMAGE]


def test_a_forwarding_rule_has_no_status_and_exists_while_listed() -> None:
    item = compute.ForwardingRule(id=7, name="fr", I_p_address="203.0.113.9", target="t",
                                  labels={"provider_ref": "r"},
                                  self_link="https://x/projects/p/regions/us-central1/forwardingRules/fr",
                                  creation_timestamp="2024-05-01T09:30:00.123-07:00")
    assert RULE.state(item) is ResourceState.ACTIVE and not RULE.in_use(item)
    res = to_resource(RULE, "us-central1", item, {})
    assert (res.kind, res.id, res.region, res.attached_to) == (ResourceKind.FORWARDING_RULE, "7", "us-central1", None)
    assert res.details["ip_address"] == "203.0.113.9" and res.details["status"] == ""
    assert res.created_at is not None


@pytest.mark.parametrize(("status", "state"), [
    ("READY", ResourceState.AVAILABLE), ("FAILED", ResourceState.AVAILABLE), ("PENDING", ResourceState.ACTIVE),
    ("DELETING", ResourceState.TERMINATING), ("SOMETHING_NEW", ResourceState.ACTIVE)])
def test_image_statuses(status: str, state: ResourceState) -> None:
    item = compute.Image(id=8, name="img", status=status)
    assert IMAGE.state(item) is state and not IMAGE.in_use(item)


def test_an_image_is_placed_by_its_source_disk_and_addressed_globally() -> None:
    item = compute.Image(id=8, name="img", status="READY", source_disk=SOURCE_LINK, source_disk_id="5",
                         self_link="https://x/projects/p/global/images/img", labels={"provider_ref": "r"})
    assert source_zone(item) == "us-central1-a"
    res = to_resource(IMAGE, "us-central1-a", item, {})
    assert res.region == res.details["zone"] == "us-central1-a" and res.details["global"] == "global"
    assert source_zone(compute.Image(id=9, name="raw", source_snapshot="projects/p/global/snapshots/s")) is None
