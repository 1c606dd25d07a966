"""Decision rules of GCP group deletion on a stubbed call layer (no sockets)."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud.compute_v1.types import compute

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import DeleteStatus
from orphan_cleanup.providers.gcp.delete import delete_group
from orphan_cleanup.providers.gcp.kinds import GcpKind

REF = "aaaaaaaaaaa1"
TAGS = {"provider_ref": REF}


class StubCalls:
    """Stands in for ``GcpCalls``: a dict of live items; ``after_delete`` sets what a delete leaves."""

    def __init__(self, items: dict[str, Any], after_delete: dict[str, Any] | None = None) -> None:
        self.items = items
        self.after_delete = after_delete or {}
        self.deletes: list[str] = []

    def get(self, spec: GcpKind, location: str, name: str) -> Any | None:
        return self.items.get(name)

    def delete(self, spec: GcpKind, location: str, name: str, **_journaled: Any) -> None:
        self.deletes.append(name)
        if name in self.after_delete and self.after_delete[name] is not None:
            self.items[name] = self.after_delete[name]
        else:
            self.items.pop(name, None)


def vm(status: str = "RUNNING", id_: int = 1, labels: dict[str, str] | None = None) -> compute.Instance:
    return compute.Instance(id=id_, name="vm", status=status, labels=TAGS if labels is None else labels)


def instance_res(**details: Any) -> Resource:
    return Resource(kind=ResourceKind.INSTANCE, id="1", region="us-central1-a", tags=TAGS,
                    details={"name": "vm", "zone": "us-central1-a", **details})


def run(calls: StubCalls, *resources: Resource, primary: str | None = "1") -> Any:
    group = ResourceGroup(provider_ref=REF, region="us-central1-a", primary_id=primary, resources=resources)
    return delete_group(calls, group, tag_key="provider_ref", protect_key="orphan-cleanup-protect")  # type: ignore[arg-type]


def test_stopped_vm_still_listed_after_its_delete_is_deleting() -> None:
    calls = StubCalls({"vm": vm("TERMINATED")}, after_delete={"vm": vm("TERMINATED")})
    result = run(calls, instance_res())
    assert (result.status, result.deleted, result.pending) == (DeleteStatus.DELETING, ("1",), ("1",))


@pytest.mark.parametrize("status", ["RUNNING", "STAGING", "PROVISIONING", "SUSPENDED", "REPAIRING"])
def test_vm_not_shutting_down_after_delete_is_an_error(status: str) -> None:
    calls = StubCalls({"vm": vm(status)}, after_delete={"vm": vm(status)})
    with pytest.raises(ProviderError, match=f"still {status}"):
        run(calls, instance_res())


def test_already_stopping_vm_is_not_deleted_twice() -> None:
    calls = StubCalls({"vm": vm("STOPPING")})
    assert run(calls, instance_res()).status is DeleteStatus.DELETING
    assert calls.deletes == []


@pytest.mark.parametrize(
    ("resource", "primary", "reason"),
    [
        (instance_res(name=""), "1", "missing_details"),
        (instance_res(), "2", "primary_missing"),
        (Resource(kind=ResourceKind.VOLUME, id="1", region="us-central1-a", tags=TAGS,
                  details={"name": "vm", "zone": "us-central1-a"}), "1", "unsupported_kind"),
    ],
)
def test_malformed_groups_touch_nothing(resource: Resource, primary: str, reason: str) -> None:
    calls = StubCalls({"vm": vm()})
    result = run(calls, resource, primary=primary)
    assert result.status is DeleteStatus.SKIPPED and calls.deletes == []
    assert reason in {s.reason for s in result.skipped}


def test_listed_tag_not_matching_group_ref_is_skipped() -> None:
    res = Resource(kind=ResourceKind.INSTANCE, id="1", region="us-central1-a", tags={"provider_ref": "zzzzzzzzzzzz"},
                   details={"name": "vm", "zone": "us-central1-a"})
    calls = StubCalls({"vm": vm()})
    assert run(calls, res).status is DeleteStatus.SKIPPED and calls.deletes == []
