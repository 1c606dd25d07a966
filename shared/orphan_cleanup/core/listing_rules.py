"""Pure rules about a listing as a whole (no I/O): when a region's answer is too
unlike its last clean listing to be believed (SAFETY.md rule 1: an unexpected shape
means skip and stay unsettled, never orphan), and what a group too large for one
message is reduced to (rule 20)."""

from __future__ import annotations

from collections.abc import Collection

from orphan_cleanup.core.listing import ResourceGroup


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


#: What a deleter reads back from a resource's details: the name and the location it
#: addresses a GCP resource by, and the source disk id of a snapshot.
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
