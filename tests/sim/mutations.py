"""Mutations: each disables one safety rule of docs/SAFETY.md, to show that the
simulation notices (tests/sim/test_mutations.py).

Monkeypatching our own code is the point here. A mutation is a context
manager around a batch of seeds; it may patch Python, replace a SQL function
in the simulation's database (restored on exit), or hand the engine another
provider class. ``expect`` names the invariants that should catch it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import msgspec

from orphan_cleanup.core import classify, delete_rules, listing_rules, policy
from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.messages import ListingJob
from orphan_cleanup.core.owners import LedgerRow
from orphan_cleanup.core.results import JobResult
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.core.verdicts import DeleteOutcome, DeleteStatus, Outcome, Verdict, VerdictKind
from orphan_cleanup.cycle import cycle_state, pipeline
from orphan_cleanup.ledger.journal import LedgerJournal
from orphan_cleanup.ledger.locked import LockedCycle
from orphan_cleanup.ledger.session import LedgerSession
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.providers import deletion, operations, snapshots
from orphan_cleanup.providers.base import ResourceProvider
from tests.sim.cloud import SimOperations
from tests.sim.engine import SimEnv
from tests.support.memory_cloud import Item, MemoryOperations, MemoryProvider

Applier = Callable[[SimEnv, ExitStack], dict[str, Any] | None]


@dataclass(frozen=True)
class Mutation:
    name: str
    rule: str
    expect: frozenset[str]
    apply: Applier

    @contextmanager
    def applied(self, env: SimEnv) -> Iterator[dict[str, Any]]:
        with ExitStack() as stack:
            yield self.apply(env, stack) or {}


def _patch(stack: ExitStack, target: Any, name: str, value: Any) -> None:
    stack.enter_context(mock.patch.object(target, name, value))


def _replace_sql_function(env: SimEnv, stack: ExitStack, name: str, edit: Callable[[str], str]) -> None:
    """Redefine a plpgsql function of the simulation's database; restore it on exit."""
    original = env.admin.run("SELECT pg_get_functiondef(CAST(:n AS regproc))", n=name)[0][0]
    mutated = edit(original)
    assert mutated != original, f"mutation of {name} changed nothing"
    env.admin.run(mutated)
    stack.callback(env.admin.run, original)


# ---- rule 1: never touch what is tracked or has no ledger record -------------------

def _orphan_without_record(env: SimEnv, stack: ExitStack) -> None:
    real = classify.classify

    def mutated(group, record, ctx):  # type: ignore[no-untyped-def]
        if record is None and not group.malformed_ref:
            return Verdict(kind=VerdictKind.ORPHAN, reason="mutant_no_record")
        return real(group, record, ctx)

    _patch(stack, classify, "classify", mutated)


def _pending_is_orphan(env: SimEnv, stack: ExitStack) -> None:
    real = classify.classify

    def mutated(group, record, ctx):  # type: ignore[no-untyped-def]
        if record is not None and record.instance_found and str(record.status) == "pending":
            return Verdict(kind=VerdictKind.ORPHAN, reason="mutant_pending")
        return real(group, record, ctx)

    _patch(stack, classify, "classify", mutated)


# ---- rule 2: the margin ---------------------------------------------------------------

def _margin_zero(env: SimEnv, stack: ExitStack) -> None:
    real = policy.limits_for
    _patch(stack, policy, "limits_for", lambda s, b: dataclasses.replace(real(s, b), margin_seconds=0))


def _classify_margin_zero(env: SimEnv, stack: ExitStack) -> None:
    real = classify.classify
    _patch(stack, classify, "classify",
           lambda g, r, ctx: real(g, r, dataclasses.replace(ctx, margin=ctx.margin * 0)))


# ---- rule 3: re-read by immutable id before deleting; the protect tag ------------------

