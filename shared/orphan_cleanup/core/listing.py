"""What a listing produces: resources as a provider shows them, grouped by ref into
resource groups, and each region's result. Pure pydantic models, no I/O."""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

REF_PATTERN = re.compile(r"^[a-z0-9]{12}$")

ProviderRef = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{12}$")]


def is_valid_ref(value: object) -> bool:
    return isinstance(value, str) and REF_PATTERN.fullmatch(value) is not None


#: A backend id as a message carries it: Postgres text cannot hold NUL, so a NUL is
#: refused here (a clear validation error) rather than by the database (a crash).
BackendId = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ResourceKind(StrEnum):
    INSTANCE = "instance"
    VOLUME = "volume"
    NETWORK_INTERFACE = "network-interface"
    SECURITY_GROUP = "security-group"
    ADDRESS = "address"
    DISK = "disk"
    SPOT_REQUEST = "spot-request"
    # A snapshot the deleter took of a data volume before deleting it:
    # listed only once older than ``retain_snapshots_days``.
    SNAPSHOT = "snapshot"
    LAUNCH_TEMPLATE = "launch-template"
    KEY_PAIR = "key-pair"
    PLACEMENT_GROUP = "placement-group"
    LOAD_BALANCER = "load-balancer"
    TARGET_GROUP = "target-group"
    FORWARDING_RULE = "forwarding-rule"
    IMAGE = "image"


#: The kinds each provider's listing produces: a group naming another kind came from no
#: listing of that provider (a forged message) and is malformed (SAFETY.md rules 1 and 12).
PROVIDER_KINDS: dict[str, frozenset[ResourceKind]] = {
    "aws": frozenset({ResourceKind.INSTANCE, ResourceKind.VOLUME, ResourceKind.NETWORK_INTERFACE,
                      ResourceKind.SECURITY_GROUP, ResourceKind.ADDRESS, ResourceKind.SPOT_REQUEST,
                      ResourceKind.SNAPSHOT, ResourceKind.LAUNCH_TEMPLATE,
                      ResourceKind.KEY_PAIR, ResourceKind.PLACEMENT_GROUP,
                      ResourceKind.LOAD_BALANCER, ResourceKind.TARGET_GROUP}),
    "gcp": frozenset({ResourceKind.INSTANCE, ResourceKind.DISK, ResourceKind.ADDRESS, ResourceKind.SNAPSHOT,
                      ResourceKind.FORWARDING_RULE, ResourceKind.IMAGE}),
}


class ResourceState(StrEnum):
    """Provider states folded into what the classifier and deleter need.

    ``active``: exists and may be in use (instance pending/running/stopped, attached volume);
    ``available``: exists and is not in use (detached volume/disk, unassociated address);
    ``terminating``: deletion is under way (AWS shutting-down, GCP STOPPING after delete);
    ``terminated``: gone or going for good; never listed as a live resource.
    """

    ACTIVE = "active"
    AVAILABLE = "available"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


class Resource(Frozen):
    kind: ResourceKind
    id: str = Field(min_length=1)
    region: str
    state: ResourceState = ResourceState.ACTIVE
    tags: dict[str, str] = Field(default_factory=dict)
    created_at: datetime | None = None
    # The primary resource (instance id) this one is attached to, as the provider says.
    attached_to: str | None = None
    # Provider extras (name, zone, raw state, vpc id ...): informational only.
    details: dict[str, Any] = Field(default_factory=dict)
    # The controller that would re-create this instance if it went ("asg:NAME",
    # "mig:projects/P/zones/Z/instanceGroupManagers/NAME"), as the listing saw it
    # (SAFETY.md rule 14); an unreadable controller field is recorded too ("unknown:...").
    controller: str | None = None
    # A provider-side protection against deletion the listing can see (GCP
    # ``deletionProtection``): the reason it gives (``deletion_protection``).
    protection: Literal["deletion_protection", "termination_protection"] | None = None


class ResourceGroup(Frozen):
    """One provisioning attempt as found in the provider: an owner resource and
    the internal resources created with it, all carrying one ``provider_ref``.

    ``primary_id`` is the instance id (AWS) or numeric id (GCP), or ``None`` for a
    group of leftovers (volumes, interfaces, addresses) whose instance is gone.

    ``malformed_ref``: the resources carry the ref tag key with a value that is not
    a ref (empty, too long, upper case ...); ``provider_ref`` is that raw value. Such a
    group is only ever shown (``ignored`` / ``malformed_ref``), never looked up or
    deleted (SAFETY.md rule 1). A valid ref can never be marked malformed.
    """

    provider_ref: str = Field(max_length=1024)
    region: str
    primary_id: str | None = None
    resources: tuple[Resource, ...] = ()
    malformed_ref: bool = False

    @model_validator(mode="after")
    def _ref_matches_flag(self) -> ResourceGroup:
        if is_valid_ref(self.provider_ref) == self.malformed_ref:
            raise ValueError(f"provider_ref {self.provider_ref!r} is "
                             + ("a valid ref: not malformed" if self.malformed_ref else "not a valid ref"))
        return self

    @property
    def key(self) -> str:
        # A raw value may hold anything ("/" included): quoted, it cannot collide
        # with another group's key, nor with a valid ref's.
        ref = json.dumps(self.provider_ref) if self.malformed_ref else self.provider_ref
        return f"{ref}/{self.region}/{self.primary_id or '-'}"

    @property
    def primary(self) -> Resource | None:
        if self.primary_id is None:
            return None
        for r in self.resources:
            if r.id == self.primary_id:
                return r
        return None

    def resource_ids(self) -> list[str]:
        return [r.id for r in self.resources]


class RegionFailure(Frozen):
    region: str
    error: str


class RegionListing(Frozen):
    """What one region (or zone set) produced: its groups, or why it failed."""

    region: str
    groups: tuple[ResourceGroup, ...] = ()
    failure: str | None = None
    # The failure is throttling past the retry budget: the region is unavailable this
    # cycle (skipped, unsettled), and a cycle whose every region is so is unsettled, not failed.
    throttled: bool = False
