"""Deleting one orphan group on Compute Engine, per the port's deletion contract.

Identity is the numeric id: every resource is re-read by name right before
acting and must still have the listed id (a name reused by a new resource
is never touched: skipped ``replaced``), still carry the group's ref and no
protect label. A protect label anywhere in the group leaves the whole group
alone, because deleting the instance can take auto-delete disks with it.

An instance that now belongs to a managed instance group (metadata ``created-by``)
or has ``deletionProtection`` is never deleted: the whole group is left alone and
the result is ``PROTECTED`` with the reason (SAFETY.md rule 14).

The blast of ``instances.delete`` is the group (SAFETY.md rule 15): the API deletes the
instance's ``autoDelete`` disks with it, so before the call each of them, read from the
instance as re-read now, must be a member of the group that the re-read confirmed, or a
disk that carries neither the ref label key nor a protect label and is the instance's boot
disk (attached ``boot`` true: its own); otherwise the group is skipped and ``skipped`` names the blocking disk
(``blast_protected``, ``blast_foreign``, ``blast_unlisted``). Every delete and snapshot
call is journaled (rule 19).

Order: the instance first; it must then be gone or ``STOPPING``/``TERMINATED``
(anything else after our delete is a ``ProviderError``: seed 002). While it
is shutting down the result is ``DELETING`` and dependents wait for a later
call. Disks are deleted once no instance uses them, addresses once no longer
``IN_USE``; a dependent still in use is pending, never a failure.

With ``snapshot_before_delete`` a disk is deleted only once its snapshot is ``READY``
(``gcp_snapshot``): ``CREATING`` is "not yet", a failed or foreign snapshot fails the
group and keeps the disk. A disk that is not ``READY`` itself is not snapshotted (pending).
Snapshots (listed past ``retain_snapshots_days``) come last and are never deleted while a
disk of their group is still there, nor unless their age as re-read is past the cycle's
``retain_snapshots_days`` (unset: never; ``snapshot_retained``), whatever the listing said.

Known residual race: Compute Engine deletes by *name*, so a resource deleted
and re-created under the same name in the milliseconds between our re-read
and our delete call would be hit. Platforms should not reuse names quickly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orphan_cleanup.core.errors import DependencyNotReady, ProviderError
from orphan_cleanup.core.journal import NO_JOURNAL, Journal
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus, SkippedResource
from orphan_cleanup.providers.base import blast_problem
from orphan_cleanup.providers.gcp.calls import GcpCalls
from orphan_cleanup.providers.gcp.kinds import (
    AFTER_DELETE,
    DISK,
    KIND_BY_RESOURCE,
    ORDER,
    GcpKind,
    controller_of,
    expired,
    link_key,
    protection_of,
)
from orphan_cleanup.providers.gcp.snapshots import DiskSnapshots, taken_by_us

#: Re-read findings that are a protection (rule 14), not a changed resource.
PROTECTIONS = ("managed_by_controller", "deletion_protection")
#: ``.../projects/P/zones/Z/disks/N``: an attached disk's ``source``.
DISK_LINK = re.compile(r"(?:^|/)projects/([^/]+)/zones/([a-z]+-[a-z]+\d+-[a-z])/disks/"
                       r"([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$")


@dataclass
class _Target:
    res: Resource
    spec: GcpKind | None
    name: str
    location: str
    live: Any = None  # the re-read resource; None when gone
    skip: str | None = None
    evidence: str | None = None  # what a protection skip found

    def skipped(self, reason: str | None = None) -> SkippedResource:
        return SkippedResource(kind=self.res.kind, id=self.res.id, reason=reason or self.skip or "skipped")


def _target(res: Resource, ref: str, tag_key: str) -> _Target:
    spec = KIND_BY_RESOURCE.get(res.kind)
    name = str(res.details.get("name") or "")
    location = str(res.details.get(spec.scope) or "") if spec else ""
    t = _Target(res, spec, name, location)
    if spec is None:
        t.skip = "unsupported_kind"
    elif not name or not location:
        t.skip = "missing_details"
    elif res.tags.get(tag_key) != ref:
        t.skip = "ref_mismatch"
    return t


def _recheck(calls: GcpCalls, t: _Target, ref: str, tag_key: str, protect_keys: frozenset[str],
             retain_days: int | None) -> None:
    """Re-read ``t`` and decide whether it is still ours to delete."""
    if t.spec is None or t.skip in ("unsupported_kind", "missing_details", "ref_mismatch"):
        return
    t.skip, t.live = None, calls.get(t.spec, t.location, t.name)
    if t.live is None:
        return
    labels = dict(t.live.labels)
    if str(t.live.id) != t.res.id:
        t.skip = "replaced"
    elif not protect_keys.isdisjoint(labels):
        t.skip = "protected"
    elif labels.get(tag_key) != ref:
        t.skip = "ref_changed"
    elif t.res.kind is ResourceKind.SNAPSHOT and not taken_by_us(t.live, tag_key, ref):
        t.skip = "not_our_snapshot"  # only snapshots the deleter took itself (SAFETY.md rule 15)
    elif t.res.kind is ResourceKind.SNAPSHOT and (
            retain_days is None or not expired(t.live, retain_days=retain_days, now=datetime.now(UTC))):
        t.skip = "snapshot_retained"  # its age as re-read, not as a listing message says; unset: kept forever
    elif t.spec.primary and (controller := controller_of(t.live)) is not None:
        t.skip, t.evidence = "managed_by_controller", f"{t.name} ({t.res.id}) is managed by {controller}"
    elif t.spec.primary and protection_of(t.live) is not None:
        t.skip, t.evidence = "deletion_protection", f"{t.name} ({t.res.id}) has deletionProtection"


def _blast(calls: GcpCalls, primary: _Target, members: Iterable[_Target], ref: str, tag_key: str,
           protect_keys: frozenset[str]) -> tuple[list[str], list[SkippedResource]]:
    """SAFETY.md rule 15: the disks ``instances.delete`` deletes along with the instance
    (``autoDelete``, as the instance reads now), and the ones that block it. A member of
    the group must have passed its re-read; any other disk is read by name and must be the
    instance's boot disk (``boot`` true) carrying neither the ref label key nor a protect
    label: an unlabeled disk attached later is ``blast_foreign``. A ``source`` that names no
    zonal disk of this project blocks too (fail closed), unless it names none because
    it is a local SSD (``SCRATCH``: the instance's own, it has no disk resource)."""
    by_link = {link_key(str(t.res.details.get("self_link") or "")): t for t in members
               if t.res.kind is ResourceKind.DISK}
    blast: list[str] = []
    blocked: list[SkippedResource] = []
    for attached in getattr(primary.live, "disks", ()) or ():
        if "auto_delete" in attached and attached.auto_delete is False:
            continue  # kept by the API when the instance goes (a field left out counts as auto-delete)
        source = str(getattr(attached, "source", "") or "")
        if not source and getattr(attached, "type_", None) == "SCRATCH":
            continue  # a local SSD: it exists only with its instance, no disk resource to verify
        member = by_link.get(link_key(source))
        if member is not None:
            if member.skip is None:
                blast.append(member.res.id)
            else:
                why = "blast_protected" if member.skip == "protected" else "blast_foreign"
                blocked.append(SkippedResource(kind=ResourceKind.DISK, id=member.res.id, reason=why))
            continue
        where = DISK_LINK.search(source)
        if where is None or where.group(1) != calls.project:
            blocked.append(SkippedResource(kind=ResourceKind.DISK, id=source[-200:] or "?", reason="blast_unreadable"))
            continue
        live = calls.get(DISK, where.group(2), where.group(3))
        if live is None:
            continue  # gone already
        problem = blast_problem(dict(live.labels), member=False, ref=ref, tag_key=tag_key,
                                protect_keys=protect_keys)
        if problem is None and getattr(attached, "boot", False) is not True:
            problem = "blast_foreign"  # unlabeled but attached later: only the boot disk is the instance's own
        if problem is None:
            blast.append(str(live.id))
        else:
            blocked.append(SkippedResource(kind=ResourceKind.DISK, id=str(live.id), reason=problem))
    return blast, blocked


def _attached(primary: _Target, targets: Iterable[_Target]) -> set[str]:
    """The group's disks and addresses that the instance, as re-read now, uses: its attached
    disks (``disks[].source``) and the addresses whose ``users`` name it."""
    sources = {link_key(str(getattr(d, "source", "") or "")) for d in getattr(primary.live, "disks", ()) or ()}
    me = link_key(str(getattr(primary.live, "self_link", "") or primary.res.details.get("self_link") or ""))
    found = set()
    for t in targets:
        if t is primary or t.live is None:
            continue
        if t.res.kind is ResourceKind.DISK and link_key(str(t.live.self_link)) in sources:
            found.add(t.res.id)
        elif t.res.kind is ResourceKind.ADDRESS and me in {link_key(str(u)) for u in t.live.users or ()}:
            found.add(t.res.id)
    return found


def _delete_instance(calls: GcpCalls, t: _Target, blast: list[str], journal: Journal) -> ResourceState | None:
    """Delete the instance; ``None`` when it is gone, ``TERMINATING`` while shutting down."""
    if t.spec is None:
        raise ProviderError(f"cannot delete {t.res.kind} {t.res.id}", region=t.location or None)
    if t.live is None:
        return None
    if t.live.status == "STOPPING":
        return ResourceState.TERMINATING  # already shutting down: no second delete
    calls.delete(t.spec, t.location, t.name, target=t.res.id, blast=blast, journal=journal)
    after = calls.get(t.spec, t.location, t.name)
    if after is None or str(after.id) != t.res.id:
        return None
    state = AFTER_DELETE.get(after.status)
    if state is None:
        raise ProviderError(
            f"instance {t.name} ({t.res.id}) is still {after.status} after delete", region=t.location
        )
    return state


def _delete_dependent(calls: GcpCalls, t: _Target, journal: Journal, snapshots: DiskSnapshots | None = None) -> bool:
    """Delete a disk, address or snapshot; ``True`` when confirmed gone, ``False`` when not yet."""
    if t.spec is None:
        return False
    if snapshots is not None and t.res.kind is ResourceKind.DISK:
        if t.live.status != "READY" or not snapshots.ready(t.live, t.location, journal):
            return False
    try:
        calls.delete(t.spec, t.location, t.name, target=t.res.id, journal=journal)
    except DependencyNotReady:
        return False
    after = calls.get(t.spec, t.location, t.name)
    return after is None or str(after.id) != t.res.id


def delete_group(calls: GcpCalls, group: ResourceGroup, *, tag_key: str, protect_key: str,
                 protect_keys: Iterable[str] = (), snapshot_before_delete: bool = False,
                 retain_snapshots_days: int | None = None, journal: Journal = NO_JOURNAL,
                 known_attached: Iterable[str] = ()) -> DeleteResult:
    """Delete one group. ``deleted``: ids confirmed gone, plus the instance while
    confirmed terminating; ``pending``: ids not finished yet (the terminating
    instance, dependents in use or waiting for it).

    Only the disks and addresses the instance's re-read shows attached to it may go with
    it (a listing message may claim any primary and hang anything under it: SAFETY.md
    rules 12 and 15), or those an earlier deletion of this ref confirmed attached
    (``known_attached``: a gone instance shows nothing any more); the others are left for
    the next listing to regroup (``not_attached``, ``primary_gone``)."""
    ref = group.provider_ref
    keys = frozenset({protect_key, *protect_keys})
    snapshots = DiskSnapshots(calls, tag_key=tag_key, ref=ref) if snapshot_before_delete else None
    targets = [_target(r, ref, tag_key) for r in sorted(group.resources, key=lambda r: ORDER.get(r.kind, 99))]
    for t in targets:
        _recheck(calls, t, ref, tag_key, keys, retain_snapshots_days)
    protected = next((t for t in targets if t.skip in PROTECTIONS), None)
    if protected is not None:
        return DeleteResult(status=DeleteStatus.PROTECTED, protection=protected.skip,
                            protection_detail=protected.evidence,
                            skipped=tuple(t.skipped(t.skip or "group_protected") for t in targets))
    if any(t.skip == "protected" for t in targets):
        return DeleteResult(status=DeleteStatus.SKIPPED,
                            skipped=tuple(t.skipped(t.skip or "group_protected") for t in targets))

    primary: _Target | None = None
    attached: set[str] = set()
    unverified = "not_attached"
    if group.primary_id is not None:
        primary = next((t for t in targets if t.res.id == group.primary_id
                        and t.res.kind is ResourceKind.INSTANCE), None)
        if primary is None or primary.skip:
            why = "primary_missing" if primary is None else "owner_skipped"
            return DeleteResult(status=DeleteStatus.SKIPPED,
                                skipped=tuple(t.skipped(t.skip or why) for t in targets))
        attached = set(known_attached) & set(group.resource_ids())
        if primary.live is None:
            unverified = "primary_gone"
        else:
            attached |= _attached(primary, targets)

    deleted: list[str] = []
    pending: list[str] = []
    dependents = [t for t in targets if t is not primary]
    if primary is not None:
        for t in dependents:  # listed with the primary, not attached to it as re-read: not verified
            if t.res.id not in attached and not t.skip and t.live is not None \
                    and t.res.kind is not ResourceKind.SNAPSHOT:  # (a snapshot: taken_by_us instead)
                t.skip = unverified
        blast: list[str] = []
        if primary.live is not None and primary.live.status != "STOPPING":
            blast, blocked = _blast(calls, primary, dependents, ref, tag_key, keys)
            if blocked:
                named = {b.id for b in blocked}
                return DeleteResult(status=DeleteStatus.SKIPPED, skipped=(
                    primary.skipped(blocked[0].reason), *blocked,
                    *(t.skipped(t.skip or "owner_skipped") for t in dependents if t.res.id not in named)))
        was_live = primary.live is not None
        state = _delete_instance(calls, primary, blast, journal)
        deleted.append(primary.res.id)
        if state is not None:
            pending = [primary.res.id] + [t.res.id for t in dependents if not t.skip]
            return DeleteResult(status=DeleteStatus.DELETING, deleted=tuple(deleted), pending=tuple(pending),
                                skipped=tuple(t.skipped() for t in dependents if t.skip),
                                attached=tuple(sorted(attached)))
        if was_live:
            # The instance went in this call: its disks and addresses changed (detached, auto-deleted).
            for t in dependents:
                if t.skip != unverified:
                    _recheck(calls, t, ref, tag_key, keys, retain_snapshots_days)

    skipped: list[SkippedResource] = []
    for t in dependents:
        if t.skip:
            skipped.append(t.skipped())
        elif t.live is None:
            deleted.append(t.res.id)
        elif t.spec is not None and t.spec.in_use(t.live):
            pending.append(t.res.id)
        elif t.res.kind is ResourceKind.SNAPSHOT and any(
                d.res.kind is ResourceKind.DISK and d.res.id not in deleted for d in dependents):
            pending.append(t.res.id)  # a kept snapshot outlives the disks of its group
        elif _delete_dependent(calls, t, journal, snapshots):
            deleted.append(t.res.id)
        else:
            pending.append(t.res.id)

    if pending:
        status = DeleteStatus.DELETING
    elif any(t.skip == unverified for t in dependents):  # not done: the next listing regroups them
        status = DeleteStatus.SKIPPED if unverified == "primary_gone" else DeleteStatus.DELETING
    elif skipped and not deleted:
        status = DeleteStatus.SKIPPED
    else:
        status = DeleteStatus.DELETED
    return DeleteResult(status=status, deleted=tuple(deleted), skipped=tuple(skipped), pending=tuple(pending),
                        attached=tuple(sorted(attached)),
                        snapshots=tuple(snapshots.completed) if snapshots else (),
                        snapshots_pending=tuple(snapshots.pending) if snapshots else ())
