"""Pure rules about a listing as a whole (no I/O): when a region's answer is too
unlike its last clean listing to be believed (SAFETY.md rule 1: an unexpected shape
means skip and stay unsettled, never orphan), and what a group too large for one
message is reduced to (rule 20), which instances and volumes a listing shows (rule 17), and
how a volume owner's resources are grouped (README, C1)."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState


def region_anomaly(listed: int, clean: int | None, suspect: int | None, *, max_shrink: float,
                   min_groups: int) -> str | None:
    """Why a region's listing of ``listed`` groups is not believed, or None.

    Against the region's last clean listing (``clean`` groups, when it had at least
    ``min_groups``), a listing that lost more than ``max_shrink`` of them (an empty one
    included) is an anomaly, unless it agrees with the last suspect listing (``suspect``):
    two listings in a row that say the same are accepted."""
    if clean is None or clean < min_groups or listed >= clean * (1 - max_shrink):
        return None
    if suspect is not None and abs(listed - suspect) <= max(1, suspect // 10):
        return None
    return (f"anomaly: listed {listed} groups, the last clean listing had {clean}"
            f" (a shrink over {max_shrink:.0%}); the region counts as not listed until a listing agrees")


#: The details a reduced group keeps for the operator's views (a name, a place, links); the
#: deleter reads none of them (SAFETY.md rule 21: it acts on ids alone).
KEPT_DETAILS = ("name", "zone", "region", "global", "self_link", "source_disk_id")


def reduced(group: ResourceGroup, keep_tags: Collection[str]) -> ResourceGroup:
    """``group`` with only what classification and deletion read: the tags in
    ``keep_tags`` (the ref, protect and controller keys, the snapshot source key) and
    the details of ``KEPT_DETAILS``. For a group too large for one message: a group
    anyone can inflate by tagging resources must not hold a whole cycle (SAFETY.md rule 20)."""
    return group.model_copy(update={"resources": tuple(
        r.model_copy(update={"tags": {k: v for k, v in r.tags.items() if k in keep_tags},
                             "details": {k: v for k, v in r.details.items() if k in KEPT_DETAILS}})
        for r in group.resources)})


#: The kinds a volume owner's primary has (README, C1: a volume group's primary is the
#: volume): an AWS EBS volume, a GCP persistent disk.
VOLUME_KINDS = frozenset({ResourceKind.VOLUME, ResourceKind.DISK})


def volume_groups(group: ResourceGroup) -> tuple[ResourceGroup, ...]:
    """A volume owner's group as classification judges it. A listing groups a ref's
    resources that no instance of the ref holds into one primary-less group per region;
    for a ref a ``volumes`` row owns, each volume (or disk) in it is a provisioning attempt
    of its own, so each becomes its own group with the volume as its primary, judged and
    deleted alone: a lost attempt is never deleted together with the recorded volume beside
    it (SAFETY.md rule 17). The other members (a snapshot the deleter took) stay one
    primary-less group of the ref. Any other group (one with a primary, a malformed ref's,
    one without a volume) is itself."""
    if group.primary_id is not None or group.malformed_ref:
        return (group,)
    volumes = [r for r in group.resources if r.kind in VOLUME_KINDS]
    if not volumes:
        return (group,)
    rest = tuple(r for r in group.resources if r.kind not in VOLUME_KINDS)
    split = [group.model_copy(update={"primary_id": v.id, "resources": (v,)}) for v in volumes]
    return (*split, group.model_copy(update={"resources": rest})) if rest else tuple(split)


def attached_user(volume: Resource) -> str | None:
    """What holds a listed volume or disk, as the listing saw it: the instance it is attached
    to (AWS ``Attachments``, a GCP instance the listing knows), else a GCP disk's first
    ``users`` link, else ``an instance`` for an AWS volume ``in-use`` or a GCP disk in use
    without a readable attachment (fail closed); None when nothing holds it."""
    if volume.attached_to:
        return volume.attached_to
    users = volume.details.get("users")
    if isinstance(users, (list, tuple)) and users:
        return str(users[0]).rsplit("/", 1)[-1] or str(users[0])
    if volume.details.get("state") == "in-use" or (volume.kind is ResourceKind.DISK
                                                   and volume.state is ResourceState.ACTIVE):
        return "an instance"  # (a GCP disk is active only while it has users; a reduced group keeps no details)
    return None


class ListedInstances:
    """The instances a listing shows, per ref: the primaries of its valid groups (an
    instance carrying the group's ref, not terminated). What makes a live owner's other
    VM a retry leak is its recorded primary listed beside it (SAFETY.md rule 17). The same
    for a volume owner (``has_volume``): the volumes and disks the listing shows carrying
    the ref, in any group. Indexed on first use: most batches never ask. ``known``: what a
    cycle recorded as listed (the deleter's question), for either."""

    def __init__(self, groups: Iterable[ResourceGroup] = (), tag_key: str = DEFAULT_TAG_KEY,
                 known: Iterable[tuple[str, str, str]] = ()) -> None:
        self._groups, self._tag_key = groups, tag_key
        self._index: set[tuple[str, str, str]] | None = None
        self._volumes: set[tuple[str, str, str]] | None = None
        self._known = set(known)

    def has_volume(self, ref: str, region: str, volume_id: str) -> bool:
        """Whether ``volume_id`` is listed as a volume or disk of ``ref`` in ``region`` (not
        terminated, carrying the ref)."""
        if self._volumes is None:
            self._volumes = self._known | {
                (g.provider_ref, g.region, r.id) for g in self._groups if not g.malformed_ref
                for r in g.resources if r.kind in VOLUME_KINDS and r.tags.get(self._tag_key) == g.provider_ref
                and r.state is not ResourceState.TERMINATED}
        return (ref, region, volume_id) in self._volumes

    def has(self, ref: str, region: str, primary_id: str) -> bool:
        """Whether ``primary_id`` is listed as a valid instance of ``ref`` in ``region``."""
        if self._index is None:
            self._index = self._known | {
                (g.provider_ref, g.region, g.primary_id) for g in self._groups
                if g.primary_id is not None and not g.malformed_ref and (p := g.primary) is not None
                and p.kind is ResourceKind.INSTANCE and p.tags.get(self._tag_key) == g.provider_ref
                and p.state is not ResourceState.TERMINATED}
        return (ref, region, primary_id) in self._index
