"""Compute Engine snapshots for the one snapshot module (``providers.snapshots``): what a
snapshot says (``facts_of``), the deleter's snapshot of a disk (found by the name the deleter
gives it: ``oc-<ref>-<disk id>``, derived from ids only), and ``disks.createSnapshot``. The
deterministic name makes the step idempotent across cycles; a snapshot of that name that
is not ours (labels, source disk) keeps the disk and fails the group."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.errors import DependencyNotReady, ProviderError
from orphan_cleanup.core.journal import Journal
from orphan_cleanup.providers.gcp.calls import GcpCalls
from orphan_cleanup.providers.gcp.kinds import DISK, SNAPSHOT, SNAPSHOT_PROGRESS, parse_time
from orphan_cleanup.providers.snapshots import SnapshotFacts

#: A resource name (``[a-z]([-a-z0-9]*[a-z0-9])?``, at most 63) and a label value we
#: write (lowercase letters, digits, ``_`` and ``-``, at most 63).
RESOURCE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def snapshot_name(ref: str, disk_id: str) -> str:
    """``oc-<ref>-<disk id>``: 36 characters at most for a 20-digit uint64 id."""
    name = f"oc-{ref}-{disk_id}"
    if not RESOURCE_NAME.fullmatch(name):
        raise ProviderError(f"cannot name a snapshot of disk {disk_id!r} of {ref!r}: {name!r} is no resource name")
    return name


def snapshot_labels(tag_key: str, ref: str, disk_id: str) -> dict[str, str]:
    return checked_labels({tag_key: ref, SNAPSHOT_SOURCE_KEY: disk_id})


def checked_labels(labels: Mapping[str, str]) -> dict[str, str]:
    bad = [v for v in labels.values() if not LABEL_VALUE.fullmatch(v)]
    if bad:
        raise ProviderError(f"cannot label a snapshot with {bad!r}: not a GCP label value")
    return dict(labels)


def facts_of(item: Any) -> SnapshotFacts:
    status = getattr(item, "status", None)
    source = str(getattr(item, "source_disk_id", "") or "")
    return SnapshotFacts(id=str(getattr(item, "id", "") or ""), tags=dict(getattr(item, "labels", {}) or {}),
                         source_id=source or None, name=str(getattr(item, "name", "") or "") or None,
                         created_at=parse_time(getattr(item, "creation_timestamp", "") or ""),
                         progress=SNAPSHOT_PROGRESS.get(status) if isinstance(status, str) else None,
                         state=str(status) if status is not None else None)


class GcpSnapshots:
    """``providers.snapshots.SnapshotOperations`` over the project's Compute calls."""

    def __init__(self, calls: GcpCalls) -> None:
        self.calls = calls

    name_for = staticmethod(snapshot_name)

    def facts(self, live: Any) -> SnapshotFacts:
        return facts_of(live.item)

    def of_volume(self, volume: Any, *, tag_key: str, ref: str) -> list[SnapshotFacts]:
        snap = self.calls.get(SNAPSHOT, "global", snapshot_name(ref, volume.id))
        return [] if snap is None else [facts_of(snap)]

    def take(self, volume: Any, *, name: str | None, tags: Mapping[str, str], journal: Journal) -> str:
        if name is None:
            raise ProviderError(f"a snapshot of disk {volume.id} needs a name")
        if str(getattr(volume.item, "status", "")) != "READY":  # creating, restoring, failed: not yet
            raise DependencyNotReady(f"disk {volume.id} is {volume.item.status}, not READY: not snapshotted yet")
        labels = checked_labels(tags)
        disk_name = str(volume.item.name)  # the disk's name as read now by its id
        self.calls.create_snapshot(DISK, volume.target.location, disk_name, {
            "name": name, "labels": labels,
            "description": f"orphan-cleanup: disk {disk_name} ({volume.id}) before deleting it"},
            target=volume.id, journal=journal)
        return name