def _no_reread(env: SimEnv, stack: ExitStack) -> None:
    """The memory operations' read by id answers the tags the listing showed: a protect tag
    added or a ref removed since is not seen (the deletion believes the listing)."""
    real = SimOperations._read

    def read(self: SimOperations, target: Any) -> Any:
        live = real(self, target)
        listed = {r.id: r for r in self.group.resources} if self.group is not None else {}
        if live is None or target.id not in listed:
            return live
        return dataclasses.replace(live, tags=dict(listed[target.id].tags))

    _patch(stack, SimOperations, "_read", read)


def _protect_ignored(env: SimEnv, stack: ExitStack) -> None:
    """No protect key applies: the classifier's, the account's (rule 16) and the re-read's."""
    mutant = "mutant-ignores-protect"
    real = classify.classify
    _patch(stack, classify, "classify", lambda g, r, ctx: real(
        g, r, dataclasses.replace(ctx, protect_key=mutant, more_protect_keys=frozenset())))
    _patch(stack, ResourceProvider, "protect_key", property(lambda self: mutant))
    _patch(stack, ResourceProvider, "protect_keys", property(lambda self: frozenset({mutant})))


# ---- rule 4: per-ref delete gates ----------------------------------------------------------

def _no_gate(env: SimEnv, stack: ExitStack) -> None:
    _patch(stack, LedgerStore, "acquire_gate", lambda *a, **k: True)


def _global_gate(env: SimEnv, stack: ExitStack) -> None:
    acquire, release = LedgerStore.acquire_gate, LedgerStore.release_gate
    _patch(stack, LedgerStore, "acquire_gate",
           lambda store, scope, ref, holder, ttl: acquire(store, scope, "global", holder, ttl))
    _patch(stack, LedgerStore, "release_gate",
           lambda store, scope, ref, holder: release(store, scope, "global", holder))


# ---- rule 5: skip the rest of a region after a timeout ---------------------------------------

def _no_region_trip(env: SimEnv, stack: ExitStack) -> None:
    real = delete_rules.delete_refusal

    def mutated(**kw):  # type: ignore[no-untyped-def]
        why = real(**kw)
        return None if why is DeleteOutcome.REGION_TRIPPED else why

    _patch(stack, delete_rules, "delete_refusal", mutated)


# ---- rule 6: fencing -----------------------------------------------------------------------------

def _no_fence(env: SimEnv, stack: ExitStack) -> None:
    _replace_sql_function(env, stack, "oc_apply_batch", lambda src: re.sub(
        r"IF cl\.fence IS DISTINCT FROM.*?END IF;", "", src, count=1, flags=re.S))
    # A known cycle is locked whatever its fence, lease or outcome (an unknown one still raises).
    _patch(stack, LockedCycle, "check_lease", lambda self, fence, lease_owner: None)


# ---- rule 7: clean_at only on a clean cycle ----------------------------------------------------------

def _clean_always(env: SimEnv, stack: ExitStack) -> None:
    _patch(stack, classify, "outcome",
           lambda f: Outcome.FAILED if f.listing_failed or f.delete_failed else Outcome.CLEAN)


# ---- rule 8: blast radius ---------------------------------------------------------------------------

def _no_blast_cap(env: SimEnv, stack: ExitStack) -> None:
    _patch(stack, classify, "blast_radius_violation", lambda *a, **k: None)


# ---- rule 9: STEP 1 sees every ledger change ---------------------------------------------------------

def _no_delete_activity(env: SimEnv, stack: ExitStack) -> None:
    _replace_sql_function(env, stack, "orphan_cleanup_instance_activity", lambda src: src.replace(
        "IF TG_OP IN ('UPDATE', 'DELETE') THEN", "IF TG_OP = 'UPDATE' THEN", 1))


def _no_backend_activity(env: SimEnv, stack: ExitStack) -> None:
    _replace_sql_function(env, stack, "orphan_cleanup_backend_activity", lambda src: re.sub(
        r"BEGIN.*END", "BEGIN\n    RETURN NULL;\nEND", src, count=1, flags=re.S))


# ---- rule 10: ownership by provider account -----------------------------------------------------------

def _with(record: Any, **changes: Any) -> Any:
    """A ledger record (the ``LedgerRow`` the join decodes, or a ``LedgerRecord``) with ``changes``."""
    if isinstance(record, LedgerRow):
        return msgspec.structs.replace(record, **changes)
    return record.model_copy(update=changes)


