"""A backend (one provider account and its regions, a row of ``backends``) and its
settings, typed and checked on every parse of a row. Pure pydantic models, no I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from orphan_cleanup.core import backend_rules
from orphan_cleanup.core.costs import Prices
from orphan_cleanup.core.errors import ConfigError

DEFAULT_TAG_KEY = "provider_ref"
DEFAULT_PROTECT_KEY = "orphan-cleanup-protect"
#: The tag on a snapshot the deleter takes, naming the volume it was taken of.
SNAPSHOT_SOURCE_KEY = "orphan-cleanup-source"
#: AWS tags naming a controller that re-creates an instance it loses (SAFETY.md rule 14):
#: an Auto Scaling group, an EKS managed node group, an EC2 Fleet, a Spot Fleet.
DEFAULT_CONTROLLER_TAG_KEYS: tuple[str, ...] = (
    "aws:autoscaling:groupName", "eks:nodegroup-name", "aws:ec2:fleet-id", "aws:ec2spot:fleet-request-id")


#: The longest duration a setting may hold (margin, interval, ...): a year. Longer ones are
#: typos, and past ~2,000 years the time arithmetic of a cycle would overflow.
MAX_SECONDS = 366 * 86400
MAX_DAYS = 100 * 366

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
    # More protect keys. A cycle adds every key of the other backends of its account
    # (SAFETY.md rule 16: one account, one set of keys); a row may list some too.
    protect_tag_keys: tuple[str, ...] = ()
    # AWS: role to assume for cross-account cleanup: ``role_arn`` lists (a describe-only
    # role), ``delete_role_arn`` deletes (the deleter falls back to ``role_arn``).
    role_arn: str | None = None
    delete_role_arn: str | None = None
    external_id: str | None = None
    # GCP: project id (defaults to the backend's account) and a service-account key (JSON
    # text, a SecretStr: never in a repr, a log line or an error; else Application Default
    # Credentials). The deployed functions refuse a key stored in the ledger; the CLI also
    # takes ``credentials_file``, the path of a key file on the operator's machine.
    project: str | None = None
    credentials_json: SecretStr | None = None
    credentials_file: str | None = None
    margin_seconds: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    interval_seconds: int | None = Field(default=None, ge=1, le=MAX_SECONDS)
    max_deletes: int | None = Field(default=None, ge=0)
    max_delete_share: float | None = Field(default=None, ge=0, le=1)
    # Only lengthens the stack's confirmation window (SAFETY.md rules 8 and 23).
    confirm_seconds: int | None = Field(default=None, ge=0, le=MAX_SECONDS)
    max_concurrency: int = Field(default=4, ge=1, le=64)
    # AWS: tag keys naming a controller (ASG, node group, fleet) that would replace an
    # instance; such an instance is never terminated (SAFETY.md rule 14).
    controller_tag_keys: tuple[str, ...] = DEFAULT_CONTROLLER_TAG_KEYS
    # Snapshots before deleting: snapshot an orphan data volume / disk (one that did not go with its
    # instance) and delete it only once the snapshot completed; the snapshot carries the
    # ref and ``SNAPSHOT_SOURCE_KEY``. ``retain_snapshots_days`` unset keeps them forever;
    # set, a snapshot older than that is listed as a leftover of its ref and deleted.
    snapshot_before_delete: bool = False
    retain_snapshots_days: int | None = Field(default=None, ge=1, le=MAX_DAYS)
    # The operator's price table (never fetched): ``orphans`` estimates each orphan's cost with it.
    prices: Prices | None = None

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

    @field_validator("controller_tag_keys", "protect_tag_keys", mode="before")
    @classmethod
    def _tag_key_lists(cls, v: Any) -> Any:
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

    @field_validator("credentials_json")
    @classmethod
    def _service_account_key(cls, v: SecretStr | None) -> SecretStr | None:
        problem = None if v is None else backend_rules.service_account_key_problem(v.get_secret_value())
        if problem:
            raise ValueError(problem)
        return v

    @field_serializer("credentials_json", when_used="json")
    def _key_as_stored(self, v: SecretStr | None) -> str | None:
        # The row stores the key itself (what the platform wrote); every place that shows a
        # backend leaves it out (cli/backends.py), and a cycle keeps its digest only.
        return None if v is None else v.get_secret_value()

    @field_validator("credentials_file")
    @classmethod
    def _key_file(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or "\x00" in v or len(v) > 4096):
            raise ValueError("must be the path of a service-account key file")
        return v

    @property
    def key_text(self) -> str | None:
        """The service-account key stored in the row, as text (None: no key stored)."""
        key: Any = self.credentials_json
        # str only for settings built without validation (model_construct)
        return key.get_secret_value() if isinstance(key, SecretStr) else key

    @field_validator("external_id")
    @classmethod
    def _external_id(cls, v: str | None) -> str | None:
        if v is not None and not backend_rules.EXTERNAL_ID.match(v):
            raise ValueError(f"{v[:40]!r} is not an STS external id (2-1224 of letters, digits and +=,.@:/-)")
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
    #: A retired coverage (SAFETY.md rule 24): the id of the backend it came from. Its own
    #: ``id`` is the coverage's ('<backend id>~<n>').
    retired_from: str | None = None

    @property
    def origin(self) -> str:
        """The backend id owners name for what this covers: its own, or the retired one's."""
        return self.retired_from or self.id

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
        for key in s.protect_tag_keys:
            problem = backend_rules.tag_key_problem(self.provider, key)
            if problem:
                raise ValueError(f"settings.protect_tag_keys: {problem}")
        if s.tag_key in self.protect_keys:
            raise ValueError(f"settings.protect_tag_key: {s.tag_key!r} is also the tag_key")
        return self

    @property
    def protect_keys(self) -> frozenset[str]:
        """Every tag key whose presence protects a resource: ``protect_tag_key`` and
        ``protect_tag_keys`` (in a cycle: the whole account's, SAFETY.md rule 16)."""
        return frozenset((self.settings.protect_tag_key, *self.settings.protect_tag_keys))

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
                           s.external_id, s.key_text, s.credentials_file, s.max_concurrency,
                           list(s.controller_tag_keys), s.retain_snapshots_days])

    def for_deleting(self) -> Backend:
        """This backend as the deleter acts for it: with ``delete_role_arn`` as the role
        to assume when one is set (the listing role may only describe)."""
        role = self.settings.delete_role_arn
        if not role or role == self.settings.role_arn:
            return self
        return self.model_copy(update={"settings": self.settings.model_copy(update={"role_arn": role})})


