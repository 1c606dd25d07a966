"""Pure rules about a listing as a whole (no I/O): when a region's answer is too
unlike its last clean listing to be believed (SAFETY.md rule 1: an unexpected shape
means skip and stay unsettled, never orphan), and what a group too large for one
message is reduced to (rule 20), and which instances a listing shows (rule 17)."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from orphan_cleanup.core.backends import DEFAULT_TAG_KEY
from orphan_cleanup.core.listing import ResourceGroup, ResourceKind, ResourceState


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


class ListedInstances:
    """The instances a listing shows, per ref: the primaries of its valid groups (an
    instance carrying the group's ref, not terminated). What makes a live owner's other
    VM a retry leak is its recorded primary listed beside it (SAFETY.md rule 17).
    Indexed on first use: most batches never ask."""

    def __init__(self, groups: Iterable[ResourceGroup] = (), tag_key: str = DEFAULT_TAG_KEY,
                 known: Iterable[tuple[str, str, str]] = ()) -> None:
        self._groups, self._tag_key = groups, tag_key
        self._index: set[tuple[str, str, str]] | None = None
        self._known = set(known)

    def has(self, ref: str, region: str, primary_id: str) -> bool:
        """Whether ``primary_id`` is listed as a valid instance of ``ref`` in ``region``."""
        if self._index is None:
            self._index = self._known | {
                (g.provider_ref, g.region, g.primary_id) for g in self._groups
                if g.primary_id is not None and not g.malformed_ref and (p := g.primary) is not None
                and p.kind is ResourceKind.INSTANCE and p.tags.get(self._tag_key) == g.provider_ref
                and p.state is not ResourceState.TERMINATED}
        return (ref, region, primary_id) in self._index