def _ownership_by_backend_id(env: SimEnv, stack: ExitStack) -> None:
    """The old rule: only an owner of this very backend id keeps its VM tracked; an owner
    of any other backend makes a listed VM a backend_mismatch (after the copy and margin checks)."""
    real = classify.classify

    def mutated(group, record, ctx):  # type: ignore[no-untyped-def]
        if (record is not None and record.backend_id is not None and record.backend_id != ctx.backend_id
                and record.owner_backend_scope is not None and str(record.status) in classify.LIVE):
            record = _with(record, owner_backend_scope="mutant:elsewhere",
                           primary_id=f"mutant-not-{group.primary_id}")
        return real(group, record, ctx)

    _patch(stack, classify, "classify", mutated)


def _listing_key_ignores_account(env: SimEnv, stack: ExitStack) -> None:
    """The tick's sharing key leaves the account out: backends of different accounts in
    the same regions share one listing, made with the first one's credentials, and
    the others' cycles classify (and would delete) another account's resources."""

    real = Backend.listing_key.fget
    assert real is not None

    def listing_key(self: Backend) -> str:  # the real key of this backend in an account-less scope
        return real(self.model_copy(update={"account": "*",
                                            "settings": self.settings.model_copy(update={"project": None})}))

    _patch(stack, Backend, "listing_key", property(listing_key))


# ---- rule 11: identity before action --------------------------------------------------------------------

def _no_identity_check(env: SimEnv, stack: ExitStack) -> None:
    _patch(stack, ResourceProvider, "verify_identity", lambda self: None)


# ---- rule 12: messages are hints ----------------------------------------------------------------------

def _trust_message_mode(env: SimEnv, stack: ExitStack) -> None:
    """The pipeline believes its messages: a batch's backend, mode, listing time and
    record_all, a delete request's backend and resources (the deleter deletes the
    message's group, in whatever mode the cycle was)."""
    current: list[Any] = []
    real_context, real_allowed = LedgerSession.cycle_context, cycle_state.delete_allowed
    real_batch, real_delete = pipeline.Pipeline.handle_batch, pipeline.Pipeline.handle_delete

    def context(self, cycle_id, **kw):  # type: ignore[no-untyped-def]
        c = real_context(self, cycle_id, **kw)
        if c is None or not current:
            return c
        msg = current[-1]
        if hasattr(msg, "mode"):
            return dataclasses.replace(c, backend_id=msg.backend, mode=msg.mode, listed_at=msg.listed_at,
                                       record_all=msg.record_all)
        return dataclasses.replace(c, backend_id=msg.backend)

    def allowed(store, cycle_id, requested):  # type: ignore[no-untyped-def]
        decision = real_allowed(store, cycle_id, requested)
        why = decision.refusal
        if why is DeleteOutcome.GROUP_MISMATCH:  # the other checks still apply, to the group as recorded
            with store.cycle(cycle_id) as cyc:
                recorded = cyc.delete_request(requested.key).group
            decision = real_allowed(store, cycle_id, recorded) if recorded else decision
            why = decision.refusal if recorded else DeleteOutcome.NOT_DISPATCHED
        trusted = why in (None, DeleteOutcome.NOT_DELETE_MODE)
        return cycle_state.DeleteDecision(None if trusted else why, requested, decision.listed_primary)

    def around(real):  # type: ignore[no-untyped-def]
        def handle(self, msg, *a, **k):  # type: ignore[no-untyped-def]
            current.append(msg)
            try:
                return real(self, msg, *a, **k)
            finally:
                current.pop()
        return handle

    _patch(stack, LedgerSession, "cycle_context", context)
    _patch(stack, cycle_state, "delete_allowed", allowed)
    _patch(stack, pipeline.Pipeline, "handle_batch", around(real_batch))
    _patch(stack, pipeline.Pipeline, "handle_delete", around(real_delete))


