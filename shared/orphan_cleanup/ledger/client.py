"""The provisioner-side ledger client, for platform authors.

The protocol that makes orphan cleanup safe:

1. ``issue_ref`` commits a ref and its owner row *before* any provider call;
2. every resource created for it carries the ref as a tag (``aws_tag_specifications``)
   or label (``gcp_labels``);
3. once the provider answers, ``mark_provisioning`` records the provisioning
   data (backend, primary id, region); later transitions follow the owner's life.

Example::

    ledger = LedgerClient.from_env()  # DATABASE_URL, else the CLI's embedded Postgres
    issued = ledger.issue_ref(owner_id="inst-42", owner_name="train-7")
    resp = ec2.run_instances(..., TagSpecifications=aws_tag_specifications(issued.provider_ref))
    ledger.mark_provisioning("inst-42", backend_id="aws-prod",
                             primary_id=resp["Instances"][0]["InstanceId"], region="us-east-1")

A volume the platform creates on its own (README, C1: ``owner_type`` ``volume``) follows the
same protocol with the ``volumes`` calls: ``issue_volume_ref``, ``mark_volume_provisioning``
(the volume id, or the GCP disk's numeric id), ``mark_volume_active``,
``mark_volume_deleting``, ``mark_volume_deleted``.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from datetime import datetime

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.errors import ConfigError, DatabaseError
from orphan_cleanup.core.owners import OwnerStatus, VolumeStatus
from orphan_cleanup.ledger.db import Database

# What a platform imports from here: the client, the owner statuses it writes, the tag helpers.
__all__ = ["IssuedRef", "LedgerClient", "OwnerStatus", "VolumeStatus", "aws_tag_specifications", "gcp_labels",
           "new_ref"]

REF_ALPHABET = string.ascii_lowercase + string.digits
REF_LENGTH = 12
AWS_TAGGABLE = ("instance", "volume", "network-interface")


def new_ref() -> str:
    """A random ref matching ``^[a-z0-9]{12}$`` (62 bits of entropy)."""
    return "".join(secrets.choice(REF_ALPHABET) for _ in range(REF_LENGTH))


@dataclass(frozen=True)
class IssuedRef:
    provider_ref: str
    owner_id: str
    issued_at: datetime


@dataclass(frozen=True)
class StalePending:
    owner_id: str
    provider_ref: str
    created_at: datetime
    owner_type: str = "instance"  # or "volume": a volumes row (README, C1)


class LedgerClient:
    """Writes the ledger the way the cleanup expects. Every method commits before returning."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    def from_env(cls) -> LedgerClient:
        """The ledger the CLI uses, from this process's environment: ``DATABASE_URL`` when
        set; else the embedded Postgres in ``ORPHAN_CLEANUP_DATA_DIR`` (``./.orphan-cleanup``),
        the same server and database as ``orphan-cleanup`` run from the same directory,
        started if it is not running and migrated, as the CLI's first write does. A
        ``DATABASE_URL``'s schema is the operator's (``orphan-cleanup migrate``): not changed."""

        from pydantic import ValidationError

        from orphan_cleanup.core.settings import Settings
        from orphan_cleanup.ledger.embedded import embedded_ledger
        from orphan_cleanup.ledger.migrate import migrate

        try:
            settings = Settings()
        except ValidationError as e:
            first = e.errors()[0]  # not ``from e``: pydantic quotes the input, a URL's password (SAFETY.md rule 22)
            raise ConfigError(f"bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        if settings.database_url is not None:
            return cls(Database.from_url(settings.database_url.get_secret_value(), keep_idle=True))
        if settings.database_url_secret_arn or settings.cloud_sql_instance or settings.database_iam_auth:
            raise ConfigError("LedgerClient.from_env reads DATABASE_URL or the embedded Postgres; with"
                              " DATABASE_URL_SECRET_ARN, CLOUD_SQL_INSTANCE or DATABASE_IAM_AUTH build the"
                              " Database yourself: LedgerClient(Database(...))")
        db = Database(embedded_ledger(settings.data_dir), keep_idle=True)
        migrate(db)
        return cls(db)

    def issue_ref(self, *, owner_id: str | None = None, owner_name: str | None = None,
                  owner_type: str = "instance") -> IssuedRef:
        """Commit a new ref and its owner (an instance row in ``pending``, for ``owner_type``
        ``instance`` or ``gateway``; for ``volume`` a volumes row, as ``issue_volume_ref``) in one
        transaction. Call it before
        the provider call that creates resources."""
        for _ in range(5):
            ref = new_ref()
            oid = owner_id or (f"volume-{ref}" if owner_type == "volume" else f"inst-{ref}")
            try:
                with self.db.transaction() as conn:
                    rows = conn.run(
                        "INSERT INTO provider_refs (provider_ref, owner_type, owner_id, owner_name)"
                        " VALUES (:r, :t, :o, :n) ON CONFLICT (provider_ref) DO NOTHING RETURNING issued_at",
                        r=ref, t=owner_type, o=oid, n=owner_name,
                    )
                    if not rows:
                        raise _RefTaken
                    if owner_type in ("instance", "gateway", "volume"):
                        table = "volumes" if owner_type == "volume" else "instances"
                        conn.run(f"INSERT INTO {table} (id, name, provider_ref, status) VALUES (:i, :n, :r, 'pending')",
                                 i=oid, n=owner_name, r=ref)
            except _RefTaken:
                continue
            return IssuedRef(provider_ref=ref, owner_id=oid, issued_at=rows[0][0])
        raise DatabaseError("could not issue a unique provider_ref after 5 attempts")

    def mark_provisioning(self, instance_id: str, *, backend_id: str, primary_id: str, region: str,
                          status: OwnerStatus = OwnerStatus.PROVISIONING) -> None:
        """Record the provisioning data once the provider created the instance."""
        self._update(instance_id,
                     "status = :s, backend_id = :b, primary_id = :p, region = :g,"
                     " provisioned_at = coalesce(provisioned_at, now())",
                     s=status.value, b=backend_id, p=primary_id, g=region)

    def set_status(self, instance_id: str, status: OwnerStatus) -> None:
        """Move a live owner to ``idle``, ``busy``, ``terminating`` (or back to ``pending``)."""
        if status is OwnerStatus.TERMINATED:
            return self.mark_terminated(instance_id)
        self._update(instance_id, "status = :s", s=status.value)

    def mark_terminated(self, instance_id: str) -> None:
        self._update(instance_id, "status = 'terminated', terminated_at = coalesce(terminated_at, now())")

    def soft_delete(self, instance_id: str) -> None:
        self._update(instance_id, "deleted_at = coalesce(deleted_at, now())")

    def hard_delete(self, instance_id: str) -> None:
        """Delete a failed placeholder's row; its ref stays behind in ``provider_refs``."""
        with self.db.transaction() as conn:
            conn.run("DELETE FROM instances WHERE id = :i", i=instance_id)

    def stale_pending(self, older_than_seconds: int = 3600) -> list[StalePending]:
        """Owners still ``pending`` longer than that after their ref was issued: a create call
        that never came back to record its provisioning data (a crash, a lost worker). Their
        resources, if any, are skipped by every cycle (``owner_pending``) until the platform
        records them (``mark_provisioning``) or gives up on them (``reap_pending``)."""
        with self.db.connection() as conn:
            rows = conn.run("SELECT id, provider_ref, created_at, t FROM ("
                            "SELECT id, provider_ref, created_at, deleted_at, status, 'instance' AS t FROM instances"
                            " UNION ALL SELECT id, provider_ref, created_at, deleted_at, status, 'volume' FROM volumes"
                            ") o WHERE status = 'pending' AND deleted_at IS NULL"
                            " AND created_at < now() - make_interval(secs => :t) ORDER BY created_at",
                            t=older_than_seconds)
        return [StalePending(owner_id=i, provider_ref=r, created_at=c, owner_type=t) for i, r, c, t in rows]

    def reap_pending(self, instance_id: str, owner_type: str = "instance") -> bool:
        """Give up on a stale pending owner: mark it terminated (a volume: deleted), only if it
        is still pending (False otherwise: it was provisioned meanwhile). Cleanup then deletes
        whatever its create call left, once ``terminated_at`` (``deleted_at``) is older than the
        margin (``owner_terminated``, ``owner_soft_deleted``)."""
        if owner_type == "volume":
            sql = ("UPDATE volumes SET status = 'deleted', deleted_at = now()"
                   " WHERE id = :i AND status = 'pending' RETURNING id")
        else:
            sql = ("UPDATE instances SET status = 'terminated', terminated_at = now()"
                   " WHERE id = :i AND status = 'pending' RETURNING id")
        with self.db.transaction() as conn:
            return bool(conn.run(sql, i=instance_id))

    # ---- volume owners (README, C1: owner_type 'volume', a volumes row) -------------------

    def issue_volume_ref(self, *, owner_id: str | None = None, owner_name: str | None = None) -> IssuedRef:
        """Commit a new ref and its owner volume (a volumes row in ``pending``) in one
        transaction, before the provider call that creates the volume (AWS ``create_volume``
        with ``aws_tag_specifications(ref, resource_types=("volume",))``, a GCP disk with
        ``gcp_labels(ref)``)."""
        return self.issue_ref(owner_id=owner_id, owner_name=owner_name, owner_type="volume")

    def mark_volume_provisioning(self, volume_id: str, *, backend_id: str, primary_id: str, region: str,
                                 status: VolumeStatus = VolumeStatus.PROVISIONING) -> None:
        """Record the provisioning data once the provider created the volume: ``primary_id`` is
        its id (AWS ``vol-...``, the GCP disk's numeric id as a decimal string), ``region`` its
        region (AWS) or zone (GCP)."""
        self._update(volume_id,
                     "status = :s, backend_id = :b, primary_id = :p, region = :g,"
                     " provisioned_at = coalesce(provisioned_at, now())",
                     s=status.value, b=backend_id, p=primary_id, g=region, table="volumes")

    def mark_volume_active(self, volume_id: str) -> None:
        self._update(volume_id, "status = 'active'", table="volumes")

    def mark_volume_deleting(self, volume_id: str) -> None:
        """The platform is deleting the volume: cleanup skips it (``owner_deleting``)."""
        self._update(volume_id, "status = 'deleting'", table="volumes")

    def mark_volume_deleted(self, volume_id: str) -> None:
        """The volume is deleted (or its delete gave up): cleanup deletes whatever is left of it
        once ``deleted_at`` is older than the margin."""
        self._update(volume_id, "status = 'deleted', deleted_at = coalesce(deleted_at, now())", table="volumes")

    def hard_delete_volume(self, volume_id: str) -> None:
        """Delete a failed placeholder volume's row; its ref stays behind in ``provider_refs``."""
        with self.db.transaction() as conn:
            conn.run("DELETE FROM volumes WHERE id = :i", i=volume_id)

    def _update(self, owner_id: str, assignments: str, *, table: str = "instances", **params: object) -> None:
        with self.db.transaction() as conn:
            rows = conn.run(f"UPDATE {table} SET {assignments} WHERE id = :_id RETURNING id",
                            _id=owner_id, **params)
            if not rows:
                raise ConfigError(f"no {table[:-1]} {owner_id!r} in the ledger")


class _RefTaken(Exception):
    pass


def aws_tag_specifications(provider_ref: str, *, tag_key: str = DEFAULT_TAG_KEY,
                           resource_types: tuple[str, ...] = AWS_TAGGABLE) -> list[dict]:
    """``TagSpecifications`` for ``run_instances`` (and friends) carrying the ref."""
    tags = [{"Key": tag_key, "Value": provider_ref}]
    return [{"ResourceType": t, "Tags": list(tags)} for t in resource_types]


def gcp_labels(provider_ref: str, *, label_key: str = DEFAULT_TAG_KEY) -> dict[str, str]:
    """Labels for a GCP instance/disk/address carrying the ref."""
    return {label_key: provider_ref}
