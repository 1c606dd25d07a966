"""EC2 snapshots for the one snapshot module (``providers.snapshots``): what a snapshot's
describe item says (``facts_of``), the deleter's snapshots of a volume (found by their
tags and volume id), and the one create call. EC2 names snapshots itself: the deleter
recognises its own by the ref tag and the source tag naming the volume (``VolumeId``; a
copy's ``VolumeId`` is a placeholder that names no volume of ours)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import Journal
from orphan_cleanup.providers.aws.calls import Ec2Calls
from orphan_cleanup.providers.aws.kinds import SNAPSHOT, aware, dig, tags_of
from orphan_cleanup.providers.snapshots import Progress, SnapshotFacts

#: ``State`` -> what it means for the volume it was taken of; any other state keeps the
#: volume and fails its group (``error``: an operator deletes that snapshot).
PROGRESS: Mapping[str, Progress] = {"completed": "ready", "pending": "pending"}


def facts_of(item: Mapping[str, Any]) -> SnapshotFacts:
    state = item.get("State")
    volume = item.get("VolumeId")
    return SnapshotFacts(id=str(item.get("SnapshotId") or ""), tags=tags_of(item, SNAPSHOT),
                         source_id=volume if isinstance(volume, str) and volume else None, name=None,
                         created_at=aware(dig(item, SNAPSHOT.created_path)),
                         progress=PROGRESS.get(state) if isinstance(state, str) else None,
                         state=str(state) if state is not None else None)


def name_for(ref: str, volume_id: str) -> None:
    """EC2 names snapshots itself."""
    return None


class AwsSnapshots:
    """``providers.snapshots.SnapshotOperations`` over one region's EC2 client."""

    def __init__(self, calls: Ec2Calls) -> None:
        self.calls = calls

    name_for = staticmethod(name_for)

    def facts(self, live: Any) -> SnapshotFacts:
        return facts_of(live.item)

    def of_volume(self, volume: Any, *, tag_key: str, ref: str) -> list[SnapshotFacts]:
        reply = self.calls.call(SNAPSHOT.describe, frozenset(), OwnerIds=["self"], Filters=[
            {"Name": "volume-id", "Values": [volume.id]},
            {"Name": f"tag:{SNAPSHOT_SOURCE_KEY}", "Values": [volume.id]},
            {"Name": f"tag:{tag_key}", "Values": [ref]},
        ])
        return [facts_of(s) for s in SNAPSHOT.items(reply or {})]

    def take(self, volume: Any, *, name: str | None, tags: Mapping[str, str], journal: Journal) -> str:
        ref = next(iter(tags.values()))
        reply = self.calls.call("create_snapshot", frozenset(), target=volume.id, journal=journal, VolumeId=volume.id,
                                Description=f"orphan-cleanup: {volume.id} of {ref} before deleting it",
                                TagSpecifications=[{"ResourceType": "snapshot",
                                                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
        sid = (reply or {}).get("SnapshotId")
        if not isinstance(sid, str) or not sid:
            raise ProviderError(f"create_snapshot of {volume.id} returned no snapshot id", region=self.calls.region)
        return sid