def _job_grouping_trusted(env: SimEnv, stack: ExitStack) -> None:
    """The lister believes a listing job's grouping: every backend the job names that
    starts is fed by one listing (the first one's), instead of regrouping by the rows'
    listing keys. A stale job (a row edited since the tick) or a forged one feeds a cycle
    another scope's listing."""
    real = pipeline.Pipeline.run_job

    def run_job(self: pipeline.Pipeline, job: ListingJob) -> JobResult:
        # While the job runs, every row has the same key: the job's grouping decides.
        with mock.patch.object(Backend, "listing_key", property(lambda backend: "the job's grouping")):
            return real(self, job)

    _patch(stack, pipeline.Pipeline, "run_job", run_job)


def _mode_uncapped(env: SimEnv, stack: ExitStack) -> None:
    """A row's mode is not capped by the stack's ceiling: delete runs under ORPHAN_CLEANUP_MAX_MODE=report."""
    _patch(stack, Settings, "mode_ceiling", property(lambda self: "delete"))


def _off_overridable(env: SimEnv, stack: ExitStack) -> None:
    _patch(stack, policy, "effective_mode",
           lambda settings, backend, override=None: override or backend.mode or settings.mode)


# ---- rule 13: one clock ---------------------------------------------------------------------------------

def _function_clock(env: SimEnv, stack: ExitStack) -> dict[str, Any]:
    """The old behaviour: the pipeline compares the function's own clock (skewed by the
    seed's skew against the database) with the ledger's timestamps."""
    return {"function_clock": True}


# ---- rule 14: never fight another controller, never loop on a protection -----------------------------

def _controller_ignored(env: SimEnv, stack: ExitStack) -> None:
    """What the product does without the rule: a controller-managed orphan candidate is an
    orphan (the classifier's rule-14 check, and the deleter's re-classification under the
    gate, ignore controllers), and the provider's re-read before terminating does too."""
    real_of, real_reread = classify.protection_of, MemoryOperations.protection

    def protection_of(group: ResourceGroup, record: Any, **kw: Any) -> str | None:
        why = real_of(group, record, **kw)
        if why != "managed_by_controller":
            return why
        return real_of(group.model_copy(update={"resources": tuple(
            r.model_copy(update={"controller": None}) for r in group.resources)}), record, **kw)

    _patch(stack, classify, "protection_of", protection_of)
    _patch(stack, MemoryOperations, "protection", lambda self, owner, remembered: real_reread(
        self, dataclasses.replace(owner, item=Item(dataclasses.replace(owner.item.resource, controller=None),
                                                   owner.item.attachments)), remembered))


def _protection_forgotten(env: SimEnv, stack: ExitStack) -> None:
    """The classifier ignores the primaries an earlier delete found termination-protected
    (``LedgerRecord.protected_primaries``): a report cycle reports the group as an orphan."""
    real = classify.protection_of
    _patch(stack, classify, "protection_of", lambda group, record, **kw: real(
        group, _with(record, protected_primaries={}), **kw))


def _protection_fails_cycle(env: SimEnv, stack: ExitStack) -> None:
    """A delete that finds a protection is recorded as a failed deletion (the cycle fails,
    the orphan row is ``delete_failed``, not ``protected``: nothing is learned)."""
    real = delete_rules.delete_record

    def delete_record(group, *, result=None, **kw):  # type: ignore[no-untyped-def]
        if result is not None and result.status is DeleteStatus.PROTECTED:
            return real(group, **{**kw, "error": f"protected: {result.protection} (mutant)"})
        return real(group, result=result, **kw)

    _patch(stack, delete_rules, "delete_record", delete_record)


def _no_blast_check(env: SimEnv, stack: ExitStack) -> None:
    """The deleter terminates an instance whatever the provider would delete with it."""
    _patch(stack, deletion, "blast_problem", lambda *a, **k: None)


def _primary_unchecked(env: SimEnv, stack: ExitStack) -> None:
    """A live owner's VM that is not its recorded primary is a retry leak whether or not
    that primary is listed (the classifier) or live (the deleter's question)."""
    _patch(stack, listing_rules.ListedInstances, "has", lambda self, ref, region, primary_id: True)
    _patch(stack, MemoryProvider, "holds_instance", lambda self, region, instance_id, ref: True)


