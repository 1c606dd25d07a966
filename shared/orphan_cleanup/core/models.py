"""The data every step exchanges: resources as listed, backends, ledger records,
verdicts and deletion results. Pure pydantic models, no I/O. The messages that
cross a queue are in ``messages.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from orphan_cleanup.core import backend_rules

REF_PATTERN = re.compile(r"^[a-z0-9]{12}$")
DEFAULT_TAG_KEY = "provider_ref"
DEFAULT_PROTECT_KEY = "orphan-cleanup-protect"
#: The tag on a snapshot the deleter takes, naming the volume it was taken of.
SNAPSHOT_SOURCE_KEY = "orphan-cleanup-source"
#: AWS tags naming a controller that re-creates an instance it loses (DESIGN §5 rule 14):
#: an Auto Scaling group, an EKS managed node group, an EC2 Fleet, a Spot Fleet.
DEFAULT_CONTROLLER_TAG_KEYS: tuple[str, ...] = (
    "aws:autoscaling:groupName", "eks:nodegroup-name", "aws:ec2:fleet-id", "aws:ec2spot:fleet-request-id")

ProviderRef = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]{12}$")]
Provider = Literal["aws", "gcp"]
Mode = Literal["report", "delete", "off"]


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
    # A snapshot the deleter took of a data volume before deleting it (issue #15 item 4):
    # listed only once older than ``retain_snapshots_days``.
    SNAPSHOT = "snapshot"


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
    # (DESIGN §5 rule 14); an unreadable controller field is recorded too ("unknown:...").
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
    deleted (DESIGN §5 rule 1). A valid ref can never be marked malformed.
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


class BackendSettings(BaseModel):
    """Per-backend settings stored in ``backends.settings`` (jsonb).

    Unknown keys are kept (platforms may store their own), but known keys are typed
    and checked (``backend_rules``); ``from_input`` is the CLI's stricter door, which
    refuses unknown keys. Limits left ``None`` fall back to the process settings.
    """

    model_config = ConfigDict(extra="allow")

    tag_key: str = DEFAULT_TAG_KEY
    protect_tag_key: str = DEFAULT_PROTECT_KEY
    # AWS: role to assume for cross-account cleanup: ``role_arn`` lists (a describe-only
    # role), ``delete_role_arn`` deletes (the deleter falls back to ``role_arn``).
    role_arn: str | None = None
    delete_role_arn: str | None = None
    external_id: str | None = None
    # GCP: project id (defaults to the backend's account) and credentials secret.
    project: str | None = None
    credentials_secret: str | None = None
    credentials_json: str | None = None
    margin_seconds: int | None = Field(default=None, ge=0)
    interval_seconds: int | None = Field(default=None, ge=1)
    max_deletes: int | None = Field(default=None, ge=0)
    max_delete_share: float | None = Field(default=None, ge=0, le=1)
    max_concurrency: int = Field(default=4, ge=1, le=64)
    # AWS: tag keys naming a controller (ASG, node group, fleet) that would replace an
    # instance; such an instance is never terminated (DESIGN §5 rule 14).
    controller_tag_keys: tuple[str, ...] = DEFAULT_CONTROLLER_TAG_KEYS
    # Issue #15 item 4: snapshot an orphan data volume / disk (one that did not go with its
    # instance) and delete it only once the snapshot completed; the snapshot carries the
    # ref and ``SNAPSHOT_SOURCE_KEY``. ``retain_snapshots_days`` unset keeps them forever;
    # set, a snapshot older than that is listed as a leftover of its ref and deleted.
    snapshot_before_delete: bool = False
    retain_snapshots_days: int | None = Field(default=None, ge=1)

    @field_validator("snapshot_before_delete", mode="before")
    @classmethod
    def _strict_bool(cls, v: Any) -> Any:
        # "false" or 0 from a platform's SQL must not silently read as a choice.
        if not isinstance(v, bool):
            raise ValueError(f"must be true or false, got {v!r}")
        return v

    @field_validator("retain_snapshots_days", mode="before")
    @classmethod
    def _whole_days(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"must be a whole number of days, got {v!r}")
        return v

    @field_validator("controller_tag_keys", mode="before")
    @classmethod
    def _controller_tag_keys(cls, v: Any) -> Any:
        problem = backend_rules.tag_key_list_problem(v)
        if problem:
            raise ValueError(problem)
        return tuple(v)

    @field_validator("tag_key", "protect_tag_key")
    @classmethod
    def _tag_key_given(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        return v

    @field_validator("role_arn", "delete_role_arn")
    @classmethod
    def _role_arn(cls, v: str | None) -> str | None:
        problem = None if v is None else backend_rules.role_arn_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @classmethod
    def refuse_unknown_keys(cls, keys: Iterable[str]) -> None:
        """``ValueError`` naming the keys this model does not know, and the known ones:
        an operator's typo must not be stored silently as a platform's own key."""
        unknown = sorted(set(keys) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))};"
                             f" known: {', '.join(cls.model_fields)}")

    @classmethod
    def from_input(cls, data: dict[str, Any]) -> BackendSettings:
        """Settings an operator typed (the CLI): unknown keys refused, known ones checked.
        ``ValueError`` (``ValidationError`` is one)."""
        cls.refuse_unknown_keys(data)
        return cls.model_validate(data)


class Backend(BaseModel):
    """A row of ``backends``: one provider account and its regions."""

    model_config = ConfigDict(frozen=True)

    id: str
    provider: Provider
    account: str
    regions: tuple[str, ...]
    settings: BackendSettings = Field(default_factory=BackendSettings)
    mode: Mode | None = None

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, v: Any) -> Any:
        return tuple(v or ())

    @field_validator("regions")
    @classmethod
    def _some_regions(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("is empty: a backend lists at least one region")
        if any(not r.strip() for r in v):
            raise ValueError(f"has an empty region name: {list(v)}")
        return v

    @model_validator(mode="after")
    def _tag_keys_fit_the_provider(self) -> Backend:
        s = self.settings
        for name in ("tag_key", "protect_tag_key"):
            problem = backend_rules.tag_key_problem(self.provider, getattr(s, name))
            if problem:
                raise ValueError(f"settings.{name}: {problem}")
        if s.tag_key == s.protect_tag_key:
            raise ValueError(f"settings.protect_tag_key: {s.protect_tag_key!r} is also the tag_key")
        return self

    @property
    def scope_account(self) -> str:
        """The account (AWS) or project (GCP: ``settings.project``, else ``account``)
        this backend's adapter lists: what ownership (DESIGN §5 rule 10) and the
        identity check (rule 11) compare."""
        if self.provider == "gcp" and self.settings.project:
            return self.settings.project
        return self.account

    @property
    def scope(self) -> str:
        """``provider:account`` as ``ledger.queries.SCOPE_SQL`` computes it for an owner's backend."""
        return f"{self.provider}:{self.scope_account}"

    @property
    def listing_key(self) -> str:
        """Backends with equal keys list exactly the same resources (same provider,
        account, regions, tag keys and credentials): one listing can feed all their
        cycles. Limits, mode and the platform's own settings keys do not matter."""
        s = self.settings
        return json.dumps([self.scope, sorted(set(self.regions)), s.tag_key, s.protect_tag_key, s.role_arn,
                           s.external_id, s.credentials_secret, s.credentials_json, s.max_concurrency,
                           list(s.controller_tag_keys), s.retain_snapshots_days])

    def for_deleting(self) -> Backend:
        """This backend as the deleter acts for it: with ``delete_role_arn`` as the role
        to assume when one is set (the listing role may only describe)."""
        role = self.settings.delete_role_arn
        if not role or role == self.settings.role_arn:
            return self
        return self.model_copy(update={"settings": self.settings.model_copy(update={"role_arn": role})})


