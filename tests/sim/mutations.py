"""Mutations: each disables one safety rule of DESIGN §5, to show that the
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

from orphan_cleanup import classify, delete_rules, pipeline
from orphan_cleanup.ledger.store import LedgerStore
from orphan_cleanup.ledger.unit import LockedCycle
from orphan_cleanup.models import DeleteOutcome, Outcome, ResourceState, Verdict, VerdictKind
from orphan_cleanup.providers.base import ResourceProvider
from tests.sim.cloud import SimProvider
from tests.sim.engine import SimEnv

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
        if record is None:
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
    real = pipeline.limits_for
    _patch(stack, pipeline, "limits_for", lambda s, b: dataclasses.replace(real(s, b), margin_seconds=0))


def _classify_margin_zero(env: SimEnv, stack: ExitStack) -> None:
    real = classify.classify
    _patch(stack, classify, "classify",
           lambda g, r, ctx: real(g, r, dataclasses.replace(ctx, margin=ctx.margin * 0)))


# ---- rule 3: re-read by immutable id before deleting; the protect tag ------------------

class NoRereadProvider(SimProvider):
    """Deletes what the listing said, without checking the live tags again."""

    def _reread(self, res, ref):  # type: ignore[no-untyped-def]
        self.cloud.calls["describe"] += 1
        live = self.cloud.resources.get(res.id)
        if live is None or live.state is ResourceState.TERMINATED:
            return None, None
        return live, None


def _no_reread(env: SimEnv, stack: ExitStack) -> dict[str, Any]:
    return {"provider_cls": NoRereadProvider}


def _protect_ignored(env: SimEnv, stack: ExitStack) -> None:
    real = classify.classify
    _patch(stack, classify, "classify",
           lambda g, r, ctx: real(g, r, dataclasses.replace(ctx, protect_key="mutant-ignores-protect")))
    _patch(stack, ResourceProvider, "protect_key", property(lambda self: "mutant-ignores-protect"))


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
    Mutation("no_delete_activity", "9: a hard delete counts as STEP 1 activity",
             frozenset({"A1", "L1"}), _no_delete_activity),
)}