def _volume_owner_untracked(env: SimEnv, stack: ExitStack) -> None:
    """A live volume owner's recorded volume is judged an orphan, as if the classifier took a
    volume owner's group for a leftover of its ref (the volumes world: README, C1)."""
    real = classify.classify

    def mutated(group, record, ctx):  # type: ignore[no-untyped-def]
        if (record is not None and record.owner_type == "volume" and record.instance_found
                and record.deleted_at is None and str(getattr(record.status, "value", record.status))
                in ("provisioning", "active") and group.primary_id is not None
                and group.primary_id == record.primary_id):
            return Verdict(kind=VerdictKind.ORPHAN, reason="mutant_volume_untracked")
        return real(group, record, ctx)

    _patch(stack, classify, "classify", mutated)


def _foreign_snapshots(env: SimEnv, stack: ExitStack) -> None:
    """Snapshots are listed and deleted by their ref tag alone, whoever took them."""
    _patch(stack, snapshots, "taken_by_us", lambda facts, *, tag_key, ref, name_for: bool(
        facts.tags.get(tag_key)) and (ref is None or facts.tags.get(tag_key) == ref))


def _keys_per_backend(env: SimEnv, stack: ExitStack) -> None:
    """A cycle uses its own backend's protect and controller keys only, not its account's:
    what another backend of the account protects is an orphan to this one."""
    from orphan_cleanup.cycle import deleter

    for module in (cycle_state, deleter):
        _patch(stack, module, "account_view", lambda backend, account_settings, *stack_key: backend)


def _stack_key_dropped(env: SimEnv, stack: ExitStack) -> None:
    """The stack's own protect key (ORPHAN_CLEANUP_PROTECT_TAG_KEY) protects only when a row
    names it: the lister's snapshot, the classifier and the deleter leave it out."""
    from orphan_cleanup.core import backends
    from orphan_cleanup.cycle import deleter

    real_view, real_context = backends.account_view, policy.classify_context
    for module in (cycle_state, deleter):
        _patch(stack, module, "account_view", lambda backend, account_settings, *stack_key: real_view(
            backend, account_settings, backend.settings.protect_tag_key))
    _patch(stack, policy, "classify_context", lambda settings, backend, *a, **kw: real_context(
        settings.model_copy(update={"protect_tag_key": backend.settings.protect_tag_key}), backend, *a, **kw))


def _no_journal(env: SimEnv, stack: ExitStack) -> None:
    """The deleter's journal records nothing: a provider call leaves no row (as a delete
    recorded only inside the cycle's fenced transaction does once the lease is lost)."""
    _patch(stack, LedgerJournal, "intent", lambda self, call, target, **kw: None)
    _patch(stack, LedgerJournal, "result", lambda self, intent, outcome, error=None: None)


# ---- the one deletion algorithm (rules 15, 18, 20, 21, and 14's spot requests) ------------------------
# Each patches the product's deletion (``providers.deletion``, its snapshot rules) or the
# memory cloud's operations where the check lives, never an invariant.

def _own_device_unchecked(env: SimEnv, stack: ExitStack) -> None:
    """Any device counts as attached at launch: a root swapped in later goes with the instance."""
    _patch(stack, operations, "attached_at_launch", lambda attached, launched: True)


def _name_unchecked(env: SimEnv, stack: ExitStack) -> None:
    """The memory operations' delete calls address a name without checking that it still
    names the id they read (as a GCP delete by name without its ``get``)."""
    _patch(stack, MemoryOperations, "_still_named", lambda self, live: True)


def _in_use_fails(env: SimEnv, stack: ExitStack) -> None:
    """A delete the provider refuses as in use (``ResourceInUse``) is a failure of the group:
    the deletion no longer catches it, and the cycle fails."""

    class NeverRaised(Exception):
        pass

    _patch(stack, deletion, "ResourceInUse", NeverRaised)


