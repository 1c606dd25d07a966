"""The one deletion algorithm, for every cloud: delete one orphan group through the small
per-cloud operations port (``providers.operations``). A cloud contributes reads, calls and
the facts only it can read; the steps that keep the safety rules are written here once, and
the simulation's in-memory cloud implements the same port (docs/SAFETY.md rule 21).

What the deleter takes from a listing (rule 21): the group's ref, each member's kind,
immutable id and the region or zone to look it up in (``Target``). Every other fact a call
or a match depends on (names, self links, attachments, device names, creation times, tags,
states) comes from the operations' own fresh reads (``Live``); a forged listing batch can
therefore only name ids, and an id names one resource for its whole life.

The steps, in order (rules 3, 12, 14, 15, 19, 21):

1. the owner (the group's instance) is re-read by id; gone, it is done, and only what an
   earlier deletion confirmed attached to it may follow (``known_attached``); another
   ref's, no ref, or a protect tag leaves the group alone. A group without an owner (or
   whose owner was gone; a volume owner's group, whose primary is its volume, is one) has
   every member re-read before any is touched: a protect tag on one, or one that cannot be
   read, leaves the whole group alone (``members_step``);
2. unless its deletion is already under way: its protections (a controller, a
   termination or deletion protection, one an earlier delete found: rule 14) make the
   group ``PROTECTED``; every other member is re-read by id, and a protect tag on any of
   them (or a member that cannot be read) leaves the whole group alone (rule 12);
3. the members the owner uses now, as re-read, are the ones that may go with it; others
   are left for the next listing to regroup (``not_attached``, ``primary_gone``);
4. the blast of the owner's delete (what the provider deletes along with it) must be
   verified members of the group, or the owner's own root, boot or primary-interface
   resource attached at launch (``Doomed.own_device``); anything else skips the group and
   names the resource that blocked it (rule 15);
5. what must happen first (the AWS spot request's cancel, never before its protection is
   known); then the owner and the other members are read once more and judged again (its
   tags, its protections, the members' protect tags, its blast on these reads): the delete
   call acts on that last read, journaled (rule 19), and is confirmed terminating or gone
   by a re-read (seed 002); a call the provider accepted whose confirming read fails still
   counts as made, so the result keeps what the deletion learnt;
6. the dependents, in the order the kinds' ``depends_on`` give, each re-read by id right
   before its own call (never across another call's wait), and, once another call acted
   since, the members still to go read again (a protect tag stops the rest); one still used by the group's
   own terminating owner is "not yet" (pending), one used by anything else is ``in_use``
   (a verdict: unsettled, never failed); with ``snapshot_before_delete`` a volume or disk
   goes only once its snapshot is complete (``snapshots``); a snapshot goes only when it is
   one the deleter took itself and its retention, as re-read, has passed.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from orphan_cleanup.core.errors import DependencyNotReady, ProviderError, ProviderUnavailable, ResourceInUse
from orphan_cleanup.core.journal import NO_JOURNAL, Journal, Outcome
from orphan_cleanup.core.listing import ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.core.verdicts import DeleteResult, DeleteStatus, SkippedResource
from orphan_cleanup.providers.base import ResourceProvider, describe_error
from orphan_cleanup.providers.operations import (
    Blocked,
    DeleteRefused,
    Live,
    Operations,
    Readiness,
    Target,
    Unread,
    delete_order,
)
from orphan_cleanup.providers.snapshots import SnapshotStep, snapshot_kept


@dataclass
class _Run:
    """One group's deletion in progress: what it has found and done so far."""

    ops: Operations
    group: ResourceGroup
    targets: dict[str, Target]
    tag_key: str
    protect_keys: frozenset[str]
    journal: Journal
    remembered: str | None
    known_attached: frozenset[str]
    snapshots: SnapshotStep | None
    retain_days: int | None
    deleted: list[str] = field(default_factory=list)
    skipped: list[SkippedResource] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    attached: set[str] = field(default_factory=set)
    primary_was_gone: bool = False
    protection: tuple[str, str] | None = None
    acted_since_read: bool = False  # a call acted since the members were last read
    accepted: set[str] = field(default_factory=set)  # targets of the calls the provider accepted

    def __post_init__(self) -> None:
        self.journal = _Watched(self.journal, self)

    # -- the owner ---------------------------------------------------------------------

    def owner_step(self, primary: Target) -> DeleteStatus | None:
        """Delete the owner and confirm it; None when it is gone: the dependents go on."""
        owner = self.ops.read([primary])[primary.id]
        if isinstance(owner, Unread):
            return self._skip_group(primary, "unreadable")
        member_ids = frozenset(self.targets)
        if owner is None:
            self.primary_was_gone = True
            self.attached = set(self.known_attached & member_ids)
            self.deleted.append(primary.id)
            return None
        reason = self.not_ours(owner)
        if reason is not None:
            return self._skip_group(primary, reason)
        if owner.state is ResourceState.TERMINATING:
            # Shutting down already: no second call, no blast to judge. Its members no longer
            # show on it; what an earlier call confirmed attached still counts.
            self.attached = set(self.known_attached & member_ids)
            return self._deleting(primary.id)
        protection = self.ops.protection(owner, self.remembered)
        if protection is not None:
            return self._protect_group(primary, *protection)
        members = self._members_before_delete()
        if isinstance(members, str):
            return self._skip_group(primary, members, others="group_protected" if members == "group_protected"
                                    else "owner_skipped")
        used = self.ops.uses(owner, list(members.values())) & member_ids
        if vanished := sorted(used - set(members) - {primary.id}):  # the owner uses it, its read says gone: unread
            self.skipped.extend(SkippedResource(kind=self.targets[i].kind, id=i, reason="unreadable") for i in vanished)
            return self._skip_group(primary, "member_unreadable")
        self.attached = used | (self.known_attached & member_ids)
        blast = self._blast(owner, members)
        if isinstance(blast, str):
            return self._skip_group(primary, blast)
        try:
            replacement = self.ops.replaced_by(owner)
            if replacement is not None:
                reason = self._delete_first(replacement)
                if reason is not None:
                    return self._skip_group(primary, reason)
            final = self._judged_again(owner, blast)
            if isinstance(final, tuple):
                return self._protect_group(primary, *final)
            if isinstance(final, str):
                return self._skip_group(primary, final, others="group_protected" if final == "group_protected"
                                        else "owner_skipped")
            after = self._delete_call(final, blast)
        except DeleteRefused as refused:
            return self._protect_group(primary, refused.reason, refused.detail)
        except Blocked as blocked:
            return self._skip_group(primary, blocked.reason)
        except (DependencyNotReady, ResourceInUse):  # the provider says something outside holds it
            self.pending.append(primary.id)
            return self._skip_group(primary, "in_use")
        if after is None:
            self.deleted.append(primary.id)
            return None
        if after.state is not ResourceState.TERMINATING:  # seed 002: confirmed by the re-read, never assumed
            raise ProviderError(f"{primary.kind} {primary.id} is still {after.raw_state} after its delete call,"
                                " not shutting-down or terminated", region=primary.location)
        return self._deleting(primary.id)

    def _judged_again(self, owner: Live, blast: tuple[str, ...]) -> Live | str | tuple[str, str]:
        """The owner and the other members read once more, right before the owner's delete
        call, after every other read and call of the judgement: the call acts on what these
        reads show, or not at all. The owner's tags must still make it the group's, no
        protection (a controller that took it over meanwhile: rule 14) and no member's protect
        tag may have appeared, and what its delete would take along is judged again on these
        reads and must be what was judged; otherwise the group is left this time
        (``changed_since_read``, ``unreadable``, the protection, or the reason its tags,
        members or blast give)."""
        final = self.ops.read([owner.target])[owner.id]
        if final is None or isinstance(final, Live) and final.state is not owner.state:
            return "changed_since_read"
        if not isinstance(final, Live):
            return "unreadable"
        reason = self.not_ours(final)
        if reason is not None:
            return reason
        protection = self.ops.protection(final, self.remembered)
        if protection is not None:
            return protection
        members = self._members_before_delete(frozenset(self.deleted))  # (a spot request cancelled first)
        if isinstance(members, str):
            return members
        again = self._blast(final, members)
        if isinstance(again, str):
            return again
        return final if sorted(again) == sorted(blast) else "changed_since_read"

    def _delete_first(self, replacement: Live) -> str | None:
        """Delete what would replace the owner (a persistent spot request), confirmed; or why
        the group is skipped: one that is protected, another ref's or untagged is not ours."""
        kind = replacement.target.kind
        reason = self.not_ours(replacement)
        if reason is not None:
            self.skipped.append(SkippedResource(kind=kind, id=replacement.id, reason=reason))
            return f"{kind.value.replace('-', '_')}_{reason}"
        after = self._delete_call(replacement)
        if after is not None and after.state is not ResourceState.TERMINATING:
            raise ProviderError(f"{kind} {replacement.id} is still {after.raw_state} after its delete call",
                                region=replacement.target.location)
        self.cancelled.append(replacement.id)
        if replacement.id in self.targets:
            self.deleted.append(replacement.id)
        return None

    def _delete_call(self, live: Live, blast: tuple[str, ...] = ()) -> Live | None:
        """``ops.delete``, noting a call the provider accepted (journaled ``ok`` or ``gone``):
        when a later part of it fails (the confirming read), that resource counts as deleted,
        unconfirmed, so what the deletion learnt (its ``attached``) stays on record."""
        self.accepted.discard(live.id)
        try:
            return self.ops.delete(live, self.journal, blast)
        except ProviderError:
            if live.id in self.accepted:  # (a spot request outside the group: cancelled, never named deleted)
                (self.deleted if live.id in self.targets else self.cancelled).append(live.id)
            raise

    def members_step(self) -> DeleteStatus | None:
        """Where no owner's step judged the group (it has none, or it was gone): every
        member re-read before any of them is touched; a protect tag on any of them protects
        the whole group (rule 3), a member that cannot be read leaves it this time (fail
        closed). None: the dependents go on."""
        read = self._members_before_delete()
        if not isinstance(read, str):
            return None
        others = "group_protected" if read == "group_protected" else "member_unreadable"
        named = {s.id for s in self.skipped} | set(self.deleted)
        self.skipped.extend(SkippedResource(kind=t.kind, id=t.id, reason=others)
                            for t in self.targets.values() if t.id not in named)
        return DeleteStatus.SKIPPED

    def _deleting(self, owner_id: str) -> DeleteStatus:
        """The owner's deletion is under way (it counts as deleted, and is not finished):
        its dependents wait for a later call."""
        self.deleted.append(owner_id)
        self.pending.extend(i for i in self.targets if i == owner_id or i not in self.deleted)
        return DeleteStatus.DELETING

    def _members_before_delete(self, done: frozenset[str] = frozenset()) -> dict[str, Live] | str:
        """Every other member (but those ``done``) re-read by id right before a delete: a
        protect tag on any of them protects the whole group, as the classifier reads a listing
        (rule 12), whether or not the delete would take it. The members read, or why the group
        is skipped: ``group_protected`` (the protected members named), ``member_unreadable``."""
        others = [t for t in self.targets.values() if t.id != self.group.primary_id and t.id not in done]
        read = self.ops.read(others) if others else {}
        fresh = {rid: live for rid, live in read.items() if isinstance(live, Live)}
        protected = [live.target for live in fresh.values() if not self.protect_keys.isdisjoint(live.tags)]
        if protected:
            self.skipped.extend(SkippedResource(kind=t.kind, id=t.id, reason="protected") for t in protected)
            return "group_protected"
        unread = [t for t in others if isinstance(read.get(t.id), Unread)]
        if unread:  # fail closed: what cannot be read may carry a protect tag (rule 1)
            self.skipped.extend(SkippedResource(kind=t.kind, id=t.id, reason="unreadable") for t in unread)
            return "member_unreadable"
        return fresh

    def _blast(self, owner: Live, members: Mapping[str, Live]) -> tuple[str, ...] | str:
        """Rule 15: the blast of the owner's delete, or why the group is skipped (every
        blocking resource named). A member goes along only as re-read now (its ref, no
        protect tag); a non-member only when it carries neither the ref tag key nor a
        protect tag and is the owner's own device attached at launch."""
        blast: list[str] = []
        blocked: list[str] = []
        for doomed in self.ops.blast(owner, members):
            if doomed.live is None:
                why: str | None = "blast_unreadable"
            else:
                why = blast_problem(doomed.live.tags, member=doomed.id in members, ref=self.group.provider_ref,
                                    tag_key=self.tag_key, protect_keys=self.protect_keys,
                                    own_device=doomed.own_device)
            if why is None:
                blast.append(doomed.id)
            else:
                self.skipped.append(SkippedResource(kind=doomed.kind, id=doomed.id, reason=why))
                blocked.append(why)
        return blocked[0] if blocked else tuple(blast)

    # -- the dependents ------------------------------------------------------------------

    def dependents_step(self) -> None:
        primary_id = self.group.primary_id
        for kind in delete_order(self.ops.kinds.values()):
            depends_on = self.ops.kinds[kind].depends_on
            for target in (t for t in self.targets.values() if t.kind is kind and t.id != primary_id):
                if primary_id is not None and target.id not in self.attached and kind is not ResourceKind.SNAPSHOT:
                    # (a snapshot is verified as one the deleter took itself instead)
                    self._unverified(target)
                elif any(self._still_there(k) for k in depends_on):
                    self.pending.append(target.id)
                else:
                    self._delete_dependent(target)

    def _still_there(self, kind: ResourceKind) -> bool:
        """Whether a member of ``kind`` is still to be waited for (pending, in use, not
        verified): a kind that depends on it waits. One left alone as not the group's
        (protected, another ref's) is not waited for: the provider refuses a delete it
        would break ("not yet")."""
        waiting = {*self.pending, *self.unverified}
        return any(t.kind is kind and t.id in waiting for t in self.targets.values())

    def _unverified(self, target: Target) -> None:
        """A dependent listed with the owner that no read showed attached to it: done when
        it is gone, else left alone for the next listing to regroup (never deleted)."""
        live = self.ops.read([target])[target.id]
        if live is None:
            self.deleted.append(target.id)
            return
        if isinstance(live, Live) and not self.protect_keys.isdisjoint(live.tags):
            self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason="protected"))
            raise _GroupLeft("group_protected")
        reason = "primary_gone" if self.primary_was_gone else "not_attached"
        self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason=reason))
        self.unverified.append(target.id)

    def _delete_dependent(self, target: Target) -> None:
        live = self.ops.read([target])[target.id]  # right before its own call (rule 21)
        if isinstance(live, Unread):  # not done: what cannot be read may be protected
            self.pending.append(target.id)
            self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason="unreadable"))
            return
        if live is None or live.state is ResourceState.TERMINATING:
            self.deleted.append(target.id)
            return
        reason = self.not_ours(live)
        if reason is None and target.kind is ResourceKind.SNAPSHOT:
            reason = snapshot_kept(self.ops.snapshots.facts(live), tag_key=self.tag_key,
                                   ref=self.group.provider_ref, retain_days=self.retain_days,
                                   now=datetime.now(UTC), name_for=self.ops.snapshots.name_for)
        if reason is not None:
            self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason=reason))
            if reason == "protected":  # a protect tag on any member protects the group (rule 3)
                raise _GroupLeft("group_protected")
            return
        try:
            self._siblings_still_the_groups(target)  # before anything is done to free it
            ready = self.ops.ready(live, self.group.primary_id, self.ours, self.journal)
            if ready is Readiness.READY and self.snapshots is not None \
                    and target.kind in (ResourceKind.VOLUME, ResourceKind.DISK):
                if not self.snapshots.ready(live, self.journal):
                    ready = Readiness.NOT_YET
                else:  # the snapshot's calls and wait came between: judged again on a new read
                    again = self._read_again(target)
                    if not isinstance(again, Live):
                        return
                    live = again
            if ready is Readiness.READY:
                self._siblings_still_the_groups(target)
                after = self._delete_call(live)
                if after is not None and after.state is not ResourceState.TERMINATING:
                    ready = Readiness.NOT_YET
        except DependencyNotReady:
            ready = Readiness.NOT_YET
        except ResourceInUse:
            ready = Readiness.IN_USE
        except Blocked as blocked:
            self.pending.append(target.id)
            self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason=blocked.reason))
            return
        if ready is Readiness.READY:
            self.deleted.append(target.id)
            if target.kind is ResourceKind.SPOT_REQUEST:
                self.cancelled.append(target.id)
        elif ready is Readiness.NOT_YET:
            self.pending.append(target.id)
        else:  # a verdict, not a failure: named, and not finished (the group stays unsettled)
            self.pending.append(target.id)
            self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason="in_use"))

    def _siblings_still_the_groups(self, target: Target) -> None:
        """Right before a dependent's call, when another call acted (and maybe waited) since
        the members were last read: the members still to go are read again, and a protect
        tag on any of them (or one that cannot be read) stops the deletion (``_GroupLeft``),
        as it would have stopped it at the start (rule 3)."""
        if not self.acted_since_read:
            return
        gone_from_group = (s.id for s in self.skipped if s.reason in ("ref_changed", "ref_missing"))
        done = frozenset({*self.deleted, *gone_from_group, target.id})
        read = self._members_before_delete(done)
        if isinstance(read, str):
            raise _GroupLeft(read)
        self.acted_since_read = False

    def group_left(self, reason: str) -> DeleteResult:
        """The deletion stopped part-way because a member became protected or unreadable: what
        went is on record, every member not named yet is left (``group_protected``,
        ``member_unreadable``), and the group is not done."""
        named = {*self.deleted, *(s.id for s in self.skipped)}
        self.skipped.extend(SkippedResource(kind=t.kind, id=t.id, reason=reason)
                            for t in self.targets.values() if t.id not in named)
        self.pending = [i for i in self.pending if i not in {s.id for s in self.skipped}]
        return self.result(DeleteStatus.SKIPPED)

    def _read_again(self, target: Target) -> Live | None:
        """A dependent read again before its call (after another call's wait): its ``Live``
        when it is still the group's to delete; else None, with what it is recorded."""
        live = self.ops.read([target])[target.id]
        if live is None:
            self.deleted.append(target.id)
            return None
        reason = "unreadable" if isinstance(live, Unread) else self.not_ours(live)
        if reason is not None:
            if reason == "unreadable":
                self.pending.append(target.id)
            self.skipped.append(SkippedResource(kind=target.kind, id=target.id, reason=reason))
            if reason == "protected":
                raise _GroupLeft("group_protected")
            return None
        return live if isinstance(live, Live) else None

    # -- verdicts ------------------------------------------------------------------------

    def ours(self, live: Live) -> bool:
        """Whether a resource, as just read, is a member the deletion may change."""
        return live.id in self.targets and self.not_ours(live) is None

    def not_ours(self, live: Live) -> str | None:
        """Why a resource read now is not the group's to delete: a protect tag, no ref, another ref."""
        if not self.protect_keys.isdisjoint(live.tags):
            return "protected"
        if self.tag_key not in live.tags:
            return "ref_missing"
        if live.tags[self.tag_key] != self.group.provider_ref:
            return "ref_changed"
        return None

    def _protect_group(self, primary: Target, reason: str, detail: str) -> DeleteStatus:
        self.protection = (reason, detail)
        self._skip_group(primary, reason)
        return DeleteStatus.PROTECTED

    def _skip_group(self, primary: Target, reason: str, others: str = "owner_skipped") -> DeleteStatus:
        """The whole group left alone: the owner for ``reason``, each member not named yet
        for ``others``."""
        self.skipped.insert(0, SkippedResource(kind=primary.kind, id=primary.id, reason=reason))
        named = {s.id for s in self.skipped} | set(self.deleted)  # (a spot request cancelled first is named deleted)
        self.skipped.extend(SkippedResource(kind=t.kind, id=t.id, reason=others)
                            for t in self.targets.values() if t.id not in named)
        return DeleteStatus.SKIPPED

    def interrupted(self, exc: ProviderError) -> DeleteResult:
        """A provider call failed after something was deleted: the result so far, the rest
        pending, and the error (``ProviderUnavailable``: the region trips)."""
        named = {*self.deleted, *self.pending, *(s.id for s in self.skipped)}
        self.pending.extend(i for i in self.targets if i not in named)
        return self.result(DeleteStatus.DELETING).model_copy(update={
            "error": describe_error(exc), "region_unavailable": isinstance(exc, ProviderUnavailable)})

    def result(self, status: DeleteStatus | None) -> DeleteResult:
        if status is None:
            if self.pending:
                status = DeleteStatus.DELETING
            elif self.unverified:  # not done: unsettled, the next listing regroups them
                status = DeleteStatus.SKIPPED if self.primary_was_gone else DeleteStatus.DELETING
            elif self.skipped and not self.deleted:
                status = DeleteStatus.SKIPPED
            else:
                status = DeleteStatus.DELETED
        protected = status is DeleteStatus.PROTECTED and self.protection is not None
        return DeleteResult(
            status=status, deleted=tuple(dict.fromkeys(self.deleted)), skipped=tuple(self.skipped),
            pending=tuple(dict.fromkeys(self.pending)),
            protection=self.protection[0] if protected and self.protection else None,
            protection_detail=self.protection[1] if protected and self.protection else None,
            cancelled_requests=tuple(dict.fromkeys(self.cancelled)), attached=tuple(sorted(self.attached)),
            snapshots=tuple(self.snapshots.completed) if self.snapshots else (),
            snapshots_pending=tuple(self.snapshots.pending) if self.snapshots else (),
        )


