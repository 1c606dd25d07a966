"""What the ledger says of a ref (step 3): its ``provider_refs`` row and its owner, as a
pydantic ``LedgerRecord`` or a msgspec ``LedgerRow`` decoded from the join's document."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import msgspec
from pydantic import Field

from orphan_cleanup.core.listing import Frozen


class OwnerStatus(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    IDLE = "idle"
    BUSY = "busy"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


class VolumeStatus(StrEnum):
    """A ``volumes`` row's status (README, C1: a ref whose ``owner_type`` is ``volume``)."""

    PENDING = "pending"
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    DELETING = "deleting"
    DELETED = "deleted"


class LedgerRecord(Frozen):
    """STEP 3's view of one ref: the ``provider_refs`` row and its owner, if any.

    The owner is the row of the table its ``owner_type`` names: ``instances`` for an
    instance (or a gateway), ``volumes`` for a volume; ``instance_found`` says that row
    was found (a volume has no ``terminated_at``: None). ``owner_*`` fields are ``None``
    when the owner row is gone (hard delete).
    """

    provider_ref: str
    owner_type: str = "instance"
    owner_id: str | None = None
    owner_name: str | None = None
    issued_at: datetime | None = None
    instance_found: bool = False  # the owner row (instances or volumes, by owner_type) was found
    status: OwnerStatus | str | None = None  # a volume's (VolumeStatus) is read as a str
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


class Keep(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An operator's keep of a ref (``orphans keep``, the ``orphan_keeps`` row of the cycle's
    backend): every group of the ref that is not tracked is protected (``kept_by_operator``),
    never deleted (SAFETY.md rule 23). ``until`` None: until released. STEP 3 reads only the
    keeps in force at the cycle's listing time."""

    reason: str | None
    kept_at: datetime
    until: datetime | None
