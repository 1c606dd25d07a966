"""Keeping an orphan's data, for every cloud: the snapshot a deletion takes of a volume or
disk before deleting it (``snapshot_before_delete``), and which snapshots a deletion or a
listing may ever touch (SAFETY.md rule 15). A cloud contributes ``SnapshotOperations``
(its reads and its one create call); the rules are here once.

A snapshot is the deleter's own (``taken_by_us``) when it carries the group's ref, the
source tag naming the very volume it was taken of (``SNAPSHOT_SOURCE_KEY``), and, where
the deleter chooses the name (GCP), that name. A backup that copied a volume's ref tag
(AWS Backup, a GCP snapshot schedule, a copy) lacks one of them: never listed, never
deleted. A snapshot of ours is deleted only once its age, as re-read, is past the backend's
``retain_snapshots_days`` (unset: kept forever).

Idempotent across cycles: a volume's snapshot is found again by its tags (and name) before
another is taken, so a redelivery or the next cycle waits for the same snapshot. ``pending``
is "not yet" (the volume stays, the group is ``deleting``); a failed or unknown state fails
the group and keeps the volume until an operator deletes that snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import Journal

Progress = Literal["ready", "pending"]
NameFor = Callable[[str, str], str | None]


@dataclass(frozen=True)
class SnapshotFacts:
    """A snapshot as its cloud's read shows it. ``source_id``: the id of the volume or disk
    it was taken of (AWS ``VolumeId``, GCP ``sourceDiskId``); ``progress``: ``ready`` (the
    data is safe), ``pending`` (being taken), None (failed, or a state no one knows)."""

    id: str
    tags: Mapping[str, str]
    source_id: str | None
    name: str | None
    created_at: datetime | None
    progress: Progress | None
    state: str | None = None  # the provider's word, for messages


class SnapshotOperations(Protocol):
    """A cloud's snapshot operations. ``volume`` is the ``deletion.Live`` of a volume or
    disk the deletion read itself; nothing here comes from a listing."""

    def facts(self, live: Any) -> SnapshotFacts:
        """The facts of a snapshot the deletion read (its ``Live``)."""

    def of_volume(self, volume: Any, *, tag_key: str, ref: str) -> list[SnapshotFacts]:
        """The snapshots that claim to be the deleter's of ``volume``: those carrying the ref
        and source tags for it (AWS), the one of the name the deleter gives it (GCP)."""

    def take(self, volume: Any, *, name: str | None, tags: Mapping[str, str], journal: Journal) -> str:
        """Take a snapshot of ``volume`` (journaled, SAFETY.md rule 19) named ``name`` where
        the cloud lets the deleter name it, tagged ``tags``; returns how it is named (AWS:
        the id the create answered, GCP: ``name``)."""

    def name_for(self, ref: str, volume_id: str) -> str | None:
        """The name the deleter gives its snapshot of ``volume_id`` (GCP); None where the
        provider names snapshots itself (AWS)."""


def expired(created_at: datetime | None, *, retain_days: int, now: datetime) -> bool:
    """Whether a snapshot is ``retain_days`` old or more. An unreadable or naive time is not:
    what cannot be dated is kept (fail closed)."""
    return created_at is not None and created_at.tzinfo is not None and created_at <= now - timedelta(days=retain_days)


def taken_by_us(facts: SnapshotFacts, *, tag_key: str, ref: str | None, name_for: NameFor) -> bool:
    """Whether the deleter took this snapshot itself: the ref tag (``ref``, else whatever ref
    it carries), the source tag naming the very volume it was taken of, and the name the
    deleter gives it where it names snapshots."""
    own = facts.tags.get(tag_key)
    if not own or (ref is not None and own != ref):
        return False
    if not facts.source_id or facts.tags.get(SNAPSHOT_SOURCE_KEY) != facts.source_id:
        return False
    try:
        name = name_for(own, facts.source_id)
    except ProviderError:
        return False
    return name is None or facts.name == name


def snapshot_kept(facts: SnapshotFacts, *, tag_key: str, ref: str, retain_days: int | None, now: datetime,
                  name_for: NameFor) -> str | None:
    """Why a snapshot of the group is not deleted, on its re-read facts (never a listing's,
    which a forged batch could carry): ``not_our_snapshot``, or ``snapshot_retained``
    (``retain_days`` unset: kept forever; else younger than that, or of no readable age)."""
    if not taken_by_us(facts, tag_key=tag_key, ref=ref, name_for=name_for):
        return "not_our_snapshot"
    if retain_days is None or not expired(facts.created_at, retain_days=retain_days, now=now):
        return "snapshot_retained"
    return None


def listable(facts: SnapshotFacts, *, tag_key: str, retain_days: int, now: datetime, name_for: NameFor) -> bool:
    """Whether a listing shows this snapshot: one of ours past its retention. A retained one
    is not listed: never an orphan, never holding a cycle unsettled."""
    return expired(facts.created_at, retain_days=retain_days, now=now) and taken_by_us(
        facts, tag_key=tag_key, ref=None, name_for=name_for)


class SnapshotStep:
    """The snapshot step of one group's deletion: ``ready(volume)`` is True once a snapshot
    of ours of that volume is ready; takes one when there is none."""

    def __init__(self, ops: SnapshotOperations, *, tag_key: str, ref: str) -> None:
        self.ops = ops
        self.tag_key = tag_key
        self.ref = ref
        self.completed: list[tuple[str, str]] = []  # (volume id, snapshot id)
        self.pending: list[tuple[str, str]] = []

    def ready(self, volume: Any, journal: Journal) -> bool:
        """True when the volume's data is kept; False while its snapshot is being taken.
        ``ProviderError`` when a snapshot that claims to be ours cannot be used."""
        volume_id = str(volume.id)
        found = self._ours(volume, volume_id)
        if found is None:
            taken = self.ops.take(volume, name=self.ops.name_for(self.ref, volume_id),
                                  tags={self.tag_key: self.ref, SNAPSHOT_SOURCE_KEY: volume_id}, journal=journal)
            found = self._ours(volume, volume_id)  # confirmed by a re-read, never the create's reply (seed 002)
            if found is None:
                self.pending.append((volume_id, taken))
                return False
        (self.completed if found.progress == "ready" else self.pending).append((volume_id, found.name or found.id))
        return found.progress == "ready"

    def _ours(self, volume: Any, volume_id: str) -> SnapshotFacts | None:
        """The volume's snapshot of ours, the ready one first; None when there is none."""
        claimed = self.ops.of_volume(volume, tag_key=self.tag_key, ref=self.ref)
        ours = [s for s in claimed if s.source_id == volume_id
                and taken_by_us(s, tag_key=self.tag_key, ref=self.ref, name_for=self.ops.name_for)]
        strangers = [s for s in claimed if s not in ours]
        if strangers:
            raise ProviderError(f"snapshot {strangers[0].id} claims to be ours of {volume_id} but is not this group's"
                                f" (tags {dict(strangers[0].tags)}, source {strangers[0].source_id!r}): the volume is"
                                " kept")
        for progress in ("ready", "pending"):
            for snap in ours:
                if snap.progress == progress:
                    return snap
        if ours:
            raise ProviderError(f"snapshot {ours[0].id} of {volume_id} is {ours[0].state!r}, not complete: the volume"
                                " is kept (delete that snapshot to have another taken)")
        return None