class _GroupLeft(Exception):
    """A member became protected (or unreadable) during the deletion: the rest is left."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Watched:
    """The deletion's journal, passed through, noting every call the provider accepted (its
    result ``ok`` or ``gone``): the members read before it may be stale
    (``_Run.acted_since_read``), and a failure after it (a confirming read) leaves its target
    counted as acted on (``_Run.accepted``)."""

    def __init__(self, journal: Journal, run: _Run) -> None:
        self.journal = journal
        self.run = run

    def intent(self, call: str, target: str, *, region: str | None, blast: Sequence[str] = ()) -> object:
        return self.journal.intent(call, target, region=region, blast=blast), target

    def result(self, intent: object, outcome: Outcome, error: str | None = None) -> None:
        handle, target = cast(tuple[object, str], intent)
        self.journal.result(handle, outcome, error)
        if outcome in ("ok", "gone"):
            self.run.acted_since_read = True
            self.run.accepted.add(target)


#: A volume owner's group (README, C1): its primary is the volume, the group's only member.
VOLUME_PRIMARIES = frozenset({ResourceKind.VOLUME, ResourceKind.DISK})


def volume_primary(group: ResourceGroup) -> bool:
    """Whether ``group`` is a volume owner's: its primary a volume or disk, alone in it."""
    primary = group.primary
    return primary is not None and primary.kind in VOLUME_PRIMARIES and len(group.resources) == 1


