"""A small platform that follows the ledger protocol against a ``MemoryCloud``:
used by pipeline tests and the simulation to create tracked and leaked resources."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import ResourceKind
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient
from orphan_cleanup.ledger.db import Database
from tests.support.memory_cloud import MemoryCloud

HOUR_AGO = timedelta(hours=1)


def add_backend(db: Database, backend_id: str = "mem", regions: tuple[str, ...] = ("r1", "r2"),
                mode: str | None = None, settings: str = "{}") -> None:
    with db.transaction() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                 " VALUES (:i, 'aws', '123456789012', CAST(:r AS text[]), CAST(:s AS jsonb), :m)",
                 i=backend_id, r=list(regions), s=settings, m=mode)


@dataclass
class Platform:
    db: Database
    cloud: MemoryCloud
    backend_id: str = "mem"

    def __post_init__(self) -> None:
        self.ledger = LedgerClient(self.db)

    def age(self, owner_id: str, by: timedelta = HOUR_AGO) -> None:
        """Move every timestamp of an owner and its ref into the past (outside the margin)."""
        with self.db.transaction() as conn:
            conn.run("UPDATE instances SET created_at = created_at - CAST(:d AS interval),"
                     " provisioned_at = provisioned_at - CAST(:d AS interval),"
                     " terminated_at = terminated_at - CAST(:d AS interval),"
                     " deleted_at = deleted_at - CAST(:d AS interval) WHERE id = :i",
                     d=f"{int(by.total_seconds())} seconds", i=owner_id)
            conn.run("UPDATE provider_refs SET issued_at = issued_at - CAST(:d AS interval) WHERE owner_id = :i",
                     d=f"{int(by.total_seconds())} seconds", i=owner_id)

    def create_vm(self, ref: str, region: str = "r1", *, volume: bool = True, protect: bool = False,
                  created_at: datetime | None = None) -> tuple[str, list[str]]:
        tags = {DEFAULT_TAG_KEY: ref}
        if protect:
            tags[DEFAULT_PROTECT_KEY] = "yes"
        when = created_at or datetime.now(timezone.utc) - 2 * HOUR_AGO
        iid = self.cloud.create(ResourceKind.INSTANCE, region, tags, created_at=when)
        deps = []
        if volume:
            deps.append(self.cloud.create(ResourceKind.VOLUME, region, {DEFAULT_TAG_KEY: ref},
                                          attached_to=iid, created_at=when))
        return iid, deps

    def tracked(self, region: str = "r1", **kw) -> tuple[str, str, str]:
        issued = self.ledger.issue_ref(owner_name="tracked")
        iid, _ = self.create_vm(issued.provider_ref, region, **kw)
        self.ledger.mark_provisioning(issued.owner_id, backend_id=self.backend_id, primary_id=iid, region=region,
                                      status=OwnerStatus.BUSY)
        self.age(issued.owner_id)
        return issued.provider_ref, issued.owner_id, iid

    def terminated_leak(self, region: str = "r1", **kw) -> tuple[str, str, str]:
        """Termination gave up: the owner is terminated, the VM still runs."""
        ref, owner, iid = self.tracked(region, **kw)
        self.ledger.mark_terminated(owner)
        self.age(owner)
        return ref, owner, iid

    def placeholder_leak(self, region: str = "r1") -> tuple[str, str, str]:
        """A failed placeholder hard-deleted after its provider call created a VM."""
        issued = self.ledger.issue_ref(owner_name="placeholder")
        iid, _ = self.create_vm(issued.provider_ref, region)
        self.age(issued.owner_id)
        self.ledger.hard_delete(issued.owner_id)
        return issued.provider_ref, issued.owner_id, iid

    def foreign(self, region: str = "r1") -> str:
        """Another platform's VM: a valid-looking ref that is not in this ledger."""
        iid, _ = self.create_vm("zzzzforeign1", region)
        return iid