# ---- a cycle's view of its backend (SAFETY.md rules 16 and 18) -------------------------

def deletes_reach(backend: Backend) -> tuple[Any, ...]:
    """Where a backend's deletes go: its provider account, the roles and external id it
    assumes, and its service-account key (by digest). A cycle deletes only while its
    snapshot and the row agree on these (SAFETY.md rule 18)."""
    s = backend.settings
    key = s.key_text
    digest = hashlib.sha256(key.encode()).hexdigest() if key else (s.model_extra or {}).get(CREDENTIALS_DIGEST)
    return (backend.provider, backend.scope_account, s.role_arn, s.delete_role_arn, s.external_id, digest,
            s.credentials_file)


def account_view(backend: Backend, account_settings: Iterable[Any],
                 stack_protect_key: str = DEFAULT_PROTECT_KEY) -> Backend:
    """``backend`` with the protect and controller keys of every backend of its account
    (``account_settings``: their raw ``settings`` values, this backend's included) and the
    stack's own protect key (``ORPHAN_CLEANUP_PROTECT_TAG_KEY``, whatever the rows say): a
    resource any of them would protect, or name a controller by, is protected whichever
    backend's cycle looks at it (SAFETY.md rule 16). Read leniently, in the safe direction: a row whose
    settings cannot be read adds the default keys; a key that cannot be a tag key of the
    provider (or is the ref tag key) is left out, as no resource can carry it."""
    s = backend.settings
    protect = {s.protect_tag_key, *s.protect_tag_keys, stack_protect_key}
    controllers = list(s.controller_tag_keys)
    for raw in account_settings:
        readable = _readable(raw)
        raw = raw if isinstance(raw, dict) else {}
        own = raw.get("protect_tag_key")
        protect.add(own if isinstance(own, str) and own else DEFAULT_PROTECT_KEY)
        protect.update(_strings(raw.get("protect_tag_keys")))
        listed = raw.get("controller_tag_keys")
        controllers += _strings(listed) if isinstance(listed, (list, tuple)) else list(DEFAULT_CONTROLLER_TAG_KEYS)
        if not readable:  # a row the product refuses still protects: its keys and the defaults
            protect.add(DEFAULT_PROTECT_KEY)
            protect.update(k for k in (raw.get("protect_tag_keys"), raw.get("protect_tag_key")) if isinstance(k, str))
            controllers += list(DEFAULT_CONTROLLER_TAG_KEYS)

    def usable(key: str) -> bool:
        # The stack's key protects whatever the row says (rule 16), its tag_key included (then
        # every resource is protected: the lister refuses such a row, ``policy.stack_key_refusal``).
        return (key != s.tag_key or key == stack_protect_key) \
            and backend_rules.tag_key_problem(backend.provider, key) is None

    extra = tuple(sorted(k for k in protect - {s.protect_tag_key} if usable(k)))
    keys = tuple(dict.fromkeys(k for k in controllers if k.strip() and len(k) <= backend_rules.AWS_TAG_KEY_MAX))
    return backend.model_copy(update={"settings": s.model_copy(
        update={"protect_tag_keys": extra, "controller_tag_keys": keys})})


