"""The deletion's operations on EC2 (``deletion.Operations``) in one region: reads by id,
the facts only EC2 shows (termination protection, ``DeleteOnTermination``, attach times,
spot requests) and the calls, each journaled (SAFETY.md rule 19). The steps are
``deletion``'s; nothing here takes a fact from a listing (rule 21).

EC2 specifics:

- a read by id is ``Describe*`` with the kind's id parameter; several members of a kind
  are read with one filtered describe, and one the answer leaves out is asked again by id:
  its not-found code, or ``terminated``, is gone; an answer that leaves it out again is
  ``UNREAD`` (never taken for gone);
- protections (rule 14): the instance's controller tags as re-read, then its
  ``disableApiTermination`` attribute, which no describe shows; any value but ``False``
  protects. A role without ``ec2:DescribeInstanceAttribute`` falls back to
  ``TerminateInstances``' own refusal (``OperationNotPermitted``), except for a protection
  an earlier delete found: it stays one, never probed with a terminate call again;
- the blast (rule 15): the instance's ``DeleteOnTermination`` volumes and interfaces (a
  missing flag read as "deleted with it"); its own root volume is the one at
  ``RootDeviceName`` attached at launch, i.e. within ``AT_LAUNCH`` of its primary
  interface's attach time (the original launch: ``LaunchTime`` moves with every start), and
  its own primary interface is device 0 of card 0;
- a spot instance's ``persistent`` request would launch a replacement: it is what must go
  first (``replaced_by``: the deletion cancels it, confirmed final, or skips the group when
  it is not the group's: ``spot``);
- a dependent is never detached from a live instance: only an instance EC2 answers
  ``terminated`` (or the group's own primary found gone) is gone; ``InvalidInstanceID.NotFound``
  is not proof (an instance launched moments ago). A dependent held by the group's own
  owner, or by an instance not known gone, is "not yet"; one a live instance outside the
  group holds is ``in_use``;
- EC2's delete calls of dependents are synchronous: a call that answered has deleted
  (``InvalidSnapshot.InUse``: an AMI uses the snapshot, ``in_use``);
- a kind an instance names (``AwsKind.named_by``: its launch template, key pair, placement
  group) goes with the owner that names it as re-read; a kind without an id filter
  (``DescribeLaunchTemplates``, ``DescribePlacementGroups``) is read id by id;
- ``DeletePlacementGroup`` takes the group's name: the name comes from the read by id and is
  read once more right before the call, which is made only while it still names that id
  (``Replaced`` otherwise); the group waits while its own instance is in it and is ``in_use``
  while any other instance is (``DescribeInstances`` filtered on ``placement-group-name``);
- ELBv2 (``elb``, the region's other client): a load balancer or target group is read by ARN
  with its describe and ``DescribeTags`` (tags that cannot be read: ``UNREAD``); a load balancer
  is deleted only when deletion protection is off and every target group its listeners' rules
  forward to is a member of the group, as read now (``blast_foreign`` otherwise), its listeners
  journaled as its blast; a target group only when no load balancer or target outside the group
  uses it (``in_use``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from orphan_cleanup.core.errors import AccessDenied, ProviderError
from orphan_cleanup.core.journal import Journal
from orphan_cleanup.core.listing import ResourceKind, ResourceState
from orphan_cleanup.providers.aws.calls import Ec2Calls, Refused
from orphan_cleanup.providers.aws.kinds import (
    ADDRESS,
    BY_KIND,
    INSTANCE,
    LAUNCH_TEMPLATE,
    LOAD_BALANCER,
    NETWORK_INTERFACE,
    SPOT_REQUEST,
    TARGET_GROUP,
    VOLUME,
    AwsKind,
    as_utc,
    aware,
    dig,
    tags_of,
)
from orphan_cleanup.providers.aws.listing import controller_of
from orphan_cleanup.providers.aws.snapshots import AwsSnapshots
from orphan_cleanup.providers.aws.spot import is_final, must_cancel, request_of
from orphan_cleanup.providers.operations import (
    UNREAD,
    Blocked,
    DeleteRefused,
    Doomed,
    Live,
    Operations,
    Read,
    Readiness,
    Replaced,
    Target,
    attached_at_launch,
)

Item = Mapping[str, Any]
#: ``TerminateInstances`` refusing an instance with termination protection.
_TERMINATION_REFUSED = frozenset({"OperationNotPermitted"})
_ASSOCIATION_GONE = frozenset({"InvalidAssociationID.NotFound"})
_ATTACHMENT_GONE = frozenset({"InvalidAttachmentID.NotFound"})


class AwsOperations(Operations):
    """``deletion.Operations`` over one region's EC2 client."""

    kinds = BY_KIND

    def __init__(self, calls: Ec2Calls, *, controller_keys: Iterable[str] = (), elb: Ec2Calls | None = None,
                 autoscaling: Ec2Calls | None = None) -> None:
        self.calls = calls
        self.elb = elb  # the region's ELBv2 client (load balancers, target groups)
        self.autoscaling = autoscaling  # the region's Auto Scaling client (who launches from a template)
        self.region = calls.region
        self.controller_keys = tuple(controller_keys)
        self.snapshots = AwsSnapshots(calls)
        self._gone_instances: set[str] = set()  # instances EC2 answered terminated by id
        self._protection_unread: set[str] = set()  # owners whose disableApiTermination could not be read
        self._listeners: dict[str, tuple[str, ...]] = {}  # a load balancer's listeners, as ready() read them

    def _calls(self, spec: AwsKind) -> Ec2Calls:
        if spec.service == "ec2":
            return self.calls
        if self.elb is None:
            raise ProviderError(f"no {spec.service} client to read or delete a {spec.kind}", region=self.region)
        return self.elb

    # -- reads ---------------------------------------------------------------------------

    def read(self, targets: Sequence[Target]) -> dict[str, Read]:
        out: dict[str, Read] = {}
        for spec in {BY_KIND[t.kind]: None for t in targets}:
            ids = [t.id for t in targets if t.kind is spec.kind]
            found: dict[str, Item] = {}
            if len(targets) > 1 and spec.id_filter is not None:
                # one filtered describe per kind; what it leaves out is asked by id
                reply = self._calls(spec).call(spec.describe, frozenset(),
                                               Filters=[{"Name": spec.id_filter, "Values": ids}])
                try:
                    found = {spec.item_id(i): i for i in spec.items(reply or {}) if spec.item_id(i) in ids}
                except KeyError as exc:  # an item without its id: fail closed, never "gone"
                    raise ProviderError(f"{spec.describe} returned an item without {exc}", region=self.region) from exc
            for target in (t for t in targets if t.kind is spec.kind):
                item = found.get(target.id)
                out[target.id] = self._live(spec, target, item) if item is not None else self._read_one(spec, target)
        return out

    def _read_one(self, spec: AwsKind, target: Target) -> Read:
        params: dict[str, Any] = {spec.ids_param: [target.id]}
        reply = self._calls(spec).call(spec.describe, spec.not_found | {spec.malformed}, **params)
        if reply is None:  # not found, or an id of no such shape: nothing of that id
            # EC2 describes a terminated instance for an hour: not found for a listed one is not
            # proof that it is gone (eventual consistency), so it cannot be read this time.
            return UNREAD if spec is INSTANCE else None
        try:
            items = [i for i in spec.items(reply) if spec.item_id(i) == target.id]
        except KeyError as exc:  # an item without its id: fail closed, never "gone"
            raise ProviderError(f"{spec.describe} returned an item without {exc}", region=self.region) from exc
        if len(items) > 1:
            raise ProviderError(f"{spec.describe} returned {target.id} twice", region=self.region)
        if items and spec.tags_by_arn:  # ELBv2: the tags are another call's, by ARN
            tagged = self._calls(spec).call("describe_tags", spec.not_found, ResourceArns=[target.id])
            found = [d for d in (tagged or {}).get("TagDescriptions") or [] if d.get("ResourceArn") == target.id]
            if len(found) != 1:
                return UNREAD  # tags that cannot be read may hold a protect tag
            items = [{**items[0], spec.tags_field: list(found[0].get("Tags") or [])}]
        return self._live(spec, target, items[0]) if items else UNREAD

    def _live(self, spec: AwsKind, target: Target, item: Item) -> Live | None:
        state = spec.state(item)
        if state is ResourceState.TERMINATED:
            if spec is INSTANCE:
                self._gone_instances.add(target.id)
            return None
        return Live(target, tags_of(item, spec), state, item, spec.raw_state(item))
        return None

    def _holder(self, instance_id: str | None, owner_id: str | None, *, terminating: bool = False) -> Readiness:
        """What an instance holding a dependent means, as EC2 answers now (a read only, SAFETY.md
        rule 3): none, or one EC2 answers ``terminated`` (or the group's primary found gone):
        ready, it may be detached; the group's own owner still there: not yet; a live instance
        outside the group: in use; one EC2 does not answer for (``InvalidInstanceID.NotFound``
        is not proof: an instance launched moments ago): not yet. ``terminating``: one EC2 answers
        ``shutting-down`` is ready too (a load balancer's target on its way out)."""
        if not instance_id or instance_id in self._gone_instances:
            return Readiness.READY
        if instance_id == owner_id:
            return Readiness.NOT_YET
        params: dict[str, Any] = {INSTANCE.ids_param: [instance_id]}
        reply = self.calls.call(INSTANCE.describe, INSTANCE.not_found, **params)
        items = [i for i in INSTANCE.items(reply or {}) if INSTANCE.item_id(i) == instance_id]
        if len(items) != 1:
            return Readiness.NOT_YET
        state = INSTANCE.raw_state(items[0])
        if state == "terminated":
            self._gone_instances.add(instance_id)
            return Readiness.READY
        return Readiness.READY if terminating and state == "shutting-down" else Readiness.IN_USE

    # -- the owner -----------------------------------------------------------------------

    def protection(self, owner: Live, remembered: str | None) -> tuple[str, str] | None:
        pid = owner.id
        controller = controller_of(owner.tags, self.controller_keys)
        if controller is not None:
            return "managed_by_controller", f"{pid} is managed by {controller}"
        try:
            reply = self.calls.call("describe_instance_attribute", INSTANCE.not_found, InstanceId=pid,
                                    Attribute="disableApiTermination")
        except AccessDenied:
            if remembered is not None:
                return remembered, f"{pid}: {remembered} found by an earlier delete; the attribute" \
                    " cannot be read (ec2:DescribeInstanceAttribute denied) to see it lifted"
            self._protection_unread.add(pid)  # TerminateInstances' own refusal is the fallback
            return None
        if reply is None:
            return None  # gone since the re-read: the terminate finds it gone too
        if dig(reply, ("DisableApiTermination", "Value")) is not False:
            return "termination_protection", f"{pid} has disableApiTermination" \
                f" {dig(reply, ('DisableApiTermination', 'Value'))!r}"
        return None

    def uses(self, owner: Live, members: Sequence[Live]) -> set[str]:
        """Its block device mappings' volumes, its interfaces, its and their security groups,
        its spot request, the addresses associated with it or its interfaces, and what it names
        (``AwsKind.named_by``: the launch template it was launched from, its key pair, its
        placement group)."""
        instance = owner.item
        enis = [n for n in instance.get("NetworkInterfaces") or [] if isinstance(n, Mapping)]
        used = {dig(b, ("Ebs", "VolumeId")) for b in instance.get("BlockDeviceMappings") or []}
        used |= {n.get("NetworkInterfaceId") for n in enis}
        used |= {g.get("GroupId") for g in instance.get("SecurityGroups") or [] if isinstance(g, Mapping)}
        used |= {g.get("GroupId") for n in enis for g in n.get("Groups") or [] if isinstance(g, Mapping)}
        used.add(instance.get("SpotInstanceRequestId"))
        eni_ids = {n.get("NetworkInterfaceId") for n in enis}
        used |= {m.id for m in members if m.target.kind is ResourceKind.ADDRESS
                 and (m.item.get("InstanceId") == owner.id
                      or (m.item.get("NetworkInterfaceId") and m.item.get("NetworkInterfaceId") in eni_ids))}
        for member in members:  # its launch template, key pair, placement group: as both reads name them
            named_by = BY_KIND[member.target.kind].named_by
            if named_by is not None and (value := named_by.instance_value(instance)) is not None \
                    and named_by.item_value(member.item) == value:
                used.add(member.id)
        return {str(i) for i in used if i}

    def blast(self, owner: Live, members: Mapping[str, Live]) -> list[Doomed]:
        instance = owner.item
        launched = self._launch(instance)
        root = instance.get("RootDeviceName") or None
        doomed: dict[AwsKind, dict[str, bool]] = {  # id -> whether it is the instance's own device
            VOLUME: {str(dig(b, ("Ebs", "VolumeId"))): root is not None and b.get("DeviceName") == root
                     and attached_at_launch(aware(dig(b, ("Ebs", "AttachTime"))), launched)
                     for b in instance.get("BlockDeviceMappings") or []
                     if dig(b, ("Ebs", "DeleteOnTermination")) is not False and dig(b, ("Ebs", "VolumeId"))},
            NETWORK_INTERFACE: {str(n.get("NetworkInterfaceId")): dig(n, ("Attachment", "DeviceIndex")) == 0
                                and dig(n, ("Attachment", "NetworkCardIndex")) in (None, 0)
                                for n in instance.get("NetworkInterfaces") or []
                                if dig(n, ("Attachment", "DeleteOnTermination")) is not False
                                and n.get("NetworkInterfaceId")},
        }
        out: list[Doomed] = []
        for spec, own in doomed.items():
            targets = [Target(spec.kind, rid, self.region) for rid in sorted(own) if rid not in members]
            read = self.read(targets) if targets else {}
            for rid in sorted(own):  # named by the instance but not read (not found is not proof): it blocks
                live = members.get(rid) or read.get(rid)
                out.append(Doomed(spec.kind, rid, live if isinstance(live, Live) else None, own[rid]))
        return out

    @staticmethod
    def _launch(instance: Item) -> datetime | None:
        """When the instance was first launched: its primary interface's attach time (it is
        attached at launch and never detached), else ``LaunchTime`` (which moves with every
        start: a restarted instance's own root then fails closed)."""
        for eni in instance.get("NetworkInterfaces") or []:
            if isinstance(eni, Mapping) and dig(eni, ("Attachment", "DeviceIndex")) == 0 \
                    and dig(eni, ("Attachment", "NetworkCardIndex")) in (None, 0):
                attached = aware(dig(eni, ("Attachment", "AttachTime")))
                if attached is not None:
                    return attached
        return aware(instance.get("LaunchTime"))

    def replaced_by(self, owner: Live) -> Live | None:
        """The owner's spot request when it is ``persistent`` (it would launch a replacement
        once the instance is terminated); ``ProviderError`` when it cannot be read as
        one-time, final or persistent (``spot``)."""
        request_id = request_of(owner.item, region=self.region)
        if request_id is None:
            return None
        request = self._read_request(request_id)
        if request is None or not must_cancel(request, region=self.region):
            return None
        if owner.id in self._protection_unread:  # never change anything before the protection is known
            raise Blocked(f"{owner.id}: cannot tell whether it is termination-protected (ec2:DescribeInstanceAttribute"
                          " denied): its persistent spot request is not cancelled", reason="protection_unreadable",
                          region=self.region)
        target = Target(ResourceKind.SPOT_REQUEST, request_id, self.region)
        return Live(target, tags_of(request, SPOT_REQUEST), SPOT_REQUEST.state(request), request,
                    SPOT_REQUEST.raw_state(request))

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

    # -- calls ---------------------------------------------------------------------------

    def delete(self, live: Live, journal: Journal, blast: Sequence[str] = ()) -> Live | None:
        spec = BY_KIND[live.target.kind]
        addressed = self._still_names(spec, live) if spec.delete_field else live.id
        if spec is LOAD_BALANCER:  # its listeners (and their rules) go with it: journaled as its blast
            blast = (*blast, *self._listeners.get(live.id, ()))
        try:
            self._calls(spec).call(spec.delete, spec.not_found, target=live.id, blast=blast, journal=journal,
                                   refused=_TERMINATION_REFUSED if spec is INSTANCE else frozenset(),
                                   **spec.delete_params(addressed))
        except Refused as refused:
            raise DeleteRefused("termination_protection",
                                f"{live.id}: TerminateInstances answered {refused}") from refused
        if spec is SPOT_REQUEST:  # confirmed: the request is gone or final
            request = self._read_request(live.id, confirming=True)
            return None if is_final(request) or request is None else self._live(spec, live.target, request)
        if spec is not INSTANCE:
            return None  # EC2 deletes the others synchronously: the call answered, it is gone
        after = self.read([live.target])[live.id]  # seed 002: confirm, never assume
        if isinstance(after, Live) or after is None:
            return after
        raise ProviderError(f"instance {live.id} cannot be read after terminate_instances", region=self.region)

    def _still_names(self, spec: AwsKind, live: Live) -> str:
        """The name the delete call takes (``delete_field``), from ``live`` (the read by id just
        before), read once more by that name right before the call: it must name the same id
        (SAFETY.md rule 3: a name can be reused), or nothing is deleted (``Replaced``)."""
        name = spec.delete_value(live.item)
        if name is None or spec.names_param is None:
            raise Blocked(f"{spec.kind} {live.id}: its read names no {spec.delete_field}", reason="unreadable",
                          region=self.region)
        params: dict[str, Any] = {spec.names_param: [name]}
        reply = self._calls(spec).call(spec.describe, spec.not_found, **params)
        named = [spec.item_id(i) for i in spec.items(reply or {}) if spec.delete_value(i) == name]
        if named != [live.id]:
            raise Replaced(f"{spec.kind} {live.id}: {spec.delete_field} {name!r} now names {named or 'nothing'}",
                           region=self.region)
        return name

    def created_at(self, live: Live) -> datetime | None:
        return as_utc(dig(live.item, BY_KIND[live.target.kind].created_path))  # as the listing reads it

    def ready(self, live: Live, owner_id: str | None, ours: Callable[[Live], bool], journal: Journal) -> Readiness:
        spec, item = BY_KIND[live.target.kind], live.item
        if spec is VOLUME:  # never detached: AWS detaches it when its instance is gone
            if VOLUME.raw_state(item) == "available":
                return Readiness.READY
            holder = self._holder(dig(item, VOLUME.attached_path), owner_id)
            return Readiness.NOT_YET if holder is Readiness.READY else holder
        if spec is NETWORK_INTERFACE:
            return self._detach_interface(item, owner_id, journal)
        if spec is ADDRESS:
            return self._disassociate_address(item, owner_id, ours, journal)
        if spec is SPOT_REQUEST:  # never cancel the request of a live instance outside the group
            return self._holder(item.get("InstanceId") or None, owner_id)
        if spec.instances_filter is not None:
            readiness = self._instances_inside(spec, live, owner_id)
            if spec is LAUNCH_TEMPLATE and readiness is not Readiness.IN_USE and self._scaling_groups_use(live):
                return Readiness.IN_USE
            return readiness
        if spec is LOAD_BALANCER:
            return self._balancer_targets(self._listeners_stay_in_the_group(live, ours))
        if spec is TARGET_GROUP:
            readiness = self._target_group_users(live, owner_id, ours)
            if readiness is not Readiness.IN_USE and self._scaling_groups_use(live):
                return Readiness.IN_USE
            return readiness
        return Readiness.READY

    def _scaling_groups_use(self, live: Live) -> bool:
        """Whether an Auto Scaling group of the region launches from this launch template (by id
        or name, also in a mixed instances policy and its overrides) or registers its instances in
        this target group, as read now: such a group is outside any group of ours (no listing
        lists it), so the resource is in use even with no instance running (SAFETY.md rules 14
        and 21). Every group of the region is read (``DescribeAutoScalingGroups`` has no filter
        on these), 100 a page; a reply that cannot be read fails the group (nothing deleted)."""
        if self.autoscaling is None:
            raise ProviderError(f"no autoscaling client to tell who uses {live.id}", region=self.region)
        template_id, template_name = live.item.get("LaunchTemplateId"), live.item.get("LaunchTemplateName")
        params: dict[str, Any] = {"MaxRecords": 100}
        while True:
            page = self.autoscaling.call("describe_auto_scaling_groups", frozenset(), **params) or {}
            for group in page.get("AutoScalingGroups") or []:
                if live.target.kind is ResourceKind.TARGET_GROUP:
                    if live.id in (group.get("TargetGroupARNs") or []):
                        return True
                    continue
                mixed = dig(group, ("MixedInstancesPolicy", "LaunchTemplate")) or {}
                specs = [group.get("LaunchTemplate") or {}, mixed.get("LaunchTemplateSpecification") or {},
                         *(o.get("LaunchTemplateSpecification") or {} for o in mixed.get("Overrides") or [])]
                if any(s.get("LaunchTemplateId") == template_id and template_id
                       or s.get("LaunchTemplateName") == template_name and template_name for s in specs):
                    return True
            if not page.get("NextToken"):
                return False
            params["NextToken"] = page["NextToken"]

    def _listeners_stay_in_the_group(self, balancer: Live, ours: Callable[[Live], bool]) -> list[str]:
        """Deleting a load balancer deletes its listeners and their rules (SAFETY.md rule 15):
        every target group they forward to must be a member of the group, as read now
        (``ours``), or one that is gone; otherwise ``Blocked`` (``blast_foreign``), nothing called.
        A load balancer with deletion protection is left too (rule 14: ``deletion_protection``).
        Returns the target groups its listeners forward to that still exist."""
        elb, arn = self._calls(LOAD_BALANCER), balancer.id
        attributes = elb.call("describe_load_balancer_attributes", LOAD_BALANCER.not_found, LoadBalancerArn=arn)
        protection = {a.get("Key"): a.get("Value") for a in (attributes or {}).get("Attributes") or []}
        if attributes is not None and protection.get("deletion_protection.enabled", "false") != "false":
            raise Blocked(f"load balancer {arn} has deletion protection", reason="deletion_protection",
                          region=self.region)
        forwarded: set[str] = set()
        listeners = elb.call("describe_listeners", LOAD_BALANCER.not_found, LoadBalancerArn=arn, PageSize=400) or {}
        listener_arns = [str(item.get("ListenerArn") or "") for item in listeners.get("Listeners") or []]
        if listeners.get("NextMarker") or not all(listener_arns):  # what cannot be read may forward anywhere
            raise Blocked(f"load balancer {arn}: its listeners cannot all be read", reason="blast_unreadable",
                          region=self.region)
        for listener, listener_arn in zip(listeners.get("Listeners") or [], listener_arns, strict=True):
            rules = elb.call("describe_rules", frozenset({"ListenerNotFound"}), ListenerArn=listener_arn,
                             PageSize=400) or {}
            if rules.get("NextMarker"):
                raise Blocked(f"load balancer {arn}: more rules than one page on {listener_arn}",
                              reason="blast_unreadable", region=self.region)
            actions = [*(listener.get("DefaultActions") or []),
                       *(a for r in rules.get("Rules") or [] for a in r.get("Actions") or [])]
            forwarded |= {str(a["TargetGroupArn"]) for a in actions if a.get("TargetGroupArn")}
            forwarded |= {str(g["TargetGroupArn"]) for a in actions
                          for g in dig(a, ("ForwardConfig", "TargetGroups")) or [] if g.get("TargetGroupArn")}
        self._listeners[arn] = tuple(listener_arns)
        groups = [Target(ResourceKind.TARGET_GROUP, g, self.region) for g in sorted(forwarded)]
        read = self.read(groups) if groups else {}
        outside = [g for g, live in read.items() if isinstance(live, Live) and not ours(live)
                   or live is UNREAD]
        if outside:
            raise Blocked(f"load balancer {arn}: its listeners forward to {', '.join(outside)}, outside the group",
                          reason="blast_foreign", region=self.region)
        return [g for g, live in read.items() if isinstance(live, Live)]

    def _balancer_targets(self, groups: Sequence[str]) -> Readiness:
        """A load balancer goes only once every target it serves is gone or terminating, as read
        now: a gateway's VM first, whatever group the listing put it in (SAFETY.md rule 15). An
        instance target still running (another ref's, someone's, or the ref's own VM, which no
        listing ties to the load balancer) or a target that is no instance (an IP, a Lambda):
        ``in_use``; an instance EC2 does not answer for: not yet."""
        readiness = Readiness.READY
        for arn in groups:
            health = self._calls(TARGET_GROUP).call("describe_target_health", TARGET_GROUP.not_found,
                                                    TargetGroupArn=arn)
            for described in (health or {}).get("TargetHealthDescriptions") or []:
                target_id = str(dig(described, ("Target", "Id")) or "")
                holder = self._holder(target_id, None, terminating=True) if target_id.startswith("i-") \
                    else Readiness.IN_USE
                if holder is Readiness.IN_USE:
                    return holder
                if holder is Readiness.NOT_YET:
                    readiness = holder
        return readiness

    def _target_group_users(self, group: Live, owner_id: str | None, ours: Callable[[Live], bool]) -> Readiness:
        """A target group, as read now: a load balancer that still uses it, or a registered target,
        is the group's own instance or load balancer (not yet: they go first) or anything else
        (``in_use``: a target outside the group, an IP, another load balancer); ready once nothing
        but terminated instances is registered (SAFETY.md rule 15)."""
        balancers = [Target(ResourceKind.LOAD_BALANCER, str(a), self.region)
                     for a in group.item.get("LoadBalancerArns") or []]
        if balancers:
            read = self.read(balancers)
            if any(isinstance(b, Live) and not ours(b) or b is UNREAD for b in read.values()):
                return Readiness.IN_USE
            if any(isinstance(b, Live) for b in read.values()):
                return Readiness.NOT_YET
        health = self._calls(TARGET_GROUP).call("describe_target_health", TARGET_GROUP.not_found,
                                                TargetGroupArn=group.id)
        readiness = Readiness.READY
        for described in (health or {}).get("TargetHealthDescriptions") or []:
            target_id = str(dig(described, ("Target", "Id")) or "")
            holder = self._holder(target_id, owner_id) if target_id.startswith("i-") else Readiness.IN_USE
            if holder is Readiness.IN_USE:
                return holder
            if holder is Readiness.NOT_YET:
                readiness = holder
        return readiness

    def _instances_inside(self, spec: AwsKind, live: Live, owner_id: str | None) -> Readiness:
        """A placement group, key pair or launch template, as read now, that no instance uses but
        terminated ones: ready; the group's own owner still using it: not yet; any other instance
        (another ref's, someone's, a second VM of this ref, whatever group a listing message put
        the resource in): ``in_use`` (SAFETY.md rules 15 and 21). A reply that cannot tell: not yet."""
        name = spec.named_by.item_value(live.item) if spec.named_by is not None else spec.delete_value(live.item)
        if name is None:
            return Readiness.NOT_YET
        states = [s for s, v in INSTANCE.states.items() if v is not ResourceState.TERMINATED]
        reply = self.calls.call(INSTANCE.describe, frozenset(), Filters=[
            {"Name": spec.instances_filter, "Values": [name]}, {"Name": "instance-state-name", "Values": states}])
        inside = {INSTANCE.item_id(i) for i in INSTANCE.items(reply or {})} - self._gone_instances
        if inside - {owner_id}:
            return Readiness.IN_USE
        if inside or (reply or {}).get("NextToken"):
            return Readiness.NOT_YET
        return Readiness.READY

    def _detach_interface(self, eni: Item, owner_id: str | None, journal: Journal) -> Readiness:
        attachment = eni.get("Attachment") or {}
        if not attachment or attachment.get("Status") == "detached":
            return Readiness.READY
        instance_id = attachment.get("InstanceId")
        holder = self._holder(str(instance_id), owner_id) if instance_id else Readiness.NOT_YET
        if holder is not Readiness.READY:
            return holder
        self.calls.call("detach_network_interface", _ATTACHMENT_GONE, target=NETWORK_INTERFACE.item_id(eni),
                        journal=journal, AttachmentId=attachment["AttachmentId"])
        return Readiness.READY

    def _disassociate_address(self, address: Item, owner_id: str | None, ours: Callable[[Live], bool],
                              journal: Journal) -> Readiness:
        """Break an association only from what is gone: an instance EC2 answers terminated,
        or an interface of the group, as read now (its ref, no protect tag: ``ours``), whose
        own instance is gone (or that has none). Any other interface (a NAT gateway's, a load
        balancer's, another ref's, a protected one) holds it."""
        association = address.get("AssociationId")
        if not association:
            return Readiness.READY
        instance_id = address.get("InstanceId") or None
        eni_id = address.get("NetworkInterfaceId") or None
        if instance_id is not None:
            holder = self._holder(str(instance_id), owner_id)
            if holder is not Readiness.READY:
                return holder
        elif eni_id is not None:
            eni = self.read([Target(ResourceKind.NETWORK_INTERFACE, str(eni_id), self.region)])[str(eni_id)]
            if not isinstance(eni, Live):  # not found is not proof that it is gone
                return Readiness.NOT_YET
            if not ours(eni):
                return Readiness.IN_USE
            holder = self._holder(dig(eni.item, ("Attachment", "InstanceId")), owner_id)
            if holder is not Readiness.READY:
                return holder
        else:
            return Readiness.NOT_YET  # associated with nothing it names: cannot be told
        self.calls.call("disassociate_address", _ASSOCIATION_GONE, target=ADDRESS.item_id(address), journal=journal,
                        AssociationId=association)
        return Readiness.READY
