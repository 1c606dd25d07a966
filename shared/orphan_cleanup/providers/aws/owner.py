"""The owner step of a group's deletion on AWS (``aws_delete.GroupDeletion``): terminate
the group's instance and confirm it, unless it is protected (a controller, termination
protection: SAFETY.md rule 14), terminating it would take a volume or interface that is
not the group's with it (``DeleteOnTermination``: rule 15), or its spot request would
replace it and cannot be cancelled first (an untagged, protected or foreign request is
never cancelled)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orphan_cleanup.core.errors import AccessDenied, ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceState
from orphan_cleanup.core.verdicts import DeleteStatus, SkippedResource
from orphan_cleanup.providers.aws.calls import Ec2Calls, Refused
from orphan_cleanup.providers.aws.kinds import (
    ADDRESS,
    BY_KIND,
    INSTANCE,
    KINDS,
    NETWORK_INTERFACE,
    SPOT_REQUEST,
    VOLUME,
    AwsKind,
    dig,
    tags_of,
)
from orphan_cleanup.providers.aws.resources import controller_of
from orphan_cleanup.providers.aws.spot import is_final, must_cancel, request_of
from orphan_cleanup.providers.base import blast_problem

Item = Mapping[str, Any]
#: ``TerminateInstances`` refusing an instance with termination protection.
_TERMINATION_REFUSED = frozenset({"OperationNotPermitted"})


class OwnerSteps:
    """What ``GroupDeletion`` does with the group's instance (its state is the deletion's)."""

    calls: Ec2Calls
    group: ResourceGroup
    region: str
    controller_keys: tuple[str, ...]
    protection: tuple[str, str] | None
    deleted: list[str]
    skipped: list[SkippedResource]
    pending: list[str]
    cancelled: list[str]
    remembered: str | None  # a protection an earlier delete found on the primary
    attached: set[str]  # the group's dependents the owner's re-read shows attached to it
    known_attached: frozenset[str]  # those an earlier deletion of this ref confirmed attached
    primary_was_gone: bool
    unverified: list[str]  # dependents that exist but were not verified attached: left for later
    _gone_instances: set[str]

    def _delete_owner(self, primary: Resource) -> DeleteStatus | None:
        """Terminate and confirm; None means the instance is gone: go on.

        Only the dependents the re-read shows attached to the primary (``attached``) may
        go with it: a listing message may claim any primary and hang anything under it
        (SAFETY.md rules 12 and 15). A primary already gone at this first re-read shows
        nothing any more: then only the resources an earlier deletion of this ref
        confirmed attached to it (``known_attached``) may go; the others wait for the
        next listing to regroup them."""
        pid = primary.id
        item = self.calls.read(INSTANCE, pid)
        if item is None:
            self.attached = set(self.known_attached) & set(self.group.resource_ids())
            self.primary_was_gone = True
            return self._owner_gone(pid)
        reason = self.calls.foreign(INSTANCE, item)
        if reason is not None:
            return self._skip_group(primary, reason)
        # A terminating instance no longer shows its volumes and interfaces: what an earlier
        # call of this ref confirmed attached (before it terminated the instance) still counts.
        self.attached = self._attached_members(item) | (set(self.known_attached) & set(self.group.resource_ids()))
        if INSTANCE.state(item) is not ResourceState.TERMINATING:
            protection = self._protection(pid, item)
            if protection is not None:
                return self._protect_group(primary, *protection)
            fresh = self._protected_member()
            if isinstance(fresh, str):
                return self._skip_group(primary, fresh, others="group_protected" if fresh == "group_protected"
                                        else "owner_skipped")
            blast = self._blast(item, fresh)
            if isinstance(blast, str):
                return self._skip_group(primary, blast)
            reason = self._stop_replacement(item)
            if reason is not None:
                return self._skip_group(primary, reason)
            try:
                self.calls.call(INSTANCE.delete, INSTANCE.not_found, refused=_TERMINATION_REFUSED, target=pid,
                                blast=blast, **INSTANCE.delete_params(pid))
            except Refused as refused:
                return self._protect_group(primary, "termination_protection",
                                           f"{pid}: TerminateInstances answered {refused}")
            item = self.calls.read(INSTANCE, pid)  # seed 002: confirm, never assume
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
        """Why the owner must not be terminated (SAFETY.md rule 14): (reason, detail) or None.

        Its controller tags as re-read now; then its ``disableApiTermination`` attribute,
        which no describe shows. Any value but ``False`` is protection (fail closed). A
        role without ``ec2:DescribeInstanceAttribute`` falls back to the terminate call's
        own refusal (``OperationNotPermitted``), which AWS enforces anyway, except for a
        protection an earlier delete found (``remembered``): it stays one, never probed
        with a terminate call again."""
        controller = controller_of(tags_of(instance, INSTANCE), self.controller_keys)
        if controller is not None:
            return "managed_by_controller", f"{pid} is managed by {controller}"
        try:
            reply = self.calls.call("describe_instance_attribute", INSTANCE.not_found, InstanceId=pid,
                               Attribute="disableApiTermination")
        except AccessDenied:
            if self.remembered is not None:
                return self.remembered, f"{pid}: {self.remembered} found by an earlier delete; the attribute" \
                    " cannot be read (ec2:DescribeInstanceAttribute denied) to see it lifted"
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
        reason = self.calls.foreign(SPOT_REQUEST, request)
        if reason is not None:  # protected, another ref's, or no ref at all: not ours to cancel
            self.skipped.append(SkippedResource(kind=SPOT_REQUEST.kind, id=request_id, reason=reason))
            return f"spot_request_{reason}"
        self.calls.call(SPOT_REQUEST.delete, SPOT_REQUEST.not_found, target=request_id,
                        **SPOT_REQUEST.delete_params(request_id))
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
        reply = self.calls.call(SPOT_REQUEST.describe, SPOT_REQUEST.not_found, SpotInstanceRequestIds=[request_id])
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

    def _attached_members(self, instance: Item) -> set[str]:
        """The group's dependents that the instance as re-read now uses: its block device
        mappings' volumes, its interfaces, its and their security groups, its spot request,
        and the addresses associated with it or its interfaces (read by id). A dependent
        the listing attached to it but the re-read does not show is not verified."""
        enis = [n for n in instance.get("NetworkInterfaces") or [] if isinstance(n, Mapping)]
        used = {dig(b, ("Ebs", "VolumeId")) for b in instance.get("BlockDeviceMappings") or []}
        used |= {n.get("NetworkInterfaceId") for n in enis}
        used |= {g.get("GroupId") for g in instance.get("SecurityGroups") or [] if isinstance(g, Mapping)}
        used |= {g.get("GroupId") for n in enis for g in n.get("Groups") or [] if isinstance(g, Mapping)}
        used.add(instance.get("SpotInstanceRequestId"))
        addresses = sorted(r.id for r in self.group.resources if r.kind is ADDRESS.kind)
        if addresses:
            reply = self.calls.call(ADDRESS.describe, frozenset(),
                                    Filters=[{"Name": ADDRESS.id_filter, "Values": addresses}])
            eni_ids = {n.get("NetworkInterfaceId") for n in enis}
            used |= {ADDRESS.item_id(a) for a in ADDRESS.items(reply or {})
                     if a.get("InstanceId") == instance.get("InstanceId") or
                     (a.get("NetworkInterfaceId") and a.get("NetworkInterfaceId") in eni_ids)}
        return {str(i) for i in used if i} & set(self.group.resource_ids())

    def _protected_member(self) -> dict[str, Item] | str:
        """Every dependent of the group re-read by id right before the terminate: a protect
        tag on any of them protects the whole group, as the classifier reads the listing
        (SAFETY.md rule 12), whether or not the terminate would take it. Returns the items
        read (by id), or why the group is skipped: ``group_protected`` (the protected members
        named in ``skipped``), ``member_unreadable`` (a member neither answered nor said gone)."""
        fresh: dict[str, Item] = {}
        unread: list[Resource] = []
        for spec in KINDS:
            ids = sorted(r.id for r in self.group.resources if r.kind is spec.kind and r.id != self.group.primary_id)
            if not ids:
                continue
            reply = self.calls.call(spec.describe, frozenset(), Filters=[{"Name": spec.id_filter, "Values": ids}])
            fresh.update((spec.item_id(i), i) for i in spec.items(reply or {}))
            for rid in (i for i in ids if i not in fresh):  # left out of the answer: asked by id
                item = self._member_by_id(spec, rid)
                if isinstance(item, Mapping):
                    fresh[rid] = item
                elif item:
                    unread += [r for r in self.group.resources if r.id == rid]
        protected = [r for r in self.group.resources if r.id in fresh
                     and not self.calls.protect_keys.isdisjoint(tags_of(fresh[r.id], BY_KIND[r.kind]))]
        if protected:
            self.skipped.extend(SkippedResource(kind=r.kind, id=r.id, reason="protected") for r in protected)
            return "group_protected"
        if unread:  # fail closed: what cannot be read may carry a protect tag (SAFETY.md rule 1)
            self.skipped.extend(SkippedResource(kind=r.kind, id=r.id, reason="unreadable") for r in unread)
            return "member_unreadable"
        return fresh

    def _member_by_id(self, spec: AwsKind, rid: str) -> Item | bool:
        """A member the filtered re-read left out, asked by its id: the item, False when EC2
        says it is gone (its not-found code, or terminated), True when the answer leaves it
        out again (unreadable: never taken for gone)."""
        params: dict[str, Any] = {spec.ids_param: [rid]}
        reply = self.calls.call(spec.describe, spec.not_found, **params)
        if reply is None:
            return False
        items = [i for i in spec.items(reply) if spec.item_id(i) == rid]
        if len(items) != 1:
            return True
        return False if spec.state(items[0]) is ResourceState.TERMINATED else items[0]

    def _blast(self, instance: Item, fresh: Mapping[str, Item]) -> tuple[str, ...] | str:
        """SAFETY.md rule 15: what ``TerminateInstances`` deletes along with the instance,
        its ``DeleteOnTermination`` volumes and interfaces (a missing flag read as "deleted
        with it"), read afresh. Each must be a member of the group that still carries its
        ref and no protect tag, or carry neither the ref tag key nor a protect tag and be the
        instance's own root volume (its device is the instance's ``RootDeviceName``) or
        primary interface (device index 0 on network card 0): anything else attached later
        with the flag set is not the instance's to take. Returns the blast's ids, or the
        reason the group is skipped (every blocking resource named in ``skipped``)."""
        members = set(self.group.resource_ids())
        root = instance.get("RootDeviceName") or None
        doomed: dict[AwsKind, dict[str, bool]] = {  # id -> whether it is the instance's own device
            VOLUME: {str(dig(b, ("Ebs", "VolumeId"))): root is not None and b.get("DeviceName") == root
                     for b in instance.get("BlockDeviceMappings") or []
                     if dig(b, ("Ebs", "DeleteOnTermination")) is not False and dig(b, ("Ebs", "VolumeId"))},
            NETWORK_INTERFACE: {str(n.get("NetworkInterfaceId")): dig(n, ("Attachment", "DeviceIndex")) == 0
                                and dig(n, ("Attachment", "NetworkCardIndex")) in (None, 0)
                                for n in instance.get("NetworkInterfaces") or []
                                if dig(n, ("Attachment", "DeleteOnTermination")) is not False
                                and n.get("NetworkInterfaceId")},
        }
        blast: list[str] = []
        blocked: list[str] = []
        for spec, own in doomed.items():
            ids = sorted(own)
            if not ids:
                continue
            items = [fresh[i] for i in ids if i in fresh]  # the group's own, just re-read
            if rest := [i for i in ids if i not in fresh]:
                reply = self.calls.call(spec.describe, frozenset(), Filters=[{"Name": spec.id_filter, "Values": rest}])
                items += spec.items(reply or {})
            unread = set(ids) - {spec.item_id(i) for i in items}
            for rid in sorted(unread):  # named by the instance, not answered: cannot be verified (fail closed)
                self.skipped.append(SkippedResource(kind=spec.kind, id=rid, reason="blast_unreadable"))
                blocked.append("blast_unreadable")
            for item in items:
                rid = spec.item_id(item)
                why = blast_problem(tags_of(item, spec), member=rid in members, ref=self.group.provider_ref,
                                    tag_key=self.calls.tag_key, protect_keys=self.calls.protect_keys,
                                    own_device=own.get(rid, False))
                if why is None:
                    blast.append(rid)
                else:
                    self.skipped.append(SkippedResource(kind=spec.kind, id=rid, reason=why))
                    blocked.append(why)
        return blocked[0] if blocked else tuple(blast)

    def _skip_group(self, primary: Resource, reason: str, others: str = "owner_skipped") -> DeleteStatus:
        """The whole group left alone: the primary for ``reason``, each member not named
        yet for ``others`` (``group_protected`` when a member's protect tag keeps it)."""
        self.skipped.insert(0, SkippedResource(kind=primary.kind, id=primary.id, reason=reason))
        listed = {s.id for s in self.skipped}
        self.skipped.extend(
            SkippedResource(kind=r.kind, id=r.id, reason=others)
            for r in self.group.resources
            if r.id not in listed
        )
        return DeleteStatus.SKIPPED

