"""Deleting one orphan group on AWS: the deletion contract of ``ResourceProvider``.

Safety rules this module keeps (DESIGN §5 rules 1 and 3, seed 002):

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
  terminated: the result is ``PROTECTED`` with the reason (DESIGN §5 rule 14);
- a spot owner whose ``persistent`` request could launch a replacement has that request
  cancelled (and the cancel confirmed by a re-read) before it is terminated; a request
  that cannot be read as one-time or cancelled, or whose cancel fails, stops the group
  (``aws_spot``); a protected request, or one of another ref, skips it;
- termination is confirmed by a re-read (shutting-down or terminated);
- with ``snapshot_before_delete`` a volume is deleted only once a snapshot of it, tagged
  with the ref and its id, is ``completed`` (``aws_snapshot``): pending is "not yet",
  ``error`` fails the group; a snapshot is deleted only after its group's volumes;
- a dependent still in use by something alive is "not yet" (pending), never
  detached from a live instance; while anything of a kind it depends on is
  pending, a kind is not tried (an interface waits for the group's
  addresses, a security group for its interfaces) and is pending too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from orphan_cleanup.core.errors import AccessDenied, DependencyNotReady, ProviderError
from orphan_cleanup.core.models import (
    DeleteResult,
    DeleteStatus,
    Resource,
    ResourceGroup,
    ResourceKind,
    ResourceState,
    SkippedResource,
)
from orphan_cleanup.providers.aws_errors import SDK_ERRORS, error_code, translate_error
from orphan_cleanup.providers.aws_kinds import (
    ADDRESS,
    BY_KIND,
    DELETE_ORDER,
    INSTANCE,
    NETWORK_INTERFACE,
    SPOT_REQUEST,
    VOLUME,
    AwsKind,
    controller_of,
    dig,
    tags_of,
)
from orphan_cleanup.providers.aws_snapshot import VolumeSnapshots
from orphan_cleanup.providers.aws_spot import is_final, must_cancel, request_of

Item = Mapping[str, Any]
_ASSOCIATION_GONE = frozenset({"InvalidAssociationID.NotFound"})
_ATTACHMENT_GONE = frozenset({"InvalidAttachmentID.NotFound"})
#: ``TerminateInstances`` refusing an instance with termination protection.
_TERMINATION_REFUSED = frozenset({"OperationNotPermitted"})


class _Refused(Exception):
    """A call answered with one of its ``refused`` codes (never leaves this module)."""


class GroupDeletion:
    """One ``delete_resource_group`` call against one region's EC2 client."""

    def __init__(self, ec2: Any, group: ResourceGroup, *, tag_key: str, protect_key: str,
                 controller_keys: Iterable[str] = (), snapshot_before_delete: bool = False) -> None:
        self.ec2 = ec2
        self.snapshots = VolumeSnapshots(self._call, tag_key=tag_key, ref=group.provider_ref, region=group.region) \
            if snapshot_before_delete else None
        self.controller_keys = tuple(controller_keys)
        self.protection: tuple[str, str] | None = None
        self.group = group
        self.region = group.region
        self.tag_key = tag_key
        self.protect_key = protect_key
        self.deleted: list[str] = []
        self.skipped: list[SkippedResource] = []
        self.pending: list[str] = []
        self.cancelled: list[str] = []
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
                if blocked:
                    self.pending.append(res.id)
                else:
                    self._delete_dependent(spec, res)
        return self._result(None)

    # -- the owner -----------------------------------------------------------------

    def _delete_owner(self, primary: Resource) -> DeleteStatus | None:
        """Terminate and confirm; None means the instance is gone: go on."""
        pid = primary.id
        item = self._read(INSTANCE, pid)
        if item is None:
            return self._owner_gone(pid)
        reason = self._foreign(INSTANCE, item) or self._cascade_blocker(item)
        if reason is not None:
            return self._skip_group(primary, reason)
        if INSTANCE.state(item) is not ResourceState.TERMINATING:
            protection = self._protection(pid, item)
            if protection is not None:
                return self._protect_group(primary, *protection)
            reason = self._stop_replacement(item)
            if reason is not None:
                return self._skip_group(primary, reason)
            try:
                self._call(INSTANCE.delete, INSTANCE.not_found, refused=_TERMINATION_REFUSED,
                           **INSTANCE.delete_params(pid))
            except _Refused as refused:
                return self._protect_group(primary, "termination_protection",
                                           f"{pid}: TerminateInstances answered {refused}")
            item = self._read(INSTANCE, pid)  # seed 002: confirm, never assume
            if item is None:
                return self._owner_gone(pid)
            if INSTANCE.state(item) is not ResourceState.TERMINATING:
                raise ProviderError(
                    f"instance {pid} is {INSTANCE.raw_state(item)!r} after terminate_instances, "
                    "not shutting-down or terminated",
                    region=self.region,
                )
        self.deleted.append(pid)
        self.pending.extend(i for i in self.group.resource_ids() if i != pid and i not in self.deleted)
        return DeleteStatus.DELETING

    def _owner_gone(self, pid: str) -> DeleteStatus | None:
        """The instance is gone (counted deleted): go on with the dependents (None)."""
        self._gone_instances.add(pid)
        self.deleted.append(pid)
        return None

    def _protection(self, pid: str, instance: Item) -> tuple[str, str] | None:
        """Why the owner must not be terminated (DESIGN §5 rule 14): (reason, detail) or None.

        Its controller tags as re-read now; then its ``disableApiTermination`` attribute,
        which no describe shows. Any value but ``False`` is protection (fail closed). A
        role without ``ec2:DescribeInstanceAttribute`` falls back to the terminate call's
        own refusal (``OperationNotPermitted``), which AWS enforces anyway."""
        controller = controller_of(tags_of(instance, INSTANCE), self.controller_keys)
        if controller is not None:
            return "managed_by_controller", f"{pid} is managed by {controller}"
        try:
            reply = self._call("describe_instance_attribute", INSTANCE.not_found, InstanceId=pid,
                               Attribute="disableApiTermination")
        except AccessDenied:
            return None
        if reply is None:
            return None  # gone since the re-read: the terminate finds it gone too
        if dig(reply, ("DisableApiTermination", "Value")) is not False:
            return "termination_protection", f"{pid} has disableApiTermination" \
                f" {dig(reply, ('DisableApiTermination', 'Value'))!r}"
        return None

    def _stop_replacement(self, instance: Item) -> str | None:
        """Cancel the spot request that would replace the owner once terminated, and
        confirm it; None to go on, or why the group is skipped (the request is protected
        or carries another ref). ``ProviderError`` when the request cannot be read as
        one-time or cancelled, or the cancel does not take: nothing is terminated."""
        request_id = request_of(instance, region=self.region)
        if request_id is None:
            return None
        request = self._read_request(request_id)
        if request is None or not must_cancel(request, region=self.region):
            return None
        reason = self._foreign(SPOT_REQUEST, request)
        if reason in ("protected", "ref_changed"):
            if request_id in self.group.resource_ids():
                self.skipped.append(SkippedResource(kind=SPOT_REQUEST.kind, id=request_id, reason=reason))
            return f"spot_request_{reason}"
        self._call(SPOT_REQUEST.delete, SPOT_REQUEST.not_found, **SPOT_REQUEST.delete_params(request_id))
        if not is_final(self._read_request(request_id, confirming=True)):
            raise ProviderError(f"spot request {request_id} is not cancelled after cancel_spot_instance_requests",
                                region=self.region)
        self.cancelled.append(request_id)
        if request_id in self.group.resource_ids():
            self.deleted.append(request_id)
        return None

    def _read_request(self, request_id: str, *, confirming: bool = False) -> Item | None:
        """Re-read a spot request by id: None when EC2 says it is not found (or, after our
        own cancel, returns nothing); any other reply but exactly that request is an error."""
        reply = self._call(SPOT_REQUEST.describe, SPOT_REQUEST.not_found, SpotInstanceRequestIds=[request_id])
        if reply is None:
            return None
        items = list(SPOT_REQUEST.items(reply))
        if len(items) == 1 and items[0].get(SPOT_REQUEST.id_field) == request_id:
            return items[0]
        if not items and confirming:
            return None
        raise ProviderError(f"{SPOT_REQUEST.describe} for {request_id} returned"
                            f" {[i.get(SPOT_REQUEST.id_field) for i in items]}", region=self.region)

    def _protect_group(self, primary: Resource, reason: str, detail: str) -> DeleteStatus:
        self.protection = (reason, detail)
        self._skip_group(primary, reason)
        return DeleteStatus.PROTECTED

    def _cascade_blocker(self, instance: Item) -> str | None:
        """Would terminating take a volume/interface we must not delete with it?

        AWS deletes ``DeleteOnTermination`` volumes and interfaces with the
        instance; if one of them is protected or carries another ref, the owner
        is not terminated. Untagged ones (root disk, primary interface) are part
        of the instance. A missing flag is read as "deleted with it".
        """
        doomed = {
            VOLUME: [dig(b, ("Ebs", "VolumeId")) for b in instance.get("BlockDeviceMappings") or []
                     if dig(b, ("Ebs", "DeleteOnTermination")) is not False],
            NETWORK_INTERFACE: [n.get("NetworkInterfaceId") for n in instance.get("NetworkInterfaces") or []
                                if dig(n, ("Attachment", "DeleteOnTermination")) is not False],
        }
        for spec, ids in doomed.items():
            ids = sorted({str(i) for i in ids if i})
            if not ids:
                continue
            reply = self._call(spec.describe, frozenset(), Filters=[{"Name": spec.id_filter, "Values": ids}])
            for item in spec.items(reply or {}):
                reason = self._foreign(spec, item)
                if reason in ("protected", "ref_changed"):
                    if spec.item_id(item) in self.group.resource_ids():
                        self.skipped.append(SkippedResource(kind=spec.kind, id=spec.item_id(item), reason=reason))
                    return f"dependent_{reason}"
        return None

    def _skip_group(self, primary: Resource, reason: str) -> DeleteStatus:
        self.skipped.insert(0, SkippedResource(kind=primary.kind, id=primary.id, reason=reason))
        listed = {s.id for s in self.skipped}
        self.skipped.extend(
            SkippedResource(kind=r.kind, id=r.id, reason="owner_skipped")
            for r in self.group.resources
            if r.id not in listed
        )
        return DeleteStatus.SKIPPED

    # -- dependents -----------------------------------------------------------------

    def _delete_dependent(self, spec: AwsKind, res: Resource) -> None:
        item = self._read(spec, res.id)
        if item is None or spec.state(item) is ResourceState.TERMINATING:
            self.deleted.append(res.id)
            return
        reason = self._foreign(spec, item)
        if reason is not None:
            self.skipped.append(SkippedResource(kind=spec.kind, id=res.id, reason=reason))
            return
        try:
            ready = self._prepare(spec, item)
            if ready:
                self._call(spec.delete, spec.not_found, **spec.delete_params(res.id))
                if spec is SPOT_REQUEST:
                    self.cancelled.append(res.id)
        except DependencyNotReady:
            ready = False
        (self.deleted if ready else self.pending).append(res.id)

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
        self._call("detach_network_interface", _ATTACHMENT_GONE, AttachmentId=attachment["AttachmentId"])
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
        self._call("disassociate_address", _ASSOCIATION_GONE, AssociationId=association)
        return True

    def _interface_free(self, eni_id: str) -> bool:
        eni = self._read(NETWORK_INTERFACE, eni_id)
        if eni is None:
            return True
        if self._foreign(NETWORK_INTERFACE, eni) is not None:
            return False
        instance_id = dig(eni, ("Attachment", "InstanceId"))
        return not instance_id or self._instance_gone(str(instance_id))

    def _instance_gone(self, instance_id: str) -> bool:
        """Terminated or unknown to EC2. A read only: never acts on that id."""
        if instance_id not in self._gone_instances and self._read(INSTANCE, instance_id) is None:
            self._gone_instances.add(instance_id)
        return instance_id in self._gone_instances

    # -- reading and calling ------------------------------------------------------------

    def _read(self, spec: AwsKind, resource_id: str) -> Item | None:
        """Re-read one resource by id; None when it is gone (or terminated/deleted)."""
        params: dict[str, Any] = {spec.ids_param: [resource_id]}
        reply = self._call(spec.describe, spec.not_found, **params)
        try:
            items = [it for it in spec.items(reply or {}) if spec.item_id(it) == resource_id]
        except KeyError as exc:  # an item without its id: fail closed, never "gone"
            raise ProviderError(f"{spec.describe} returned an item without {exc}", region=self.region) from exc
        if len(items) > 1:
            raise ProviderError(f"{spec.describe} returned {resource_id} twice", region=self.region)
        if not items or spec.state(items[0]) is ResourceState.TERMINATED:
            return None
        return items[0]

    def _foreign(self, spec: AwsKind, item: Item) -> str | None:
        """Why this item is not ours to delete, or None when it is."""
        tags = tags_of(item, spec)
        if self.protect_key in tags:
            return "protected"
        if self.tag_key not in tags:
            return "ref_missing"
        if tags[self.tag_key] != self.group.provider_ref:
            return "ref_changed"
        return None

    def _call(self, method: str, gone: frozenset[str], *, refused: frozenset[str] = frozenset(),
              **params: Any) -> Mapping[str, Any] | None:
        """One EC2 call; None when its error code says the target is already gone,
        ``_Refused`` (the code) when it is one of ``refused``."""
        try:
            return getattr(self.ec2, method)(**params)
        except SDK_ERRORS as exc:
            if isinstance(exc, ClientError) and error_code(exc) in gone:
                return None
            if isinstance(exc, ClientError) and error_code(exc) in refused:
                raise _Refused(error_code(exc)) from exc
            raise translate_error(exc, region=self.region, operation=method) from exc

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
            snapshots=tuple(self.snapshots.completed) if self.snapshots else (),
            snapshots_pending=tuple(self.snapshots.pending) if self.snapshots else (),
        )