def _in_use_ignored(env: SimEnv, stack: ExitStack) -> None:
    """The memory operations take any instance holding a dependent for gone: they detach it."""
    from orphan_cleanup.providers.operations import Readiness

    _patch(stack, MemoryOperations, "_holder", lambda self, instance_id, owner_id, where: Readiness.READY)


def _snapshot_age_unchecked(env: SimEnv, stack: ExitStack) -> None:
    """The deleter's re-check of a snapshot ignores the retention (any age will do)."""
    real = deletion.snapshot_kept
    _patch(stack, deletion, "snapshot_kept", lambda facts, **kw: real(facts, **{**kw, "retain_days": 0}))


def _listing_facts_trusted(env: SimEnv, stack: ExitStack) -> None:
    """The deletion takes facts from the group it was given (the listing the cycle recorded)
    instead of its own reads: creation times (the VM's, a snapshot's), attachments, names,
    controllers and protections (rule 21)."""
    real = SimOperations._read

    def read(self: SimOperations, target: Any) -> Any:
        live = real(self, target)
        listed = {r.id: r for r in self.group.resources} if self.group is not None else {}
        r = listed.get(target.id)
        if live is None or r is None:
            return live
        res = live.item.resource
        res = dataclasses.replace(res, created_at=r.created_at or res.created_at, attached_to=r.attached_to,
                                  controller=r.controller, protection=r.protection,
                                  name=str(r.details.get("name") or res.name))
        return dataclasses.replace(live, item=Item(res, live.item.attachments))

    _patch(stack, SimOperations, "_read", read)
    _patch(stack, MemoryProvider, "instance_created_at", lambda self, instance: instance.created_at)


def _backend_row_trusted(env: SimEnv, stack: ExitStack) -> None:
    """A cycle works on its backend's row as it is now, not as its lease snapshotted it (rule 18)."""
    real = LedgerSession.cycle_context

    def context(self: LedgerSession, cycle_id: str, **kw: Any) -> Any:
        c = real(self, cycle_id, **kw)
        return dataclasses.replace(c, backend=c.row) if c is not None and c.row is not None else c

    _patch(stack, LedgerSession, "cycle_context", context)


def _oversized_fails_region(env: SimEnv, stack: ExitStack) -> None:
    """A group too large for one message even reduced takes its whole region down with it."""
    from orphan_cleanup.core.listing import RegionListing
    from orphan_cleanup.cycle import lister

    real = lister._Batcher.add

    def add(self: Any, region: RegionListing) -> Any:
        if region.failure is None and any(self._sized(g)[1] > self.limit for g in region.groups):
            region = RegionListing(region=region.region, failure="a group is too large for one message")
        return real(self, region)

    _patch(stack, lister._Batcher, "add", add)


def _spot_unchecked(env: SimEnv, stack: ExitStack) -> None:
    """Nothing would replace a deleted instance: a persistent spot request is left open."""
    _patch(stack, MemoryOperations, "replaced_by", lambda self, owner: None)


def _unreadable_row_refused(env: SimEnv, stack: ExitStack) -> None:
    """A backend row whose settings cannot be read is refused, not read leniently (rule 16):
    the account's keys cannot be formed, and every cycle of the account stops."""
    import sys

    from orphan_cleanup.core import backends
    from orphan_cleanup.core.errors import ConfigError

    real = backends.account_view

    def strict(backend: Backend, account_settings: Any, *stack_key: str) -> Backend:
        rows = list(account_settings)
        if any(not backends._readable(raw) for raw in rows):
            raise ConfigError("a backend of the account has settings that cannot be read")
        return real(backend, rows, *stack_key)

    for module in [m for m in list(sys.modules.values())
                   if getattr(m, "__name__", "").startswith("orphan_cleanup.")
                   and getattr(m, "account_view", None) is real]:
        _patch(stack, module, "account_view", strict)


# ---- rule 23: mark, then sweep ------------------------------------------------------

# ---- rule 24: coverage never shrinks silently ---------------------------------------------------