class OwnerStatus(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    IDLE = "idle"
    BUSY = "busy"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


class LedgerRecord(Frozen):
    """STEP 3's view of one ref: the ``provider_refs`` row and its owner, if any.

    ``owner_*`` fields are ``None`` when the owner row is gone (hard delete).
    """

    provider_ref: str
    owner_type: str = "instance"
    owner_id: str | None = None
    owner_name: str | None = None
    issued_at: datetime | None = None
    instance_found: bool = False
    status: OwnerStatus | str | None = None
    backend_id: str | None = None
    primary_id: str | None = None
    region: str | None = None
    created_at: datetime | None = None
    provisioned_at: datetime | None = None
    terminated_at: datetime | None = None
    deleted_at: datetime | None = None
    # ``provider:account`` of the backend named by ``backend_id``; None when no
    # backend row has that id.
    owner_backend_scope: str | None = None
    # Resource ids recorded in an orphan group of this ref by an earlier cycle.
    known_orphan_resource_ids: frozenset[str] = frozenset()
    # Primary ids an earlier delete of this backend found protected in a way no listing
    # shows (AWS termination protection), with the reason: protected up front (rule 14).
    protected_primaries: dict[str, str] = Field(default_factory=dict)


class LedgerRow(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A ``LedgerRecord`` as STEP 3's join document carries it, decoded by msgspec in C
    (``ledger.queries.records_from_json``) with no pydantic model per ref: the same
    fields in the same order, each typed as pydantic reads it from that JSON (a status
    stays a ``str``). Every key is required and none other allowed; a document this
    refuses goes to pydantic. The classifier reads the same attributes of either."""

    provider_ref: str
    owner_type: str
    owner_id: str | None
    owner_name: str | None
    issued_at: datetime | None
    instance_found: bool
    status: str | None
    backend_id: str | None
    primary_id: str | None
    region: str | None
    created_at: datetime | None
    provisioned_at: datetime | None
    terminated_at: datetime | None
    deleted_at: datetime | None
    owner_backend_scope: str | None
    known_orphan_resource_ids: frozenset[str]
    protected_primaries: dict[str, str]


assert tuple(LedgerRecord.model_fields) == LedgerRow.__struct_fields__, "LedgerRow must mirror LedgerRecord"

#: STEP 3's record of a ref: a ``LedgerRow`` as the join decoded it, or a ``LedgerRecord``
#: (pydantic's answer to a document msgspec refused; tests and the simulation build these).
Record = LedgerRecord | LedgerRow


class VerdictKind(StrEnum):
    TRACKED = "tracked"
    ORPHAN = "orphan"
    SKIPPED = "skipped"
    IGNORED = "ignored"
    PROTECTED = "protected"


class Verdict(Frozen):
    kind: VerdictKind
    reason: str
    # An error worth logging (stuck pending owner, owner without provisioning data).
    log_error: str | None = None


class Outcome(StrEnum):
    CLEAN = "clean"
    UNSETTLED = "unsettled"
    FAILED = "failed"


class Action(StrEnum):
    NONE = "none"
    REPORTED = "reported"
    DELETED = "deleted"
    DELETING = "deleting"
    DELETE_FAILED = "delete_failed"


class DeleteStatus(StrEnum):
    DELETED = "deleted"  # every resource of the group with our ref is gone
    DELETING = "deleting"  # the owner's termination is confirmed under way; dependents later
    SKIPPED = "skipped"  # nothing deleted: protect tag or changed ref found on re-read
    # nothing deleted: the re-read (or the provider's refusal) shows a controller or a
    # termination/deletion protection; ``DeleteResult.protection`` says which (rule 14)
    PROTECTED = "protected"


class DeleteOutcome(StrEnum):
    """What the deleter did with one delete request (metrics name ``Delete_<value>``)."""

    DELETED = "deleted"  # the group is gone
    DELETING = "deleting"  # the owner is shutting down; its dependents go next cycle
    SKIPPED = "skipped"  # the owner or the resources changed since the listing: left alone
    PROTECTED = "protected"  # a controller or a termination/deletion protection: a verdict, not a failure
    FAILED = "failed"  # a provider call failed (the cycle fails)
    REGION_TRIPPED = "region_tripped"  # the region timed out / is unavailable this cycle (rule 5)
    BACKEND_OFF = "backend_off"  # the backend was switched off since the cycle started
    IDENTITY_FAILED = "identity_failed"  # the credentials do not reach the backend's account (rule 11)
    # Refusals: nothing was done and nothing is recorded.
    FENCED = "fenced"  # the cycle lost its lease or finished (rule 6)
    CYCLE_UNKNOWN = "cycle_unknown"
    NOT_DELETE_MODE = "not_delete_mode"
    NOT_DISPATCHED = "not_dispatched"  # this cycle did not ask for this group to be deleted
    GROUP_MISMATCH = "group_mismatch"  # the request's resources are not the classified group's (rule 12)
    ALREADY_DONE = "already_done"  # a redelivery of a request already recorded


class SkippedResource(Frozen):
    kind: ResourceKind
    id: str
    reason: str


class DeleteResult(Frozen):
    """What ``delete_resource_group`` did. ``deleted`` lists ids confirmed gone
    (or confirmed terminating for the instance); ``skipped`` what was left alone and why."""

    status: DeleteStatus
    deleted: tuple[str, ...] = ()
    skipped: tuple[SkippedResource, ...] = ()
    pending: tuple[str, ...] = ()
    # With ``PROTECTED``: the reason (``managed_by_controller``, ``termination_protection``,
    # ``deletion_protection``) and its evidence (the controller id, the attribute).
    protection: str | None = None
    protection_detail: str | None = None
    # Spot requests cancelled so that EC2 does not replace the instance (AWS, issue #15):
    # named in the record even when the request is not a member of the group.
    cancelled_requests: tuple[str, ...] = ()
    # Snapshots taken (or found completed) of data volumes before they were deleted, as
    # ``(volume id, snapshot id)`` (issue #15 item 4); and those still being taken.
    snapshots: tuple[tuple[str, str], ...] = ()
    snapshots_pending: tuple[tuple[str, str], ...] = ()

    @model_validator(mode="after")
    def _protection_iff_protected(self) -> DeleteResult:
        if (self.status is DeleteStatus.PROTECTED) != (self.protection is not None):
            raise ValueError("a protected result names its protection, and only a protected one")
        return self