def targets_of(group: ResourceGroup, kinds: Iterable[ResourceKind]) -> dict[str, Target]:
    """What the deleter takes from a listed group (rule 21), refusing a shape no listing
    could have produced (fail closed: ``ProviderError``, nothing is touched): a kind the
    cloud does not list, an instance that is not the primary, a primary that is not an
    instance of the group (or a volume owner's volume, alone in it), the same id twice."""
    known = set(kinds)
    problems = [f"{r.kind} {r.id}: not a kind this cloud lists" for r in group.resources if r.kind not in known]
    problems += [f"instance {r.id} is not the primary" for r in group.resources
                 if r.kind is ResourceKind.INSTANCE and r.id != group.primary_id]
    primary = group.primary
    if group.primary_id is not None and (primary is None or primary.kind is not ResourceKind.INSTANCE) \
            and not volume_primary(group):
        problems.append(f"primary {group.primary_id} is not an instance of the group")
    if len(set(group.resource_ids())) != len(group.resources):
        problems.append("duplicate ids")
    if problems:
        raise ProviderError(f"refusing group {group.key}: {'; '.join(problems)}", region=group.region)
    return {r.id: Target(r.kind, r.id, r.region) for r in group.resources}


def delete_group(ops: Operations, group: ResourceGroup, *, tag_key: str, protect_keys: Iterable[str],
                 journal: Journal = NO_JOURNAL, remembered_protection: str | None = None,
                 known_attached: Iterable[str] = (), snapshot_before_delete: bool = False,
                 retain_snapshots_days: int | None = None) -> DeleteResult:
    """Delete one orphan group, as the module docstring says; the ``ResourceProvider``
    deletion contract (``providers.base``) is what it returns. ``DependencyNotReady``
    never leaves it: "not yet" is ``DELETING``."""
    targets = targets_of(group, ops.kinds)
    if volume_primary(group):
        # A volume owner's volume has no owner to delete first: it goes as a primary-less
        # group's members go (re-read, its ref and protect tags checked, snapshotted first
        # with ``snapshot_before_delete``, and left ``in_use`` while an instance holds it).
        group = group.model_copy(update={"primary_id": None})
    run = _Run(ops=ops, group=group, targets=targets, tag_key=tag_key, protect_keys=frozenset(protect_keys),
               journal=journal, remembered=remembered_protection, known_attached=frozenset(known_attached),
               snapshots=SnapshotStep(ops.snapshots, tag_key=tag_key, ref=group.provider_ref)
               if snapshot_before_delete else None,
               retain_days=retain_snapshots_days)
    try:
        if group.primary_id is not None:
            status = run.owner_step(targets[group.primary_id])
            if status is not None:
                return run.result(status)
        if group.primary_id is None or run.primary_was_gone:
            status = run.members_step()
            if status is not None:
                return run.result(status)
        run.dependents_step()
    except _GroupLeft as left:
        return run.group_left(left.reason)
    except DependencyNotReady:
        return DeleteResult(status=DeleteStatus.DELETING, pending=tuple(group.resource_ids()))
    except ProviderError as exc:
        if not run.deleted and not run.cancelled:
            raise
        return run.interrupted(exc)  # what went before the failure stays on record (its attached set)
    return run.result(None)


