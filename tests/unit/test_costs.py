"""Size facts as the GCP listing reads them (real compute protos), a group's size from its
recorded resources, and the cost estimate at the operator's prices."""

from __future__ import annotations

import pytest
from google.cloud.compute_v1.types import compute
from pydantic import ValidationError

from orphan_cleanup.core.backends import BackendSettings
from orphan_cleanup.core.costs import Prices, accrued, cost_per_hour, size_of
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.providers.gcp.kinds import KIND_BY_RESOURCE
from orphan_cleanup.providers.gcp.listing import to_resource

ZONE = "us-central1-a"
BASE = "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a"


def _gcp_group() -> list[dict]:
    vm = compute.Instance(id=7, name="vm", status="RUNNING", self_link=f"{BASE}/instances/vm",
                          machine_type=f"{BASE}/machineTypes/a2-highgpu-2g",
                          guest_accelerators=[compute.AcceleratorConfig(accelerator_count=2,
                                                                        accelerator_type="nvidia-tesla-a100")])
    disk = compute.Disk(id=8, name="vm", status="READY", size_gb=200, users=[f"{BASE}/instances/vm"],
                        self_link=f"{BASE}/disks/vm")
    address = compute.Address(id=9, name="ip", status="RESERVED", address="34.1.2.3",
                              self_link="https://x/projects/p/regions/us-central1/addresses/ip")
    resources = [to_resource(KIND_BY_RESOURCE[ResourceKind.INSTANCE], ZONE, vm, {}),
                 to_resource(KIND_BY_RESOURCE[ResourceKind.DISK], ZONE, disk, {}),
                 to_resource(KIND_BY_RESOURCE[ResourceKind.ADDRESS], "us-central1", address, {})]
    return [r.model_dump(mode="json") for r in resources]


def test_the_gcp_listing_reads_machine_type_gpus_disk_size_and_address():
    assert size_of(_gcp_group()) == {"instance_type": "a2-highgpu-2g", "gpus": 2, "disk_gb": 200,
                                     "addresses": ["34.1.2.3"]}


def test_aws_details_give_instance_type_volume_sizes_and_public_ips():
    resources = [{"kind": "instance", "id": "i-1", "details": {"InstanceType": "p3.2xlarge"}},
                 {"kind": "volume", "id": "vol-1", "details": {"Size": 100, "VolumeType": "gp3"}},
                 {"kind": "volume", "id": "vol-2", "details": {"Size": 8}},
                 {"kind": "address", "id": "eipalloc-1", "details": {"PublicIp": "3.3.3.3"}},
                 {"kind": "network-interface", "id": "eni-1", "details": {}}]
    assert size_of(resources) == {"instance_type": "p3.2xlarge", "disk_gb": 108, "addresses": ["3.3.3.3"]}
    assert size_of([{"kind": "instance", "id": "i-2"}]) == {}  # a row recorded before sizes were read


@pytest.mark.parametrize("size, prices, per_hour, unpriced", [
    ({"instance_type": "p3.2xlarge", "disk_gb": 73, "addresses": ["1.1.1.1"]},
     Prices(instance_hour={"p3.2xlarge": 3.06}, disk_gb_month=0.1, address_hour=0.005), 3.06 + 0.01 + 0.005, []),
    ({"instance_type": "m5.large", "disk_gb": 10}, Prices(instance_hour={"p3.2xlarge": 3.06}), 0.0,
     ["instance_type:m5.large", "disk"]),
    ({"disk_gb": 730}, Prices(disk_gb_month=0.08), 0.08, []),
    ({}, Prices(instance_hour={"m5.large": 1}), 0.0, []),
], ids=["all priced", "nothing priced", "a leftover volume", "nothing to price"])
def test_cost_per_hour(size, prices, per_hour, unpriced):
    got, missing = cost_per_hour(size, prices)
    assert got == pytest.approx(per_hour) and missing == unpriced


def test_accrued_is_the_hourly_cost_over_the_time_open():
    assert accrued(2.0, 5400) == pytest.approx(3.0)
    assert accrued(2.0, -5) == 0.0


@pytest.mark.parametrize("prices", [{"instance_hour": {"m5.large": -1}}, {"disk_gb_month": -0.1},
                                    {"instance_hour": {"m5.large": "cheap"}}, {"per_gpu": 1}])
def test_a_bad_price_table_is_refused_by_the_settings(prices):
    with pytest.raises(ValidationError):
        BackendSettings.from_input({"prices": prices})
    assert BackendSettings.from_input({"prices": {"instance_hour": {"m5.large": 0.096}}}).prices == Prices(
        instance_hour={"m5.large": 0.096})


# ---- the report's pricing and since when a group is an orphan (C3 report) -------------------------

def test_pricing_summed_hours_equals_summing_each_orphans_cost():
    # given orphans of one type with different disks and addresses, and their hours
    from orphan_cleanup.core.costs import cost_of_hours

    prices = Prices(instance_hour={"m5.large": 0.096}, disk_gb_month=0.08, address_hour=0.005)
    orphans = [({"instance_type": "m5.large", "disk_gb": 100, "addresses": ["1.1.1.1"]}, 3.0),
               ({"instance_type": "m5.large", "disk_gb": 8}, 10.5),
               ({"instance_type": "m5.large", "addresses": ["2.2.2.2", "3.3.3.3"]}, 0.25)]
    one_by_one = sum(cost_per_hour(size, prices)[0] * hours for size, hours in orphans)

    # when the sums are priced at once
    summed = cost_of_hours(prices, instance_type="m5.large", hours=sum(h for _, h in orphans),
                           disk_gb_hours=sum(s.get("disk_gb", 0) * h for s, h in orphans),
                           address_hours=sum(len(s.get("addresses", ())) * h for s, h in orphans))

    # then it is the same figure; a type without a price adds nothing, as cost_per_hour says
    assert summed == pytest.approx(one_by_one, rel=1e-12)
    assert cost_of_hours(prices, instance_type="p3.2xlarge", hours=5) == 0.0
    assert cost_of_hours(Prices(), instance_type=None, hours=5, disk_gb_hours=10, address_hours=1) == 0.0


def test_an_orphan_begins_at_its_owners_end_never_before_its_creation():
    from datetime import UTC, datetime, timedelta

    from orphan_cleanup.core.costs import listed_creation, orphan_since

    t = datetime(2026, 5, 1, tzinfo=UTC)
    created = {"i-1": t, "vol-1": t - timedelta(days=1)}
    assert listed_creation(created, "i-1") == t  # the primary's creation
    assert listed_creation(created, None) == t - timedelta(days=1)  # leftovers: the oldest
    assert listed_creation({}, "i-1") is None
    assert orphan_since(t, t + timedelta(hours=2)) == t + timedelta(hours=2)  # the owner's end
    assert orphan_since(t, t - timedelta(hours=2)) == t  # an owner that ended before this VM: a lost attempt
    assert orphan_since(t, None) == t  # a live owner (a retry leak) or a row that is gone
    assert orphan_since(None, t) == t and orphan_since(None, None) is None
