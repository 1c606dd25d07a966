"""A backend (one provider account and its regions, a row of ``backends``) and its
settings, typed and checked on every parse of a row. Pure pydantic models, no I/O."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orphan_cleanup.core import backend_rules

DEFAULT_TAG_KEY = "provider_ref"
DEFAULT_PROTECT_KEY = "orphan-cleanup-protect"
#: The tag on a snapshot the deleter takes, naming the volume it was taken of.
SNAPSHOT_SOURCE_KEY = "orphan-cleanup-source"
#: AWS tags naming a controller that re-creates an instance it loses (SAFETY.md rule 14):
#: an Auto Scaling group, an EKS managed node group, an EC2 Fleet, a Spot Fleet.
DEFAULT_CONTROLLER_TAG_KEYS: tuple[str, ...] = (
    "aws:autoscaling:groupName", "eks:nodegroup-name", "aws:ec2:fleet-id", "aws:ec2spot:fleet-request-id")


Provider = Literal["aws", "gcp"]
Mode = Literal["report", "delete", "off"]


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
    # instance; such an instance is never terminated (SAFETY.md rule 14).
    controller_tag_keys: tuple[str, ...] = DEFAULT_CONTROLLER_TAG_KEYS
    # Snapshots before deleting: snapshot an orphan data volume / disk (one that did not go with its
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
        this backend's adapter lists: what ownership (SAFETY.md rule 10) and the
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
