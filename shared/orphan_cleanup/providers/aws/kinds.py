"""The EC2 and ELBv2 resource kinds the AWS adapter handles: one declarative row each.

A row says how to list the kind (describe call, where the items sit in the
reply, which filters narrow it), how to read one item (id, created-at, state
and its literal mapping, tags, attachment) and how to delete it (call, id
parameter, the kinds that must be gone first, the error codes that mean
"already gone"). The delete order is derived from ``depends_on``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from orphan_cleanup.core.listing import ResourceKind, ResourceState

Path = tuple[str | int, ...]


@dataclass(frozen=True, eq=False)  # rows compare by identity; mappings are unhashable
class AwsKind:
    kind: ResourceKind
    describe: str  # boto3 method; paginated when boto3 has a paginator for it
    items_path: tuple[str, ...]  # where the items sit in one page of the reply
    id_field: str
    ids_param: str  # the describe parameter that re-reads items by id
    # The describe filter on ids (tolerates ids that are gone); None when the describe has
    # none (``DescribeLaunchTemplates``): each id is then read with ``ids_param`` alone.
    id_filter: str | None
    created_path: Path | None  # None: the API does not say when it was created
    state_path: Path | None  # None: the kind has no state of its own
    states: Mapping[str, ResourceState]  # raw state -> ours; unknown -> ACTIVE
    delete: str
    delete_param: str
    not_found: frozenset[str]
    malformed: str  # the error code of an id of the wrong shape: nothing of that id exists
    depends_on: tuple[ResourceKind, ...] = ()
    tags_field: str = "Tags"
    attached_path: Path | None = None  # the instance id it is attached to
    list_filters: tuple[Mapping[str, Any], ...] = field(default=())
    list_params: Mapping[str, Any] = field(default_factory=dict)  # more describe parameters
    # ``MaxResults`` of each listing page: the API's documented maximum (calls at
    # the floor: docs/PERFORMANCE.md); ``None`` for a describe without paging (``DescribeAddresses``).
    page_size: int | None = None
    delete_as_list: bool = False  # terminate_instances takes a list of ids
    # The item field the delete call takes when it is not the id (``DeletePlacementGroup``
    # takes ``GroupName``), and the describe parameter that reads by that field: right before
    # the call the operations read by it and delete only while it still names the same id
    # (SAFETY.md rule 3: a name can be reused).
    delete_field: str | None = None
    names_param: str | None = None
    # How an instance names a resource of this kind it uses (``NamedBy``): what links it to
    # the instance's group in a listing and what the deleter's re-read of the owner shows used.
    named_by: NamedBy | None = None
    # The ``DescribeInstances`` filter that finds the instances using a resource of this kind by
    # ``named_by``'s value (``placement-group-name``, ``key-name``, the launch template's id tag):
    # it is never deleted while an instance outside the group uses it, whatever group a listing
    # message put it in (SAFETY.md rules 15 and 21).
    instances_filter: str | None = None
    # The boto3 service of the calls (``ec2``, ``elbv2``). An ELBv2 describe has no tag filter and
    # its items carry no tags: they are read with ``DescribeTags``, 20 ARNs a call (``tags_by_arn``).
    service: str = "ec2"
    tags_by_arn: bool = False

    def items(self, page: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
        """The items of one describe page (reservations are flattened)."""
        level: list[Any] = [page]
        for key in self.items_path:
            level = [child for node in level for child in (node.get(key) or [])]
        yield from level

    def item_id(self, item: Mapping[str, Any]) -> str:
        return str(item[self.id_field])

    def raw_state(self, item: Mapping[str, Any]) -> str | None:
        if self.kind is ResourceKind.ADDRESS:
            return "associated" if item.get("AssociationId") else "unassociated"
        value = dig(item, self.state_path)
        return None if value is None else str(value)

    def state(self, item: Mapping[str, Any]) -> ResourceState:
        raw = self.raw_state(item)
        # An unknown or missing state is read as "exists and may be in use".
        return self.states.get(raw or "", ResourceState.ACTIVE)

    def delete_params(self, resource_id: str) -> dict[str, Any]:
        return {self.delete_param: [resource_id] if self.delete_as_list else resource_id}

    def delete_value(self, item: Mapping[str, Any]) -> str | None:
        """What the delete call names, as ``item`` (a read by id) says: the id, or the
        ``delete_field`` (a name); None when the read does not say it."""
        value = item.get(self.delete_field or self.id_field)
        return str(value) if value else None


@dataclass(frozen=True)
class NamedBy:
    """An instance uses a resource of a kind when the value at ``instance_path`` in the
    instance's item (a first step ``tag:KEY`` reads that tag) equals the resource item's
    ``field``: a key pair's ``KeyName`` (an instance names its key pair by name), a placement
    group's ``GroupName``, a launch template's id in the ``aws:ec2launchtemplate:id`` tag EC2
    puts on an instance launched from it (an ``aws:`` tag no one else can write)."""

    instance_path: Path
    field: str

    def instance_value(self, instance: Mapping[str, Any]) -> str | None:
        first = self.instance_path[0]
        if isinstance(first, str) and first.startswith("tag:"):
            value = tags_of(instance, INSTANCE).get(first.removeprefix("tag:"))
        else:
            value = dig(instance, self.instance_path)
        return str(value) if value else None

    def item_value(self, item: Mapping[str, Any]) -> str | None:
        value = item.get(self.field)
        return str(value) if value else None


def dig(item: Mapping[str, Any], path: Path | None) -> Any:
    """Follow ``path`` (keys and list indexes) into a reply item; None if absent."""
    if path is None:
        return None
    node: Any = item
    for step in path:
        if isinstance(step, int):
            node = node[step] if isinstance(node, list) and len(node) > step else None
        else:
            node = node.get(step) if isinstance(node, Mapping) else None
        if node is None:
            return None
    return node


def tags_of(item: Mapping[str, Any], spec: AwsKind) -> dict[str, str]:
    return {str(t["Key"]): str(t.get("Value", "")) for t in item.get(spec.tags_field) or [] if "Key" in t}


def aware(value: Any) -> datetime | None:
    """A time a safety decision reads (an attach time, a snapshot's age): only an aware one
    counts, in UTC; anything else is unreadable (the decision fails closed)."""
    return value.astimezone(UTC) if isinstance(value, datetime) and value.tzinfo is not None else None


def as_utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_literal = MappingProxyType

INSTANCE_STATES = _literal({
    "pending": ResourceState.ACTIVE,
    "running": ResourceState.ACTIVE,
    "stopping": ResourceState.ACTIVE,
    "stopped": ResourceState.ACTIVE,
    "shutting-down": ResourceState.TERMINATING,
    "terminated": ResourceState.TERMINATED,
})
VOLUME_STATES = _literal({
    "creating": ResourceState.ACTIVE,
    "in-use": ResourceState.ACTIVE,
    "error": ResourceState.ACTIVE,
    "available": ResourceState.AVAILABLE,
    "deleting": ResourceState.TERMINATING,
    "deleted": ResourceState.TERMINATED,
})
ENI_STATES = _literal({
    "in-use": ResourceState.ACTIVE,
    "attaching": ResourceState.ACTIVE,
    "detaching": ResourceState.ACTIVE,
    "associated": ResourceState.ACTIVE,
    "available": ResourceState.AVAILABLE,
})
ADDRESS_STATES = _literal({
    "associated": ResourceState.ACTIVE,
    "unassociated": ResourceState.AVAILABLE,
})

INSTANCE = AwsKind(
    kind=ResourceKind.INSTANCE,
    describe="describe_instances",
    items_path=("Reservations", "Instances"),
    id_field="InstanceId",
    ids_param="InstanceIds",
    id_filter="instance-id",
    created_path=("LaunchTime",),
    state_path=("State", "Name"),
    states=INSTANCE_STATES,
    delete="terminate_instances",
    delete_param="InstanceIds",
    delete_as_list=True,
    not_found=frozenset({"InvalidInstanceID.NotFound"}),
    malformed="InvalidInstanceID.Malformed",
    list_filters=(
        {
            "Name": "instance-state-name",
            "Values": [s for s, v in INSTANCE_STATES.items() if v is not ResourceState.TERMINATED],
        },
    ),
    page_size=1000,  # DescribeInstances: 5-1000
)
ADDRESS = AwsKind(
    kind=ResourceKind.ADDRESS,
    describe="describe_addresses",
    items_path=("Addresses",),
    id_field="AllocationId",
    ids_param="AllocationIds",
    id_filter="allocation-id",
    created_path=None,
    state_path=None,
    states=ADDRESS_STATES,
    delete="release_address",
    delete_param="AllocationId",
    not_found=frozenset({"InvalidAllocationID.NotFound", "InvalidAddress.NotFound"}),
    malformed="InvalidAllocationID.Malformed",
    depends_on=(ResourceKind.INSTANCE,),
    attached_path=("InstanceId",),
    # EC2-Classic addresses have no allocation id (and no longer exist).
    list_filters=({"Name": "domain", "Values": ["vpc"]},),
)
NETWORK_INTERFACE = AwsKind(
    kind=ResourceKind.NETWORK_INTERFACE,
    describe="describe_network_interfaces",
    items_path=("NetworkInterfaces",),
    id_field="NetworkInterfaceId",
    ids_param="NetworkInterfaceIds",
    id_filter="network-interface-id",
    # ENIs carry no creation time; the attach time is never earlier than it.
    created_path=("Attachment", "AttachTime"),
    state_path=("Status",),
    states=ENI_STATES,
    delete="delete_network_interface",
    delete_param="NetworkInterfaceId",
    not_found=frozenset({"InvalidNetworkInterfaceID.NotFound"}),
    malformed="InvalidNetworkInterfaceID.Malformed",
    depends_on=(ResourceKind.INSTANCE, ResourceKind.ADDRESS),
    tags_field="TagSet",
    attached_path=("Attachment", "InstanceId"),
    page_size=1000,  # DescribeNetworkInterfaces: 5-1000 (botocore's model)
)
VOLUME = AwsKind(
    kind=ResourceKind.VOLUME,
    describe="describe_volumes",
    items_path=("Volumes",),
    id_field="VolumeId",
    ids_param="VolumeIds",
    id_filter="volume-id",
    created_path=("CreateTime",),
    state_path=("State",),
    states=VOLUME_STATES,
    delete="delete_volume",
    delete_param="VolumeId",
    not_found=frozenset({"InvalidVolume.NotFound"}),
    malformed="InvalidVolumeID.Malformed",
    depends_on=(ResourceKind.INSTANCE,),
    attached_path=("Attachments", 0, "InstanceId"),
    page_size=500,  # DescribeVolumes: 5-500 (a larger value is answered with 500)
)
SECURITY_GROUP = AwsKind(
    kind=ResourceKind.SECURITY_GROUP,
    describe="describe_security_groups",
    items_path=("SecurityGroups",),
    id_field="GroupId",
    ids_param="GroupIds",
    id_filter="group-id",
    created_path=None,
    state_path=None,
    states=_literal({}),
    delete="delete_security_group",
    delete_param="GroupId",
    not_found=frozenset({"InvalidGroup.NotFound", "InvalidGroupId.NotFound"}),
    malformed="InvalidGroupId.Malformed",
    depends_on=(ResourceKind.INSTANCE, ResourceKind.NETWORK_INTERFACE),
    page_size=1000,  # DescribeSecurityGroups: 5-1000 (botocore's model)
)

#: ``cancelled``/``closed`` are final (no instance is launched again); ``open`` waits for
#: capacity, ``active`` has its instance, ``disabled`` has it stopped; unknown -> ACTIVE.
SPOT_REQUEST_STATES = _literal({
    "open": ResourceState.AVAILABLE,
    "active": ResourceState.ACTIVE,
    "disabled": ResourceState.ACTIVE,
    "failed": ResourceState.AVAILABLE,
    "cancelled": ResourceState.TERMINATED,
    "closed": ResourceState.TERMINATED,
})
SPOT_REQUEST = AwsKind(
    kind=ResourceKind.SPOT_REQUEST,
    describe="describe_spot_instance_requests",
    items_path=("SpotInstanceRequests",),
    id_field="SpotInstanceRequestId",
    ids_param="SpotInstanceRequestIds",
    id_filter="spot-instance-request-id",
    created_path=("CreateTime",),
    state_path=("State",),
    states=SPOT_REQUEST_STATES,
    delete="cancel_spot_instance_requests",
    delete_param="SpotInstanceRequestIds",
    delete_as_list=True,
    not_found=frozenset({"InvalidSpotInstanceRequestID.NotFound"}),
    malformed="InvalidSpotInstanceRequestID.Malformed",
    # In the dependents' pass, after the (gone) instance like every kind; a request whose
    # instance is in the group is cancelled *before* it is terminated (the deletion's ``replaced_by``).
    depends_on=(ResourceKind.INSTANCE,),
    attached_path=("InstanceId",),
    page_size=1000,  # DescribeSpotInstanceRequests: 5-1000
)

#: ``error`` snapshots exist (and may be deleted); ``pending`` ones are still being taken.
SNAPSHOT_STATES = _literal({
    "pending": ResourceState.ACTIVE,
    "completed": ResourceState.AVAILABLE,
    "error": ResourceState.AVAILABLE,
    "recoverable": ResourceState.ACTIVE,
    "recovering": ResourceState.ACTIVE,
})
SNAPSHOT = AwsKind(
    kind=ResourceKind.SNAPSHOT,
    describe="describe_snapshots",
    items_path=("Snapshots",),
    id_field="SnapshotId",
    ids_param="SnapshotIds",
    id_filter="snapshot-id",
    created_path=("StartTime",),
    state_path=("State",),
    states=SNAPSHOT_STATES,
    delete="delete_snapshot",
    delete_param="SnapshotId",
    not_found=frozenset({"InvalidSnapshot.NotFound"}),
    malformed="InvalidSnapshotID.Malformed",
    # Never deleted while its volume, listed in the same group, is still there.
    depends_on=(ResourceKind.INSTANCE, ResourceKind.VOLUME),
    # Without it DescribeSnapshots also pages through every public snapshot.
    list_params=_literal({"OwnerIds": ["self"]}),
    page_size=1000,  # DescribeSnapshots: 5-1000
)

#: Deleting a launch template deletes its versions, which are part of it: nothing outside the
#: group goes with it (SAFETY.md rule 15); instances launched from it keep running.
LAUNCH_TEMPLATE = AwsKind(
    kind=ResourceKind.LAUNCH_TEMPLATE,
    describe="describe_launch_templates",
    items_path=("LaunchTemplates",),
    id_field="LaunchTemplateId",
    ids_param="LaunchTemplateIds",
    id_filter=None,  # DescribeLaunchTemplates filters on names, times and tags only
    created_path=("CreateTime",),
    state_path=None,
    states=_literal({}),
    delete="delete_launch_template",
    delete_param="LaunchTemplateId",
    not_found=frozenset({"InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateName.NotFoundException"}),
    malformed="InvalidLaunchTemplateId.Malformed",
    depends_on=(ResourceKind.INSTANCE,),
    named_by=NamedBy(("tag:aws:ec2launchtemplate:id",), "LaunchTemplateId"),
    instances_filter="tag:aws:ec2launchtemplate:id",
    page_size=200,  # DescribeLaunchTemplates: 1-200
)

#: Deleting a key pair deletes EC2's copy of its public key only: an instance launched with it
#: keeps the key it was given, so nothing outside the group goes with it (SAFETY.md rule 15).
#: An instance names its key pair by name (``KeyName``); the delete acts on the id.
KEY_PAIR = AwsKind(
    kind=ResourceKind.KEY_PAIR,
    describe="describe_key_pairs",
    items_path=("KeyPairs",),
    id_field="KeyPairId",
    ids_param="KeyPairIds",
    id_filter="key-pair-id",
    created_path=("CreateTime",),
    state_path=None,
    states=_literal({}),
    delete="delete_key_pair",
    delete_param="KeyPairId",
    not_found=frozenset({"InvalidKeyPair.NotFound"}),
    malformed="InvalidKeyPair.Malformed",
    depends_on=(ResourceKind.INSTANCE,),
    named_by=NamedBy(("KeyName",), "KeyName"),
    instances_filter="key-name",
    page_size=None,  # DescribeKeyPairs does not page: one call answers every key pair
)

#: ``deleting``/``deleted`` are on their way out; ``pending`` is being created.
PLACEMENT_GROUP_STATES = _literal({
    "pending": ResourceState.ACTIVE,
    "available": ResourceState.AVAILABLE,
    "deleting": ResourceState.TERMINATING,
    "deleted": ResourceState.TERMINATED,
})
#: Deleting a placement group deletes nothing else, and EC2 refuses it while an instance is in
#: it; the deleter does not ask while an instance outside the group is (``instances_filter``:
#: ``in_use``), and waits for the group's own instance to be gone (SAFETY.md rule 15).
#: ``DeletePlacementGroup`` takes the name: it is read by id, and right before the call the
#: name must still name that id (SAFETY.md rule 3).
PLACEMENT_GROUP = AwsKind(
    kind=ResourceKind.PLACEMENT_GROUP,
    describe="describe_placement_groups",
    items_path=("PlacementGroups",),
    id_field="GroupId",
    ids_param="GroupIds",
    id_filter=None,  # DescribePlacementGroups filters on names, ARNs, states and tags, not ids
    created_path=None,  # the API does not say when a placement group was created
    state_path=("State",),
    states=PLACEMENT_GROUP_STATES,
    delete="delete_placement_group",
    delete_param="GroupName",
    delete_field="GroupName",
    names_param="GroupNames",
    not_found=frozenset({"InvalidPlacementGroup.Unknown", "InvalidPlacementGroupId.NotFound"}),
    malformed="InvalidPlacementGroupId.Malformed",
    depends_on=(ResourceKind.INSTANCE,),
    named_by=NamedBy(("Placement", "GroupName"), "GroupName"),
    instances_filter="placement-group-name",
    page_size=None,  # DescribePlacementGroups does not page
)

#: ELBv2: ``provisioning``/``active``/``active_impaired`` exist and serve; ``failed`` exists.
LOAD_BALANCER_STATES = _literal({
    "provisioning": ResourceState.ACTIVE,
    "active": ResourceState.ACTIVE,
    "active_impaired": ResourceState.ACTIVE,
    "failed": ResourceState.AVAILABLE,
})
#: ELBv2 load balancers (ARN: immutable, the name is not). Deleting one deletes its listeners and
#: their rules: a listener forwarding to a target group outside the group blocks it
#: (``blast_foreign``, SAFETY.md rule 15); one with deletion protection is left
#: (``deletion_protection``, rule 14). Deleted after instances.
LOAD_BALANCER = AwsKind(
    kind=ResourceKind.LOAD_BALANCER,
    service="elbv2",
    describe="describe_load_balancers",
    items_path=("LoadBalancers",),
    id_field="LoadBalancerArn",
    ids_param="LoadBalancerArns",
    id_filter=None,
    created_path=("CreatedTime",),
    state_path=("State", "Code"),
    states=LOAD_BALANCER_STATES,
    delete="delete_load_balancer",
    delete_param="LoadBalancerArn",
    not_found=frozenset({"LoadBalancerNotFound"}),
    malformed="LoadBalancerNotFound",
    depends_on=(ResourceKind.INSTANCE,),
    tags_by_arn=True,
    page_size=400,  # DescribeLoadBalancers: PageSize 1-400
)
#: ELBv2 target groups. Deleting one deletes nothing else; it is never deleted while a target
#: outside the group is registered in it or a load balancer outside the group uses it
#: (``in_use``). Deleted after the group's instances and load balancers.
TARGET_GROUP = AwsKind(
    kind=ResourceKind.TARGET_GROUP,
    service="elbv2",
    describe="describe_target_groups",
    items_path=("TargetGroups",),
    id_field="TargetGroupArn",
    ids_param="TargetGroupArns",
    id_filter=None,
    created_path=None,  # DescribeTargetGroups does not say when it was created
    state_path=None,
    states=_literal({}),
    delete="delete_target_group",
    delete_param="TargetGroupArn",
    not_found=frozenset({"TargetGroupNotFound"}),
    malformed="TargetGroupNotFound",
    depends_on=(ResourceKind.INSTANCE, ResourceKind.LOAD_BALANCER),
    tags_by_arn=True,
    page_size=400,  # DescribeTargetGroups: PageSize 1-400
)

# Listing order: instances first, so the link pass can see who uses what. Snapshots are
# listed only with ``retain_snapshots_days`` set (``listed_kinds``). The deletion orders
# them by ``depends_on`` (``deletion.delete_order``).
KINDS: tuple[AwsKind, ...] = (INSTANCE, VOLUME, NETWORK_INTERFACE, SECURITY_GROUP, ADDRESS, SPOT_REQUEST,
                              LAUNCH_TEMPLATE, KEY_PAIR, PLACEMENT_GROUP, LOAD_BALANCER, TARGET_GROUP, SNAPSHOT)
BY_KIND: Mapping[ResourceKind, AwsKind] = _literal({k.kind: k for k in KINDS})


def listed_kinds(retain_days: int | None) -> tuple[AwsKind, ...]:
    """The kinds a listing describes: snapshots only when they can ever expire."""
    return tuple(k for k in KINDS if k is not SNAPSHOT or retain_days is not None)