def _readable(raw: Any) -> bool:
    """Whether a row's raw settings are settings the product accepts."""
    try:
        BackendSettings.model_validate(raw)
    except (ValueError, TypeError):
        return False
    return True


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []


#: What a cycle keeps of ``settings.credentials_json`` (a key): its digest, never the key.
CREDENTIALS_DIGEST = "credentials_json_sha256"


def cycle_snapshot(backend: Backend) -> dict[str, Any]:
    """The backend as its cycle keeps it (``cycles.backend_snapshot``): the row's values,
    with a service-account key replaced by its digest (a key is not copied into every
    cycle's row; the deleter takes the row's key only while its digest still matches)."""
    doc = backend.model_dump(mode="json")
    key = doc["settings"].pop("credentials_json", None)
    if key is not None:
        doc["settings"][CREDENTIALS_DIGEST] = hashlib.sha256(key.encode()).hexdigest()
    return doc


def from_snapshot(doc: dict[str, Any], row_credentials_json: str | None) -> Backend:
    """A cycle's backend from its snapshot; the credentials key is the row's only when
    it is the one the lease was taken with. Otherwise the digest stays in the settings
    and no key is there: the GCP adapter then refuses to fall back on the function's
    own credentials (``providers.gcp``), and the deleter refuses the cycle's deletes
    (``deletes_reach`` differs from the row's)."""
    settings = dict(doc.get("settings") or {})
    digest = settings.get(CREDENTIALS_DIGEST)
    if digest is not None and row_credentials_json is not None \
            and hashlib.sha256(row_credentials_json.encode()).hexdigest() == digest:
        del settings[CREDENTIALS_DIGEST]
        settings["credentials_json"] = row_credentials_json
    try:
        return Backend.model_validate({**doc, "settings": settings})
    except ValidationError as e:
        raise ConfigError(f"the cycle's snapshot of backend {doc.get('id')!r} cannot be read:"
                          f" {backend_rules.describe_validation(e)}") from e
