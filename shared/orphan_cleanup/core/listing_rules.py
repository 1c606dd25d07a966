"""Pure rules about a listing as a whole (no I/O): when a region's answer is too
unlike its last clean listing to be believed (SAFETY.md rule 1: an unexpected shape
means skip and stay unsettled, never orphan)."""

from __future__ import annotations


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
