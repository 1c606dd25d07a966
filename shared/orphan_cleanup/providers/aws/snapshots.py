"""Keeping an orphan's data: with ``snapshot_before_delete`` a data
volume is snapshotted, and deleted only once that snapshot is ``completed``; with
``retain_snapshots_days`` the listing shows our snapshots once they are that old.

Which volumes: every volume the deleter deletes itself. A volume AWS deletes with its
instance (``DeleteOnTermination``) is gone, or ``deleting``, by the time its group's
dependents are tried, so the ones left are exactly those that would not have gone with
the instance (the flag false, or never attached).

Idempotent across cycles: the snapshot is found again by its tags (the ref and
``SNAPSHOT_SOURCE_KEY`` = the volume id) and its volume id, so a redelivery or the next
cycle waits for the same snapshot instead of taking another. ``pending`` is "not yet"
(the volume stays, the group is ``deleting``); ``error`` is ``ProviderError`` (the volume
stays, the group's delete fails) until an operator deletes that snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.providers.aws.kinds import KINDS, SNAPSHOT, AwsKind, dig, tags_of
from orphan_cleanup.providers.base import older_than_days

Item = Mapping[str, Any]
Call = Callable[..., Mapping[str, Any] | None]


def listed_kinds(retain_days: int | None) -> tuple[AwsKind, ...]:
    """The kinds a listing describes: snapshots only when they can ever expire."""
    return tuple(k for k in KINDS if k is not SNAPSHOT or retain_days is not None)


def taken_by_us(snapshot: Item, tag_key: str, ref: str | None = None) -> bool:
    """Whether the deleter took this snapshot itself (SAFETY.md rule 15): the ref (``ref``,
    else whatever ref tag it carries) and the source tag naming the very volume it was
    taken of. A backup that copied the volume's ref tag (AWS Backup, DLM) has no source
    tag; a copy of one of ours (``CopySnapshot`` with its tags) names another volume (a
    copy's ``VolumeId`` is a placeholder): never listed, never deleted."""
    tags = tags_of(snapshot, SNAPSHOT)
    volume = snapshot.get("VolumeId")
    if tag_key not in tags or (ref is not None and tags[tag_key] != ref):
        return False
    return isinstance(volume, str) and tags.get(SNAPSHOT_SOURCE_KEY) == volume


def expired(snapshot: Item, *, retain_days: int, now: datetime) -> bool:
    """Is this snapshot older than the retention? One without a readable ``StartTime``
    is kept (never listed, never deleted: fail closed). The function's clock is enough
    here: the retention is days, no margin of rule 13 is compared against it."""
    return older_than_days(dig(snapshot, SNAPSHOT.created_path), retain_days, now)


def snapshot_tags(tag_key: str, ref: str, volume_id: str) -> list[dict[str, str]]:
    return [{"Key": tag_key, "Value": ref}, {"Key": SNAPSHOT_SOURCE_KEY, "Value": volume_id}]


def state_of(snapshots: Iterable[Item], *, volume_id: str, region: str) -> tuple[str, str] | None:
    """``("completed" | "pending", snapshot id)`` of the volume's snapshots, the completed
    one first; None when there is none. An ``error`` snapshot with none completed, or an
    unknown state, is ``ProviderError``: the volume is never deleted on a guess."""
    by_state: dict[str, str] = {}
    for snap in snapshots:
        by_state.setdefault(str(snap.get("State")), str(snap.get("SnapshotId")))
    if "completed" in by_state:
        return "completed", by_state["completed"]
    if "pending" in by_state:
        return "pending", by_state["pending"]
    if by_state:
        state, sid = next(iter(by_state.items()))
        raise ProviderError(f"snapshot {sid} of volume {volume_id} is {state!r}, not completed: the volume is"
                            " kept (delete that snapshot to have another taken)", region=region)
    return None


class VolumeSnapshots:
    """The snapshot step of one group's deletion (``aws_delete.GroupDeletion``'s calls)."""

    def __init__(self, call: Call, *, tag_key: str, ref: str, region: str) -> None:
        self.call = call
        self.tag_key = tag_key
        self.ref = ref
        self.region = region
        self.completed: list[tuple[str, str]] = []
        self.pending: list[tuple[str, str]] = []

    def ready(self, volume_id: str) -> bool:
        """True once a completed snapshot of ``volume_id`` exists; takes one if none does.
        False while it is pending."""
        found = state_of(self._ours(volume_id), volume_id=volume_id, region=self.region)
        if found is None:
            reply = self.call("create_snapshot", frozenset(), target=volume_id, VolumeId=volume_id,
                              Description=f"orphan-cleanup: {volume_id} of {self.ref} before deleting it",
                              TagSpecifications=[{"ResourceType": "snapshot",
                                                  "Tags": snapshot_tags(self.tag_key, self.ref, volume_id)}])
            sid = (reply or {}).get("SnapshotId")
            if not isinstance(sid, str) or not sid:
                raise ProviderError(f"create_snapshot of {volume_id} returned no snapshot id", region=self.region)
            # Confirm by a re-read, never the create reply (seed 002).
            read = self.call(SNAPSHOT.describe, SNAPSHOT.not_found, SnapshotIds=[sid])
            found = state_of([s for s in SNAPSHOT.items(read or {}) if s.get("SnapshotId") == sid],
                             volume_id=volume_id, region=self.region) or ("pending", sid)
        state, sid = found
        (self.completed if state == "completed" else self.pending).append((volume_id, sid))
        return state == "completed"

    def _ours(self, volume_id: str) -> list[Item]:
        reply = self.call(SNAPSHOT.describe, frozenset(), OwnerIds=["self"], Filters=[
            {"Name": "volume-id", "Values": [volume_id]},
            {"Name": f"tag:{SNAPSHOT_SOURCE_KEY}", "Values": [volume_id]},
            {"Name": f"tag:{self.tag_key}", "Values": [self.ref]},
        ])
        # The filters are the server's; the tags are checked again here.
        return [s for s in SNAPSHOT.items(reply or {})
                if taken_by_us(s, self.tag_key, self.ref) and s.get("VolumeId") == volume_id]
