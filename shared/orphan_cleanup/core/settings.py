"""Typed settings, read once at the edge (CLI, handler cold start) and passed down."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, MAX_SECONDS, Mode

_INSTANCE = re.compile(r"(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]*:[a-z0-9-]+:[a-z0-9][a-z0-9-]*")


class Settings(BaseSettings):
    """Process-wide settings from the environment (README contract C4): every variable the
    product reads is a field here, so the settings are the whole configuration.

    Frozen, hence hashable: equal settings build equal pipelines, and the deployed
    functions key their warm pipeline on this model. Per-backend overrides live in
    ``backends.settings`` (see ``BackendSettings``).
    """

    # A variable set to the empty string counts as unset (``AWS_ENDPOINT_URL=`` is no endpoint),
    # as shells and env files write "unset" that way (README, "Configuration").
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True, frozen=True,
                                      env_ignore_empty=True)

    # Secret-bearing settings are ``SecretStr`` (SAFETY.md rule 22): no repr of the settings,
    # of a pipeline holding them, or of a traceback's locals prints them.
    database_url: SecretStr | None = Field(default=None, alias="DATABASE_URL")
    # Deployed AWS functions: the Secrets Manager secret holding DATABASE_URL, when that is unset.
    database_url_secret_arn: str | None = Field(default=None, alias="DATABASE_URL_SECRET_ARN")
    # The login role, replacing the URL's user: the GCP stack sets each function's IAM
    # database user (its service account) with CLOUD_SQL_IAM_AUTH.
    database_user: str | None = Field(default=None, alias="DATABASE_USER")
    # RDS IAM database authentication: each new connection's password is a fresh token
    # (boto3 generate_db_auth_token for the URL's host, port and user); TLS is required.
    database_iam_auth: bool = Field(default=False, alias="DATABASE_IAM_AUTH")
    # Cloud SQL through the Cloud SQL Python Connector (pg8000): PROJECT:REGION:INSTANCE.
    # The URL then names the user, password and database; the connector picks the address.
    cloud_sql_instance: str | None = Field(default=None, alias="CLOUD_SQL_INSTANCE")
    cloud_sql_iam_auth: bool = Field(default=False, alias="CLOUD_SQL_IAM_AUTH")
    # Which of the instance's addresses the connector uses: private through a VPC connector.
    cloud_sql_ip_type: Literal["public", "private", "psc"] = Field(default="public", alias="CLOUD_SQL_IP_TYPE")
    # boto3 honours it on its own; held here so that a changed endpoint builds new clients,
    # and passed to every client the product builds.
    aws_endpoint_url: str | None = Field(default=None, alias="AWS_ENDPOINT_URL")
    mode: Mode = Field(default="report", alias="ORPHAN_CLEANUP_MODE")
    margin_seconds: int = Field(default=300, ge=0, le=MAX_SECONDS, alias="ORPHAN_CLEANUP_MARGIN_SECONDS")
    interval_seconds: int = Field(default=900, ge=1, le=MAX_SECONDS, alias="ORPHAN_CLEANUP_INTERVAL_SECONDS")
    max_deletes: int = Field(default=100, ge=0, alias="ORPHAN_CLEANUP_MAX_DELETES")
    max_delete_share: float = Field(default=0.5, ge=0, le=1, alias="ORPHAN_CLEANUP_MAX_DELETE_SHARE")
    # The confirmation window of mark-then-sweep (SAFETY.md rule 23; unset: the interval, 0: off):
    # a delete cycle deletes an orphan group only when an earlier listing at least this long
    # before its own found the same group an orphan. A row may only lengthen it.
    confirm_seconds: int | None = Field(default=None, ge=0, le=MAX_SECONDS, alias="ORPHAN_CLEANUP_CONFIRM_SECONDS")
    gcp_endpoint: str | None = Field(default=None, alias="ORPHAN_CLEANUP_GCP_ENDPOINT")
    sentry_dsn: SecretStr | None = Field(default=None, alias="SENTRY_DSN")
    data_dir: str = Field(default=".orphan-cleanup", alias="ORPHAN_CLEANUP_DATA_DIR")
    # Queue wiring for the deployed functions (docs/DEPLOY.md).
    listing_queue_url: str | None = Field(default=None, alias="LISTING_QUEUE_URL")
    delete_queue_url: str | None = Field(default=None, alias="DELETE_QUEUE_URL")
    listing_topic: str | None = Field(default=None, alias="LISTING_TOPIC")
    delete_topic: str | None = Field(default=None, alias="DELETE_TOPIC")
    # The tick's listing jobs: the lister consumes them (one listing per due backend group).
    jobs_queue_url: str | None = Field(default=None, alias="JOBS_QUEUE_URL")
    jobs_topic: str | None = Field(default=None, alias="JOBS_TOPIC")
    # Every provider call has a timeout (SAFETY.md rule 5).
    provider_connect_timeout: float = Field(default=5.0, gt=0, le=3600, alias="ORPHAN_CLEANUP_CONNECT_TIMEOUT")
    provider_read_timeout: float = Field(default=20.0, gt=0, le=3600, alias="ORPHAN_CLEANUP_READ_TIMEOUT")
    # A cycle not finished by then is failed by the next lister run.
    cycle_deadline_seconds: int = Field(default=1800, ge=1, le=MAX_SECONDS,
                                        alias="ORPHAN_CLEANUP_CYCLE_DEADLINE_SECONDS")
    # A manual run's (`orphan-cleanup run`) lease, its cycle deadline: renewed by the run's
    # heartbeat every third of it, so a killed run frees its backend within this long.
    lease_seconds: int = Field(default=60, ge=1, le=MAX_SECONDS, alias="ORPHAN_CLEANUP_LEASE_SECONDS")
    stuck_pending_seconds: int = Field(default=3600, ge=0, le=MAX_SECONDS, alias="ORPHAN_CLEANUP_STUCK_PENDING_SECONDS")
    max_backoff_seconds: int = Field(default=6 * 3600, ge=1, le=MAX_SECONDS, alias="ORPHAN_CLEANUP_MAX_BACKOFF_SECONDS")
    # A region listing that lost more than this share of its last clean listing's groups
    # (when that had at least the minimum) counts as not listed: an anomaly, not a fact.
    region_shrink_share: float = Field(default=0.9, gt=0, le=1, alias="ORPHAN_CLEANUP_REGION_SHRINK_SHARE")
    region_shrink_min_groups: int = Field(default=20, ge=1, alias="ORPHAN_CLEANUP_REGION_SHRINK_MIN_GROUPS")
    # Client-side request budgets per (account, region, API class), shared by every thread
    # and client of the process (providers/ratelimit.py): a quarter of EC2's own buckets
    # (non-mutating 20/s refill, 100 burst; TerminateInstances 5/s) by default.
    describe_rate: float = Field(default=5.0, gt=0, alias="ORPHAN_CLEANUP_DESCRIBE_RATE")
    describe_burst: int = Field(default=25, ge=1, alias="ORPHAN_CLEANUP_DESCRIBE_BURST")
    mutate_rate: float = Field(default=1.25, gt=0, alias="ORPHAN_CLEANUP_MUTATE_RATE")
    mutate_burst: int = Field(default=12, ge=1, alias="ORPHAN_CLEANUP_MUTATE_BURST")
    terminate_rate: float = Field(default=1.25, gt=0, alias="ORPHAN_CLEANUP_TERMINATE_RATE")
    terminate_burst: int = Field(default=25, ge=1, alias="ORPHAN_CLEANUP_TERMINATE_BURST")
    # The C6 digest after an eventful cycle (notify/): an SNS topic, a Pub/Sub topic
    # (projects/P/topics/T), a Slack incoming webhook (its URL, or in the deployed functions
    # the Secrets Manager secret holding it).
    notify_topic_arn: str | None = Field(default=None, alias="NOTIFY_TOPIC_ARN")
    notify_topic: str | None = Field(default=None, alias="NOTIFY_TOPIC")
    slack_webhook_url: SecretStr | None = Field(default=None, alias="SLACK_WEBHOOK_URL")
    slack_webhook_secret_arn: str | None = Field(default=None, alias="SLACK_WEBHOOK_SECRET_ARN")
    # Seconds a notification may take (each adapter's call); a slow channel never holds a cycle long.
    notify_timeout: float = Field(default=10.0, gt=0, le=300, alias="ORPHAN_CLEANUP_NOTIFY_TIMEOUT")
    # The loosest mode a backend row may give itself (SAFETY.md rule 8; unset: the stack's own
    # mode, ``report`` when that is ``off``): ``delete`` in a row under a ``report`` ceiling runs
    # ``report``. An operator's one-off request (``run --mode``, an invocation's mode) is not capped.
    max_mode: Literal["report", "delete"] | None = Field(default=None, alias="ORPHAN_CLEANUP_MAX_MODE")
    # The stack's protect key: it protects whatever keys the rows name (SAFETY.md rule 16).
    protect_tag_key: str = Field(default=DEFAULT_PROTECT_KEY, min_length=1, max_length=128,
                                 alias="ORPHAN_CLEANUP_PROTECT_TAG_KEY")

    @property
    def mode_ceiling(self) -> Literal["report", "delete"]:
        """The loosest mode a row (or the stack's own default mode) runs a cycle in."""
        if self.max_mode is not None:
            return self.max_mode
        return "delete" if self.mode == "delete" else "report"

    @property
    def confirm_window_seconds(self) -> int:
        """The stack's confirmation window (rule 23): ``confirm_seconds``, else the interval."""
        return self.interval_seconds if self.confirm_seconds is None else self.confirm_seconds

    @classmethod
    def explicit(cls, **values: Any) -> Settings:
        """These values (by field name) and the defaults for the rest; the environment
        is not consulted, whatever this shell exports (the demo's settings)."""
        fields = cls.model_fields
        unknown = set(values) - set(fields)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        # Every field is passed, so no environment variable can fill one in
        # (explicit arguments win over the environment in pydantic-settings).
        given = {name: values[name] if name in values else f.get_default(call_default_factory=True)
                 for name, f in fields.items()}
        return cls(**{fields[name].alias or name: v for name, v in given.items()})

    @field_validator("cloud_sql_instance", "database_user")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return None if v is not None and v.strip() == "" else v

    @field_validator("cloud_sql_instance")
    @classmethod
    def _check_instance(cls, v: str | None) -> str | None:
        # PROJECT:REGION:INSTANCE, the project maybe domain-scoped (example.com:project).
        if v is not None and not _INSTANCE.fullmatch(v):
            raise ValueError("CLOUD_SQL_INSTANCE must be PROJECT:REGION:INSTANCE (the instance connection name)")
        return v

    @field_validator("database_url", "sentry_dsn", "slack_webhook_url", mode="before")
    @classmethod
    def _blank_secret_is_unset(cls, v: Any) -> Any:
        text = v.get_secret_value() if isinstance(v, SecretStr) else v
        return None if isinstance(text, str) and text.strip() == "" else v

    @field_validator("database_url")
    @classmethod
    def _check_url(cls, v: SecretStr | None) -> SecretStr | None:
        # The message never quotes the value: it holds the password.
        if v is not None and not v.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("DATABASE_URL must start with postgresql://")
        return v
