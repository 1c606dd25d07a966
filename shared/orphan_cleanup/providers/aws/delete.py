"""Deleting one orphan group on AWS: the deletion contract of ``ResourceProvider``.

Safety rules this module keeps (SAFETY.md rules 1 and 3, seed 002):

- it only ever acts on ids that are in the group; other ids (the instance an
  interface or address is attached to) are only *read*;
- every resource is re-read by its id right before acting; one that is gone is
  done, one whose ref changed or disappeared, or that carries the protect tag,
  is left alone and reported as skipped;
- if the owner instance is skipped, or terminating it would make AWS delete a
  protected volume/interface or one of another ref (``DeleteOnTermination``),
  nothing in the group is touched;
- an owner that now names a controller (its tags, as the listing reads them) or has
  termination protection (``DescribeInstanceAttribute disableApiTermination``, and
  ``OperationNotPermitted`` from ``TerminateInstances`` as the fallback) is never
  terminated: the result is ``PROTECTED`` with the reason (SAFETY.md rule 14);
- a spot owner whose ``persistent`` request could launch a replacement has that request
  cancelled (and the cancel confirmed by a re-read) before it is terminated; a request
  that cannot be read as one-time or cancelled, or whose cancel fails, stops the group
  (``aws_spot``); a protected request, or one of another ref, skips it;
- termination is confirmed by a re-read (shutting-down or terminated);
- with ``snapshot_before_delete`` a volume is deleted only once a snapshot of it, tagged
  with the ref and its id, is ``completed`` (``aws_snapshot``): pending is "not yet",
  ``error`` fails the group; a snapshot is deleted only after its group's volumes;
- a dependent still in use by something alive is "not yet" (pending), never
  detached from a live instance: only an instance EC2 answers ``terminated`` is
  gone (``InvalidInstanceID.NotFound`` is not proof); while anything of a kind it depends on is
  pending, a kind is not tried (an interface waits for the group's
  addresses, a security group for its interfaces) and is pending too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from orphan_cleanup.core.errors import DependencyNotReady, ProviderError
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus, SkippedResource
from orphan_cleanup.providers.aws.calls import Ec2Calls
from orphan_cleanup.providers.aws.kinds import (
    ADDRESS,
    BY_KIND,
    DELETE_ORDER,
    INSTANCE,
    NETWORK_INTERFACE,
    SNAPSHOT,
    SPOT_REQUEST,
    VOLUME,
    AwsKind,
    dig,
)
from orphan_cleanup.providers.aws.owner import OwnerSteps
from orphan_cleanup.providers.aws.snapshots import VolumeSnapshots, expired, taken_by_us

Item = Mapping[str, Any]
_ASSOCIATION_GONE = frozenset({"InvalidAssociationID.NotFound"})
_ATTACHMENT_GONE = frozenset({"InvalidAttachmentID.NotFound"})


class GroupDeletion(OwnerSteps):
    """One ``delete_resource_group`` call against one region's EC2 client."""

    def __init__(self, ec2: Any, group: ResourceGroup, *, tag_key: str, protect_key: str,
                 protect_keys: Iterable[str] = (), controller_keys: Iterable[str] = (),
                 snapshot_before_delete: bool = False, retain_snapshots_days: int | None = None,
                 journal: Journal = NO_JOURNAL,
                 remembered_protection: str | None = None, known_attached: Iterable[str] = ()) -> None:
        self.ec2 = ec2
        self.calls = Ec2Calls(ec2, region=group.region, ref=group.provider_ref, tag_key=tag_key,
                              protect_keys={protect_key, *protect_keys}, journal=journal)
        self.remembered = remembered_protection
        self.snapshots = VolumeSnapshots(self.calls.call, tag_key=tag_key, ref=group.provider_ref,
                                         region=group.region) if snapshot_before_delete else None
        self.controller_keys = tuple(controller_keys)
        self.retain_days = retain_snapshots_days
        self.protection: tuple[str, str] | None = None
        self.group = group
        self.region = group.region
        self.tag_key = tag_key
        self.protect_key = protect_key
        self.deleted: list[str] = []
        self.skipped: list[SkippedResource] = []
        self.pending: list[str] = []
        self.cancelled: list[str] = []
        self.attached: set[str] = set()
        self.known_attached = frozenset(known_attached)
        self.primary_was_gone = False
        self.unverified: list[str] = []
        self._gone_instances: set[str] = set()

    def run(self) -> DeleteResult:
        self._check_shape()
        primary = self.group.primary
        if primary is not None:
            status = self._delete_owner(primary)
            if status is not None:
                return self._result(status)
        for spec in DELETE_ORDER:
            blocked = any(self._has_pending(kind) for kind in spec.depends_on)
            for res in self._members(spec.kind):
                if res.id == self.group.primary_id:
                    continue
                if primary is not None and res.id not in self.attached and spec is not SNAPSHOT:
                    # (a snapshot is verified as one the deleter took itself instead)
                    self._unverified(spec, res)
                    continue
                if blocked:
                    self.pending.append(res.id)
                else:
                    self._delete_dependent(spec, res)
        return self._result(None)

    # -- dependents -----------------------------------------------------------------

    def _unverified(self, spec: AwsKind, res: Resource) -> None:
        """A dependent listed with the primary that no re-read showed attached to it: done
        if it is gone, else left alone for the next listing to regroup (never deleted)."""
        if self.calls.read(spec, res.id) is None:
            self.deleted.append(res.id)
            return
        reason = "primary_gone" if self.primary_was_gone else "not_attached"
        self.skipped.append(SkippedResource(kind=res.kind, id=res.id, reason=reason))
        self.unverified.append(res.id)

    def _delete_dependent(self, spec: AwsKind, res: Resource) -> None:
        item = self.calls.read(spec, res.id)
        if item is None or spec.state(item) is ResourceState.TERMINATING:
            self.deleted.append(res.id)
            return
        reason = self.calls.foreign(spec, item)
        if reason is None and spec is SNAPSHOT:
            reason = self._snapshot_kept(item)
        if reason is not None:
            self.skipped.append(SkippedResource(kind=spec.kind, id=res.id, reason=reason))
            return
        try:
            ready = self._prepare(spec, item)
            if ready:
                self.calls.call(spec.delete, spec.not_found, target=res.id, **spec.delete_params(res.id))
                if spec is SPOT_REQUEST:
                    self.cancelled.append(res.id)
        except DependencyNotReady:
            ready = False
        (self.deleted if ready else self.pending).append(res.id)

    def _snapshot_kept(self, snapshot: Item) -> str | None:
        """Why a snapshot of the group is not deleted, on its re-read values (never the
        listing's, which a forged batch could carry): one the deleter did not take itself
        (SAFETY.md rule 15), or one its retention keeps (``retain_snapshots_days`` unset:
        kept forever; else younger than that, or of no readable age)."""
        if not taken_by_us(snapshot, self.calls.tag_key, self.group.provider_ref):
            return "not_our_snapshot"
        if self.retain_days is None or not expired(snapshot, retain_days=self.retain_days, now=datetime.now(UTC)):
            return "snapshot_retained"
        return None

    def _prepare(self, spec: AwsKind, item: Item) -> bool:
        """Make ``item`` deletable if that is safe; False means "not yet"."""
        if spec is VOLUME:  # never detach a volume
            if VOLUME.raw_state(item) != "available":
                return False
            return self.snapshots is None or self.snapshots.ready(VOLUME.item_id(item))
        if spec is NETWORK_INTERFACE:
            return self._detach_interface(item)
        if spec is ADDRESS:
            return self._disassociate_address(item)
        if spec is SPOT_REQUEST:  # never cancel the request of a live instance outside the group
            instance_id = item.get("InstanceId")
            return not instance_id or self._instance_gone(str(instance_id))
        return True

    def _detach_interface(self, eni: Item) -> bool:
        attachment = eni.get("Attachment") or {}
        if not attachment or attachment.get("Status") == "detached":
            return True
        instance_id = attachment.get("InstanceId")
        if not instance_id or not self._instance_gone(str(instance_id)):
            return False
        self.calls.call("detach_network_interface", _ATTACHMENT_GONE, target=NETWORK_INTERFACE.item_id(eni),
                        AttachmentId=attachment["AttachmentId"])
        return True

    def _disassociate_address(self, address: Item) -> bool:
        """Break an association only from things that are gone or are ours to delete."""
        association = address.get("AssociationId")
        if not association:
            return True
        instance_id = address.get("InstanceId") or None
        eni_id = address.get("NetworkInterfaceId") or None
        ours = {r.id for r in self._members(ResourceKind.NETWORK_INTERFACE)}
        if instance_id is not None and not self._instance_gone(str(instance_id)):
            return False
        if eni_id is not None:
            if eni_id in ours:
                if not self._interface_free(str(eni_id)):
                    return False
            elif instance_id is None:
                return False  # an interface that is not ours and not of a gone instance
        self.calls.call("disassociate_address", _ASSOCIATION_GONE, target=ADDRESS.item_id(address),
                        AssociationId=association)
        return True

    def _interface_free(self, eni_id: str) -> bool:
        eni = self.calls.read(NETWORK_INTERFACE, eni_id)
        if eni is None:
            return True
        if self.calls.foreign(NETWORK_INTERFACE, eni) is not None:
            return False
        instance_id = dig(eni, ("Attachment", "InstanceId"))
        return not instance_id or self._instance_gone(str(instance_id))

    def _instance_gone(self, instance_id: str) -> bool:
        """Whether EC2 answers, now, that the instance is ``terminated``: the only proof that
        something may be detached from it (SAFETY.md rule 3). ``InvalidInstanceID.NotFound``
        is not: EC2 answers it for an instance launched moments ago (eventual consistency),
        so an unknown instance is "not yet" (pending), as a live one. The group's own
        primary found gone at this call's first re-read counts (``_owner_gone``). A read
        only: never acts on that id."""
        if instance_id in self._gone_instances:
            return True
        params: dict[str, Any] = {INSTANCE.ids_param: [instance_id]}
        reply = self.calls.call(INSTANCE.describe, INSTANCE.not_found, **params)
        items = [i for i in INSTANCE.items(reply or {}) if INSTANCE.item_id(i) == instance_id]
        if len(items) == 1 and INSTANCE.raw_state(items[0]) == "terminated":
            self._gone_instances.add(instance_id)
            return True
        return False

    # -- shape and result -----------------------------------------------------------------

    def _members(self, kind: ResourceKind) -> list[Resource]:
        return [r for r in self.group.resources if r.kind is kind]

    def _has_pending(self, kind: ResourceKind) -> bool:
        ids = {r.id for r in self._members(kind)}
        return any(i in ids for i in self.pending)

    def _check_shape(self) -> None:
        """Fail closed on a group this adapter could not have listed."""
        problems = [f"{r.kind} {r.id} in {r.region}" for r in self.group.resources
                    if r.kind not in BY_KIND or r.region != self.region]
        problems += [f"instance {r.id} is not the primary" for r in self._members(ResourceKind.INSTANCE)
                     if r.id != self.group.primary_id]
        if self.group.primary_id is not None and (
            self.group.primary is None or self.group.primary.kind is not ResourceKind.INSTANCE
        ):
            problems.append(f"primary {self.group.primary_id} is not an instance of the group")
        if len(set(self.group.resource_ids())) != len(self.group.resources):
            problems.append("duplicate ids")
        if problems:
            raise ProviderError(f"refusing group {self.group.key}: {'; '.join(problems)}", region=self.region)

    def _result(self, status: DeleteStatus | None) -> DeleteResult:
        if status is None:
            if self.pending:
                status = DeleteStatus.DELETING
            elif self.unverified:  # the group is not done: unsettled, the next listing regroups them
                status = DeleteStatus.SKIPPED if self.primary_was_gone else DeleteStatus.DELETING
            elif self.skipped and not self.deleted:
                status = DeleteStatus.SKIPPED
            else:
                status = DeleteStatus.DELETED
        protected = status is DeleteStatus.PROTECTED and self.protection is not None
        return DeleteResult(
            status=status,
            deleted=tuple(self.deleted),
            skipped=tuple(self.skipped),
            pending=tuple(self.pending),
            protection=self.protection[0] if protected and self.protection else None,
            protection_detail=self.protection[1] if protected and self.protection else None,
            cancelled_requests=tuple(self.cancelled),
            attached=tuple(sorted(self.attached)),
            snapshots=tuple(self.snapshots.completed) if self.snapshots else (),
            snapshots_pending=tuple(self.snapshots.pending) if self.snapshots else (),
        )
