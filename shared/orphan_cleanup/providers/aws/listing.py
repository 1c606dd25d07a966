"""Listing one region of an AWS backend: one describe call per kind (``kinds.KINDS``),
server-side filtered on ``tag-key = settings.tag_key`` (never an unfiltered describe: it
draws from EC2's smaller unfiltered bucket), paginated at each API's largest page, never
the Resource Groups Tagging API (it shows deleted resources for an hour); instances in
``terminated`` excluded by filter. ELBv2's describes have no tag filter and no tags: every
load balancer and target group is described (400 a page) and their tags are read with
``DescribeTags``, 20 ARNs a call, the API's maximum (``describe_tagged_by_arn``). Items
become ``Resource``s (``to_resource``, an instance's controller from its tags), then get
the attachments a single item cannot tell (``link_resources``), and are folded into groups
(``base.group_resources``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from orphan_cleanup.core.backends import DEFAULT_CONTROLLER_TAG_KEYS, BackendSettings
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.providers.aws.errors import translated
from orphan_cleanup.providers.aws.kinds import (
    INSTANCE,
    KINDS,
    SNAPSHOT,
    AwsKind,
    as_utc,
    dig,
    listed_kinds,
    tags_of,
)
from orphan_cleanup.providers.aws.snapshots import facts_of, name_for
from orphan_cleanup.providers.base import group_resources
from orphan_cleanup.providers.snapshots import listable

Describe = Callable[[Any, AwsKind], Iterable[Mapping[str, Any]]]

#: How a controller tag key is named in ``Resource.controller`` (``asg:NAME``); a
#: configured key not listed here is named by the key itself (``KEY:VALUE``).
CONTROLLER_LABELS = MappingProxyType({
    "aws:autoscaling:groupName": "asg",
    "eks:nodegroup-name": "eks-nodegroup",
    "aws:ec2:fleet-id": "ec2-fleet",
    "aws:ec2spot:fleet-request-id": "spot-fleet",
})


#: Size facts an item carries (informational: ``orphans`` shows them and prices them): an
#: instance's ``InstanceType``, a volume's ``Size`` (GiB) and ``VolumeType``; an address's
#: ``PublicIp`` is kept above. EC2's describe gives no GPU count.
SIZE_KEYS = ("InstanceType", "Size", "VolumeType")


def controller_of(tags: Mapping[str, str], controller_keys: Iterable[str]) -> str | None:
    """The controller an instance's tags name (SAFETY.md rule 14), or None. A key
    present with an empty value still names one (fail closed)."""
    for key in controller_keys:
        if key in tags:
            return f"{CONTROLLER_LABELS.get(key, key)}:{tags[key] or '?'}"
    return None


def to_resource(spec: AwsKind, item: Mapping[str, Any], region: str,
                controller_keys: Iterable[str] = DEFAULT_CONTROLLER_TAG_KEYS) -> Resource:
    """One describe item as a ``Resource`` (``attached_to`` as the item says; an
    instance's ``controller`` from its ``controller_keys`` tags)."""
    details: dict[str, Any] = {"state": spec.raw_state(item)}
    for key in ("AvailabilityZone", "VpcId", "PublicIp", "GroupName", "Type", "InstanceLifecycle",
                "SpotInstanceRequestId", "LaunchTemplateName", "KeyName", "Strategy", *SIZE_KEYS):
        if item.get(key):
            details[key] = item[key]
    attached = dig(item, spec.attached_path)
    tags = tags_of(item, spec)
    return Resource(
        kind=spec.kind,
        id=spec.item_id(item),
        region=region,
        state=spec.state(item),
        tags=tags,
        created_at=as_utc(dig(item, spec.created_path)),
        attached_to=str(attached) if attached else None,
        details=details,
        controller=controller_of(tags, controller_keys) if spec.kind is ResourceKind.INSTANCE else None,
    )


def link_resources(
    raw: Mapping[ResourceKind, list[Mapping[str, Any]]], resources: list[Resource], tag_key: str
) -> list[Resource]:
    """Fill the attachments a single item cannot tell.

    An address associated to an interface (not directly to an instance) is
    attached to that interface's instance, when the interface was listed.
    A security group is attached to an instance only when exactly one listed
    instance with the same ref uses it (directly or through a listed
    interface); a group shared by several instances stays in the primary-less
    group of its ref, so deleting one instance's group never targets it. A kind an
    instance names (``AwsKind.named_by``: its launch template, key pair, placement
    group) is attached the same way: to the one listed instance of its ref that names it.
    """
    eni_instance = {
        str(e["NetworkInterfaceId"]): str(i)
        for e in raw.get(ResourceKind.NETWORK_INTERFACE, [])
        if (i := dig(e, ("Attachment", "InstanceId")))
    }
    instance_ref: dict[str, str | None] = {}
    sg_users: dict[str, set[str]] = {}
    for inst in raw.get(ResourceKind.INSTANCE, []):
        iid = str(inst["InstanceId"])
        instance_ref[iid] = tags_of(inst, INSTANCE).get(tag_key)
        for g in inst.get("SecurityGroups") or []:
            sg_users.setdefault(str(g["GroupId"]), set()).add(iid)
    for eni in raw.get(ResourceKind.NETWORK_INTERFACE, []):
        user = eni_instance.get(str(eni["NetworkInterfaceId"]))
        if user is None:
            continue
        for g in eni.get("Groups") or []:
            sg_users.setdefault(str(g["GroupId"]), set()).add(user)
    addr_eni = {
        str(a["AllocationId"]): str(a.get("NetworkInterfaceId") or "")
        for a in raw.get(ResourceKind.ADDRESS, [])
        if a.get("AllocationId")
    }
    named_users: dict[tuple[ResourceKind, str], set[str]] = {}
    for spec in KINDS:
        named_by = spec.named_by
        if named_by is None or spec.kind not in raw:
            continue
        named = {spec.item_id(item): named_by.item_value(item) for item in raw[spec.kind]}
        for inst in raw.get(ResourceKind.INSTANCE, []):
            value = named_by.instance_value(inst)
            for rid in (r for r, v in named.items() if value is not None and v == value):
                named_users.setdefault((spec.kind, rid), set()).add(str(inst["InstanceId"]))
    linked: list[Resource] = []
    for res in resources:
        target = res.attached_to
        if res.kind is ResourceKind.ADDRESS and target is None:
            target = eni_instance.get(addr_eni.get(res.id, ""))
        elif res.kind is ResourceKind.SECURITY_GROUP or (res.kind, res.id) in named_users:
            ref = res.tags.get(tag_key)
            user_ids = sg_users.get(res.id, ()) if res.kind is ResourceKind.SECURITY_GROUP \
                else named_users[(res.kind, res.id)]
            users = [i for i in user_ids if instance_ref.get(i) == ref]
            target = users[0] if len(users) == 1 else None
        linked.append(res if target == res.attached_to else res.model_copy(update={"attached_to": target}))
    return linked


def list_region(ec2: Any, region: str, settings: BackendSettings,
                describe: Describe | None = None) -> list[ResourceGroup]:
    """The groups of one region (``ProviderError`` when it cannot be listed); ``describe``
    lists one kind's tagged items (default: ``describe_tagged``)."""
    raw: dict[ResourceKind, list[Mapping[str, Any]]] = {}
    retain_days = settings.retain_snapshots_days
    kinds = listed_kinds(retain_days)
    for spec in kinds:
        with translated(region, spec.describe):
            raw[spec.kind] = list(describe(ec2, spec) if describe else describe_tagged(ec2, spec, settings.tag_key))
    try:
        if retain_days is not None:  # a retained snapshot is not listed: no orphan, no unsettled cycle
            now = datetime.now(UTC)
            raw[SNAPSHOT.kind] = [s for s in raw[SNAPSHOT.kind] if listable(  # never a backup we did not take
                facts_of(s), tag_key=settings.tag_key, retain_days=retain_days, now=now, name_for=name_for)]
        keys = settings.controller_tag_keys
        resources = [to_resource(spec, item, region, keys) for spec in kinds for item in raw[spec.kind]]
        linked = link_resources(raw, resources, settings.tag_key)
    except (KeyError, TypeError, ValueError) as exc:
        # An unexpected reply shape fails the region (fail closed), it never drops items silently.
        raise ProviderError(f"unexpected describe reply in {region}: {exc!r}", region=region) from exc
    live = [r for r in linked if r.state is not ResourceState.TERMINATED]
    return group_resources(live, settings.tag_key)


def describe_tagged(ec2: Any, spec: AwsKind, tag_key: str) -> Iterator[Mapping[str, Any]]:
    """Every item of a kind carrying the ``tag_key`` tag, page by page."""
    filters = [{"Name": "tag-key", "Values": [tag_key]}, *spec.list_filters]
    if ec2.can_paginate(spec.describe):
        paging = {"PageSize": spec.page_size} if spec.page_size else {}
        pages = ec2.get_paginator(spec.describe).paginate(Filters=filters, PaginationConfig=paging,
                                                         **spec.list_params)
        for page in pages:
            yield from spec.items(page)
    else:
        yield from spec.items(getattr(ec2, spec.describe)(Filters=filters, **spec.list_params))


#: ``DescribeTags`` (ELBv2) takes at most 20 ARNs a call.
TAGS_PER_CALL = 20


def describe_tagged_by_arn(client: Any, spec: AwsKind, tag_key: str) -> Iterator[Mapping[str, Any]]:
    """Every item of an ELBv2 kind carrying the ``tag_key`` tag: all items, page by page,
    then their tags (``with_tags``), each kept item with its ``Tags``."""
    if client.can_paginate(spec.describe):
        pages = client.get_paginator(spec.describe).paginate(PaginationConfig={"PageSize": spec.page_size})
    else:
        pages = [getattr(client, spec.describe)()]
    items = [item for page in pages for item in spec.items(page)]
    for start in range(0, len(items), TAGS_PER_CALL):
        for item in with_tags(client, spec, items[start:start + TAGS_PER_CALL]):
            try:
                ours = tag_key in tags_of(item, spec)
            except (KeyError, TypeError, AttributeError) as exc:  # fail closed: the region fails
                raise ProviderError(f"describe_tags returned unexpected tags: {exc!r}") from exc
            if ours:
                yield item


def with_tags(client: Any, spec: AwsKind, items: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``items`` (at most 20) with their ``Tags`` as one ``DescribeTags`` answers them; an item the
    answer leaves out, or an item without its ARN, fails the call (``ProviderError``): what cannot
    be read may carry the ref (fail closed)."""
    try:
        arns = [spec.item_id(item) for item in items]
    except (KeyError, TypeError) as exc:
        raise ProviderError(f"{spec.describe} returned an item without {spec.id_field}") from exc
    if not arns:
        return []
    reply = client.describe_tags(ResourceArns=arns)
    try:
        tags = {str(d["ResourceArn"]): list(d.get("Tags") or []) for d in reply.get("TagDescriptions") or []}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ProviderError(f"describe_tags returned an unexpected reply: {exc!r}") from exc
    missing = [arn for arn in arns if arn not in tags]
    if missing:
        raise ProviderError(f"describe_tags did not answer for {', '.join(missing)}")
    return [{**item, spec.tags_field: tags[arn]} for item, arn in zip(items, arns, strict=True)]