def _coverage_dropped(env: SimEnv, stack: ExitStack) -> None:
    """A deleted or moved backend leaves no retired coverage: what it covered is no longer listed."""
    _replace_sql_function(env, stack, "orphan_cleanup_retire_coverage", lambda src: src.replace(
        "IF coalesce(cardinality(gone), 0) = 0 THEN", "IF true THEN", 1))


def _coverage_not_run(env: SimEnv, stack: ExitStack) -> None:
    """The tick runs the backends only (it reads ``backends``, not ``coverages``): a retired coverage
    is recorded and never listed."""
    from orphan_cleanup.ledger import queries

    _patch(stack, queries, "TICK_SQL", queries.TICK_SQL.replace(" FROM coverages() b", " FROM backends b")
           .replace(" FROM coverages() s)", " FROM backends s)").replace("b.retired_from", "NULL")
           .replace("s.retired_from", "NULL").replace("s.origin", "s.id"))


def _coverage_deletes_unasked(env: SimEnv, stack: ExitStack) -> None:
    """A retired coverage deletes whenever the stack's ceiling says delete, whatever its backend's
    last mode was."""
    real = policy.effective_mode

    def mutated(settings, backend, override=None):  # type: ignore[no-untyped-def]
        if backend.retired_from is not None:
            return "report" if override == "report" else settings.mode_ceiling
        return real(settings, backend, override)

    _patch(stack, policy, "effective_mode", mutated)


def _sweep_unconfirmed(env: SimEnv, stack: ExitStack) -> None:
    """A delete cycle deletes every orphan group its own listing found: the confirmation
    window is 0 whatever the stack and the row say."""
    real = LockedCycle.sweep
    _patch(stack, LockedCycle, "sweep", lambda self, _window, gap: real(self, 0, gap))


MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    Mutation("orphan_without_record", "1: never touch a resource without a ledger record",
             frozenset({"S2"}), _orphan_without_record),
    Mutation("pending_is_orphan", "1: never delete a tracked resource (pending owner)",
             frozenset({"S1"}), _pending_is_orphan),
    Mutation("margin_zero", "2: the margin (classification and clean_at)",
             frozenset({"C1", "A1", "L1"}), _margin_zero),
    Mutation("classify_margin_zero", "2: the margin (classification only)",
             frozenset({"S1", "S2", "S3", "L1"}), _classify_margin_zero),
    Mutation("no_reread", "3: re-read by immutable id before deleting",
             frozenset({"S2", "S3"}), _no_reread),
    Mutation("protect_ignored", "3/C2: the protect tag (classifier and re-read)",
             frozenset({"S3"}), _protect_ignored),
    Mutation("no_gate", "4: deletes of one ref are serialized", frozenset({"G1"}), _no_gate),
    Mutation("global_gate", "4: unrelated refs never wait for each other", frozenset({"G2"}), _global_gate),
    Mutation("no_region_trip", "5: skip the rest of a region after a timeout", frozenset({"T1"}), _no_region_trip),
    Mutation("no_fence", "6: a cycle that lost its lease applies nothing", frozenset({"F1"}), _no_fence),
    Mutation("clean_always", "7: clean_at advances only on a clean cycle", frozenset({"C1"}), _clean_always),
    Mutation("no_blast_cap", "8: the blast-radius cap", frozenset({"B1"}), _no_blast_cap),
    Mutation("mode_uncapped", "8: the stack's mode is a ceiling", frozenset({"M1"}), _mode_uncapped),
    Mutation("no_delete_activity", "9: a hard delete counts as STEP 1 activity",
             frozenset({"A1", "L1"}), _no_delete_activity),
    Mutation("no_backend_activity", "9: an edit of a backend's row counts as STEP 1 activity",
             frozenset({"A1", "L1"}), _no_backend_activity),
    Mutation("ownership_by_backend_id", "10: ownership by provider account, not backend id",
             frozenset({"X1", "S1"}), _ownership_by_backend_id),
    Mutation("listing_key_ignores_account", "10/C5: only backends of one account share a listing",
             frozenset({"I2"}), _listing_key_ignores_account),
    Mutation("no_identity_check", "11: identity before action", frozenset({"I1"}), _no_identity_check),
    Mutation("trust_message_mode", "12: messages are hints, the database is the truth",
             frozenset({"R1", "R2", "S1", "S2", "S3", "X1", "W1"}), _trust_message_mode),
    Mutation("job_grouping_trusted", "12/C5: a listing job's grouping is a hint, the rows decide",
             frozenset({"I2"}), _job_grouping_trusted),
    Mutation("off_overridable", "12/C5: off is final", frozenset({"R2"}), _off_overridable),
    Mutation("function_clock", "13: one clock (the database's)", frozenset({"C1", "A1", "S1", "X1"}),
             _function_clock),
    Mutation("controller_ignored", "14: never fight another controller", frozenset({"P1"}), _controller_ignored),
    Mutation("protection_forgotten", "14: never loop on a protection (learned protections ignored)",
             frozenset({"P2"}), _protection_forgotten),
    Mutation("protection_fails_cycle", "14: never loop on a protection (a protection counted as a failure)",
             frozenset({"P2"}), _protection_fails_cycle),
    Mutation("no_blast_check", "15: the blast of a call is the group", frozenset({"V1"}), _no_blast_check),
    Mutation("primary_unchecked", "17: a live owner's other VM is deleted only beside its recorded primary",
             frozenset({"X1", "S1"}), _primary_unchecked),
    Mutation("foreign_snapshots", "15: snapshot retention deletes only the deleter's own snapshots",
             frozenset({"K1"}), _foreign_snapshots),
    Mutation("keys_per_backend", "16: one account, one set of keys", frozenset({"S3"}), _keys_per_backend),
    Mutation("stack_key_dropped", "16: the stack's protect key always protects", frozenset({"S3"}),
             _stack_key_dropped),
    Mutation("no_journal", "19: every provider mutation leaves a record", frozenset({"J1"}), _no_journal),
    Mutation("own_device_unchecked", "15: only the owner's own device attached at launch goes with it",
             frozenset({"V1"}), _own_device_unchecked),
    Mutation("name_unchecked", "3/21: a name is checked against the id right before the call",
             frozenset({"N1", "V1"}), _name_unchecked),
    Mutation("in_use_fails", "15: in use outside the group is a verdict, never a failure", frozenset({"U2"}),
             _in_use_fails),
    Mutation("in_use_ignored", "3/15: never detached from a live instance", frozenset({"U1"}), _in_use_ignored),
    Mutation("snapshot_age_unchecked", "15: a snapshot's age is re-read before it is deleted", frozenset({"K1"}),
             _snapshot_age_unchecked),
    Mutation("listing_facts_trusted", "21: the deleter acts on ids alone",
             frozenset({"S1", "S3", "X1", "P1", "K1", "U1"}), _listing_facts_trusted),
    Mutation("backend_row_trusted", "18: a cycle works on the backend as its lease snapshotted it",
             frozenset({"D1"}), _backend_row_trusted),
    Mutation("oversized_fails_region", "20: one bad group fails alone", frozenset({"O1"}), _oversized_fails_region),
    Mutation("spot_unchecked", "14/15: a persistent spot request is cancelled before its instance goes",
             frozenset({"P3"}), _spot_unchecked),
    Mutation("unreadable_row_refused", "16/20: a row whose settings cannot be read adds the default keys",
             frozenset({"X2"}), _unreadable_row_refused),
    Mutation("sweep_unconfirmed", "23: mark, then sweep", frozenset({"W1"}), _sweep_unconfirmed),
    Mutation("volume_owner_untracked", "1/17: a live volume owner's recorded volume is tracked",
             frozenset({"S1", "X1"}), _volume_owner_untracked),
    Mutation("coverage_dropped", "24: a removed or moved backend's coverage stays listed",
             frozenset({"E1", "L2"}), _coverage_dropped),
    Mutation("coverage_not_run", "24: the tick runs retired coverages", frozenset({"L2"}), _coverage_not_run),
    Mutation("coverage_deletes_unasked", "24: a retired coverage is report-only unless its last mode said delete",
             frozenset({"E2"}), _coverage_deletes_unasked),
)}