def created_times(ops: Operations, group: ResourceGroup) -> dict[str, datetime | None]:
    """The creation time each resource of ``group`` has now, read by its id (read-only): what
    the deleter judges the margin and the copy rule on, never a listing's (rules 2, 12, 21).
    A resource that is gone, or cannot be read, is absent."""
    read = ops.read(list(targets_of(group, ops.kinds).values()))
    return {rid: ops.created_at(live) for rid, live in read.items() if isinstance(live, Live)}


def blast_problem(tags: Mapping[str, str], *, member: bool, ref: str, tag_key: str,
                  protect_keys: frozenset[str], own_device: bool) -> str | None:
    """Why a resource the provider would delete along with a call must not go with it
    (rule 15), or None: ``blast_protected`` (a protect tag), ``blast_foreign`` (another
    ref's, a member that lost its ref, or a resource with no ref tag that is not the
    owner's own device attached at launch), ``blast_unlisted`` (this ref's, but not a
    member of the group: the next cycle lists it)."""
    if not protect_keys.isdisjoint(tags):
        return "blast_protected"
    if tag_key not in tags:
        return None if own_device and not member else "blast_foreign"
    if tags[tag_key] != ref:
        return "blast_foreign"
    return None if member else "blast_unlisted"


class OperationsProvider(ResourceProvider):
    """A provider whose deletion is the one algorithm (rule 21): a cloud gives the operations of
    a group's place (``group_operations``); the steps are ``delete_group``'s, and the creation
    times the deleter judges come from the same reads by id."""

    @abstractmethod
    def group_operations(self, group: ResourceGroup) -> Operations:
        """The operations of the one place ``group`` names. Raises ``ProviderError`` (nothing
        read, nothing deleted) when that place is not one of the backend's, or a member names
        another (a forged batch may name any)."""

    def created_times(self, group: ResourceGroup) -> dict[str, datetime | None]:
        return created_times(self.group_operations(group), group)

    def delete_resource_group(self, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                              remembered_protection: str | None = None,
                              known_attached: Iterable[str] = ()) -> DeleteResult:
        return self.delete_with(self.group_operations(group), group, journal,
                                remembered_protection=remembered_protection, known_attached=known_attached)

    def delete_with(self, ops: Operations, group: ResourceGroup, journal: Journal = NO_JOURNAL, *,
                    remembered_protection: str | None = None,
                    known_attached: Iterable[str] = ()) -> DeleteResult:
        """``delete_group`` over ``ops`` with this backend's keys and snapshot settings."""
        settings = self.backend.settings
        return delete_group(ops, group, tag_key=self.tag_key, protect_keys={self.protect_key, *self.protect_keys},
                            journal=journal, remembered_protection=remembered_protection,
                            known_attached=known_attached, snapshot_before_delete=settings.snapshot_before_delete,
                            retain_snapshots_days=settings.retain_snapshots_days)
