"""Keeping an orphan's data on Compute Engine, as ``aws_snapshot`` does
on EC2: with ``snapshot_before_delete`` a disk the deleter deletes itself is snapshotted
first (``disks.createSnapshot``) and deleted only once that snapshot is ``READY``.

Which disks: every disk ``gcp_delete`` deletes itself. A disk attached with ``autoDelete``
goes with its instance, so by the time the group's dependents are tried it is gone; the
ones left are exactly those that would not have gone with the instance.

Idempotent across cycles: the snapshot's name is derived from the ref and the disk's
numeric id (``snapshot_name``), so a redelivery or the next cycle reads the same snapshot
instead of taking another. It must carry the ref label and ``SNAPSHOT_SOURCE_KEY`` = the
disk id and name that disk as its source, or it is not ours: the disk is kept and the
group fails. ``CREATING``/``UPLOADING`` is "not yet" (the disk stays, the group is
``deleting``); ``FAILED``, ``DELETING`` or an unknown status is ``ProviderError`` (the disk
stays, the group's delete fails) until an operator deletes that snapshot.
"""

from __future__ import annotations

import re
from typing import Any

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.providers.gcp.calls import GcpCalls
from orphan_cleanup.providers.gcp.kinds import DISK, SNAPSHOT, SNAPSHOT_PROGRESS

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
    labels = {tag_key: ref, SNAPSHOT_SOURCE_KEY: disk_id}
    bad = [v for v in labels.values() if not LABEL_VALUE.fullmatch(v)]
    if bad:
        raise ProviderError(f"cannot label a snapshot with {bad!r}: not a GCP label value")
    return labels


def taken_by_us(snapshot: Any, tag_key: str, ref: str | None = None) -> bool:
    """Whether the deleter took this snapshot itself (SAFETY.md rule 15): the ref label
    (``ref``, else whatever ref it carries), the source label naming the very disk it was
    taken of (``sourceDiskId``), and the name the deleter gives it. A snapshot someone
    else took that carries the ref (a scheduled snapshot policy copying the disk's
    labels, a copy) lacks one of them: never listed, never deleted."""
    labels = dict(getattr(snapshot, "labels", {}) or {})
    own = labels.get(tag_key)
    if not isinstance(own, str) or (ref is not None and own != ref):
        return False
    disk_id = str(getattr(snapshot, "source_disk_id", "") or "")
    if not disk_id or labels.get(SNAPSHOT_SOURCE_KEY) != disk_id:
        return False
    try:
        return str(getattr(snapshot, "name", "")) == snapshot_name(own, disk_id)
    except ProviderError:
        return False


class DiskSnapshots:
    """The snapshot step of one group's deletion (``gcp_delete.delete_group``'s calls)."""

    def __init__(self, calls: GcpCalls, *, tag_key: str, ref: str) -> None:
        self.calls = calls
        self.tag_key = tag_key
        self.ref = ref
        self.completed: list[tuple[str, str]] = []  # (disk id, snapshot name)
        self.pending: list[tuple[str, str]] = []

    def ready(self, disk: Any, zone: str, journal: Journal = NO_JOURNAL) -> bool:
        """True once a ``READY`` snapshot of the re-read ``disk`` exists; takes one if none
        does. False while it is being taken; ``ProviderError`` when it cannot be used."""
        disk_id, disk_name = str(disk.id), str(disk.name)
        name = snapshot_name(self.ref, disk_id)
        snap = self.calls.get(SNAPSHOT, "global", name)
        if snap is None:
            labels = snapshot_labels(self.tag_key, self.ref, disk_id)
            self.calls.create_snapshot(DISK, zone, disk_name, {
                "name": name, "labels": labels,
                "description": f"orphan-cleanup: disk {disk_name} ({disk_id}) of {self.ref} before deleting it"},
                target=disk_id, journal=journal)
            # Confirm by a re-read, never the operation (seed 002).
            snap = self.calls.get(SNAPSHOT, "global", name)
            if snap is None:
                self.pending.append((disk_id, name))
                return False
        self._check_ours(snap, name, disk_id, zone)
        progress = SNAPSHOT_PROGRESS.get(snap.status) if isinstance(snap.status, str) else None
        if progress is None:
            raise ProviderError(f"snapshot {name} of disk {disk_id} is {snap.status!r}, not READY: the disk is"
                                " kept (delete that snapshot to have another taken)", region=zone)
        (self.completed if progress == "ready" else self.pending).append((disk_id, name))
        return progress == "ready"

    def _check_ours(self, snap: Any, name: str, disk_id: str, zone: str) -> None:
        labels = dict(snap.labels)
        if (labels.get(self.tag_key) != self.ref or labels.get(SNAPSHOT_SOURCE_KEY) != disk_id
                or str(snap.source_disk_id) != disk_id):
            raise ProviderError(f"snapshot {name} exists but is not this group's snapshot of disk {disk_id}"
                                f" (labels {labels}, source disk id {snap.source_disk_id!r}): the disk is kept",
                                region=zone)
