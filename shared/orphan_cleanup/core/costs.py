"""What an orphan is (its size facts, as the listing read them) and what it costs, at
the prices the operator gives in a backend's ``prices`` setting. Pure: no I/O, no
price is ever fetched.

The estimate is the listed size at the given prices, as if it ran the whole time since
the orphan was first seen: a stopped instance is priced like a running one, and a
resource kind or type without a price adds nothing (``unpriced`` names it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

#: Hours in a month, as cloud price lists count them.
HOURS_PER_MONTH = 730


class Prices(BaseModel):
    """A backend's price table (``settings.prices``), in the operator's currency.

    ``instance_hour``: per instance type (AWS) or machine type (GCP), per hour;
    ``disk_gb_month``: per GB of volume or disk, per month; ``address_hour``: per
    address (an Elastic IP, a reserved GCP address), per hour."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_hour: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    disk_gb_month: float | None = Field(default=None, ge=0)
    address_hour: float | None = Field(default=None, ge=0)


def size_of(resources: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A group's size facts from its resources as the listing recorded them (``kind`` and
    ``details``): ``instance_type`` (AWS instance type, GCP machine type), ``gpus`` (where
    the API gives it: GCP), ``disk_gb`` (the sum over volumes and disks) and ``addresses``
    (public IPs). A fact no resource carries is left out."""
    size: dict[str, Any] = {}
    disk_gb = 0
    disks = 0
    addresses: list[str] = []
    for r in resources:
        details = r.get("details") or {}
        kind = r.get("kind")
        if kind == "instance":
            itype = details.get("InstanceType") or details.get("machine_type")
            if isinstance(itype, str):
                size["instance_type"] = itype
            if isinstance(details.get("gpus"), int):
                size["gpus"] = size.get("gpus", 0) + details["gpus"]
        elif kind in ("volume", "disk"):
            gb = details.get("Size", details.get("size_gb"))
            if isinstance(gb, int) and not isinstance(gb, bool):
                disk_gb += gb
                disks += 1
        elif kind == "address":
            ip = details.get("PublicIp") or details.get("address")
            if isinstance(ip, str):
                addresses.append(ip)
    if disks:
        size["disk_gb"] = disk_gb
    if addresses:
        size["addresses"] = addresses
    return size


def listed_creation(created: Mapping[str, datetime], primary_id: str | None) -> datetime | None:
    """A group's creation as the listing recorded it, from its resources' ``created_at`` by id:
    the primary's; a group without a listed primary (leftovers): its oldest resource's. None
    when the provider reported none."""
    if primary_id is not None and primary_id in created:
        return created[primary_id]
    return min(created.values(), default=None)


def orphan_since(created_at: datetime | None, owner_end: datetime | None) -> datetime | None:
    """Since when a group is an orphan (C3 ``report``, C6 ``orphan_since``): its owner's end
    (terminated or soft-deleted, the earlier), never before the group's creation; its
    creation when the owner did not end (a lost attempt, a failover leftover) or its row is
    gone. None when neither is known."""
    if created_at is None:
        return owner_end
    return max(created_at, owner_end or created_at)


def cost_per_hour(size: Mapping[str, Any], prices: Prices) -> tuple[float, list[str]]:
    """The estimated cost per hour of a group of ``size`` at ``prices``, and what had no
    price (``instance_type:p3.2xlarge``, ``disk``, ``address``)."""
    total = 0.0
    unpriced: list[str] = []
    itype = size.get("instance_type")
    if itype is not None:
        if itype in prices.instance_hour:
            total += prices.instance_hour[itype]
        else:
            unpriced.append(f"instance_type:{itype}")
    if size.get("disk_gb"):
        if prices.disk_gb_month is None:
            unpriced.append("disk")
        else:
            total += size["disk_gb"] * prices.disk_gb_month / HOURS_PER_MONTH
    if size.get("addresses"):
        if prices.address_hour is None:
            unpriced.append("address")
        else:
            total += len(size["addresses"]) * prices.address_hour
    return total, unpriced


def accrued(per_hour: float, seconds: float) -> float:
    """What ``per_hour`` came to over ``seconds`` (none for a negative span)."""
    return per_hour * max(seconds, 0.0) / 3600


def cost_of_hours(prices: Prices, *, instance_type: str | None, hours: float, disk_gb_hours: float = 0.0,
                  address_hours: float = 0.0) -> float:
    """What orphans cost at ``prices`` over their time, from sums: ``hours`` of orphans of
    ``instance_type`` (None: no instance listed), ``disk_gb_hours`` (GB x hours) and
    ``address_hours`` (addresses x hours). The same as the sum, over those orphans, of
    ``cost_per_hour`` of each one's size times its hours (a price is linear in each fact),
    so the report can sum in the database and price once per type (C3 ``report``)."""
    total = 0.0
    if instance_type is not None and instance_type in prices.instance_hour:
        total += prices.instance_hour[instance_type] * hours
    if prices.disk_gb_month is not None:
        total += disk_gb_hours * prices.disk_gb_month / HOURS_PER_MONTH
    if prices.address_hour is not None:
        total += address_hours * prices.address_hour
    return total
