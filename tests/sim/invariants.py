"""The invariants, checked around every step that runs a piece of the cleanup.

Safety (any step):
  S1  no resource of a tracked owner is touched (owner pending or terminating,
      or live with the resource in its recorded provisioning attempt);
  S2  no resource without a ledger record is touched (foreign refs, invalid or
      missing ref tags, refs changed by a user);
  S3  no protected (protect tag) or suspected-copy resource is touched;
  R1  nothing is touched on behalf of a report-mode cycle;
  R2  nothing is touched on behalf of a cycle whose recorded mode is not
      delete, and nothing at all (no listing, no delete call) is done for a
      backend whose mode is off (rules 12, C5: off is final);
  X1  no VM that a live owner of ANY backend records as its primary is
      touched (rule 10: ownership is by account, not by backend id);
  I1  no provider call (listing or delete) is made in an account other than
      the backend's configured one (rule 11), counted per call and cloud;
  I2  a cycle is fed by exactly one listing, and only by a listing of its own
      backend's scope: the account the listing reached, and the regions, tag
      keys and credentials of the backend's row (C5: only backends sharing all
      of them share a listing; rule 10: a resource of account X never enters a
      cycle of a backend of account Y), checked on every published batch;
  F1  a cycle that lost its lease writes nothing and reports nothing (rule 6);
  B1  no cycle touches more groups than the blast-radius cap allows (rule 8);
  M1  under a report ceiling (ORPHAN_CLEANUP_MAX_MODE=report) no cycle of a backend runs in delete
      mode, and nothing is deleted for it, unless an operator asked for a one-off delete of it: a
      row's (or the stack's) delete never loosens the ceiling (rule 8);
  W1  mark, then sweep (rule 23): every provider delete of a group by a cycle C of backend B
      comes after a delete-mode cycle C' of B, listed at least B's confirmation window before
      C (the stack's window, lengthened by B's row, never shortened), that classified the same
      group (key; without a primary, the same member ids) an orphan for the same reason, with
      no report-mode listing of B in between;
  T1  after a delete in region r timed out / was unavailable, the cycle makes
      no further provider call in r (rule 5);
  V1  a provider delete call removes only members of the group it was asked to
      delete, nothing the provider would take along with them (rule 15);
  K1  no snapshot the deleter did not take (its source tag) is touched (rule 15);
  J1  every resource a provider delete call removed has a journal intent row naming
      it (as its target or in its blast), written outside the cycle's fence (rule 19: no provider mutation without
      a record);
  G1  two deletes of one ref never run at the same time (rule 4);
  G2  a delete is refused for its gate only while that ref's gate is held (rule 4);
  C1  per backend, clean_at only moves forward, to (at most) the listing time
      minus the margin of a cycle that listed everything, skipped nothing and
      finished every deletion (rule 7), as the simulation itself observed that
      cycle: the listing time is the simulated time of its first listing call
      (a function clock skewed against the database shows here: rule 13);
  A1  STEP 1 never skips a backend while a ledger write concerning it (an
      owner whose backend_id was or became it or was null, a new ref, an edit
      of its backends row) committed after the listing behind its clean_at
      (rule 9).
  P1  no resource that another controller manages or that carries a
      termination/deletion protection is touched (rule 14: the cloud records
      every touch; the product learns a termination protection only from a
      delete, which the simulated cloud refuses as AWS does);
  P2  never loop on a protection (rule 14): a delete whose provider call answered
      ``protected`` is not recorded as a failed deletion (the cycle is not failed
      by it); once recorded, while the protection holds and its orphans row is
      not closed, a later delete of that primary answers ``protected`` again (a
      delete cycle re-reads a remembered protection, read-only, to see it lifted)
      and every report cycle of that backend whose listing started afterwards
      classifies the group protected up front.
  E1  (rule 24, an oracle check) the retired coverage a statement of the simulation on a
      backends row leaves is the one it predicted (old account, dropped or all old regions,
      old settings, mode, why), or none; a coverage goes only after a clean cycle of it retired it;
  E2  (rule 24) a retired coverage whose backend's last mode or the stack's ceiling was not
      delete starts no delete-mode cycle and deletes nothing.
Liveness (end of run):
  L1  once faults stop and the platform is quiet, every orphan is deleted within
      5 scheduled runs (delete mode) or reported by the last clean cycle (report mode).
  L2  (rule 24, the retire world) every leak a removed or moved backend left in its old
      coverage is deleted (a coverage that may delete) or reported by the last complete cycle
      of a report-only one; no coverage retires while one is left.

"Touched" means moved to shutting-down or terminated (from a state that was neither) by a
provider delete call; a shutting-down instance that finishes was touched when it started.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.listing import ResourceGroup, ResourceKind, ResourceState
from tests.sim.db import shift_gates
from tests.sim.owners import TAG

if TYPE_CHECKING:
    from tests.sim.engine import Simulation

TOUCHED = (ResourceState.TERMINATING, ResourceState.TERMINATED)
#: What a function may raise for the faults the simulation injects (X2 looks past them).
BENIGN_CRASHES = frozenset({"DatabaseError", "InterfaceError", "OperationalError", "PublishFailed", "MessageRefused"})

CYCLES_SQL = """
SELECT c.id, (c.outcome IS NOT NULL OR cl.lease_owner IS DISTINCT FROM c.id OR cl.fence <> c.fence) AS dead,
       c.mode, c.listed_at, c.outcome, c.applied_batches, c.open_deletes, c.dispatched,
       c.tripped_regions, c.blocked_reason, c.failures,
       (SELECT count(*) FROM cycle_batches b WHERE b.cycle_id = c.id) AS batches,
       (SELECT count(*) FROM events e WHERE e.cycle_id = c.id) AS events,
       (SELECT count(*) FROM cycle_groups g WHERE g.cycle_id = c.id) AS groups,
       (SELECT count(*) FROM cycle_groups g WHERE g.cycle_id = c.id AND g.verdict = 'skipped') AS skipped,
       (SELECT count(*) FROM delete_requests d WHERE d.cycle_id = c.id AND d.state <> 'queued') AS ended,
       (SELECT count(*) FROM delete_requests d WHERE d.cycle_id = c.id AND d.state <> 'done'
           AND NOT (d.state = 'skipped' AND d.result->'result'->>'status' = 'protected')) AS not_done,
       c.backend_id, c.expected_batches, c.groups_listed, c.error
  FROM cycles c JOIN cleanup cl ON cl.backend_id = c.backend_id
"""
# W1: the delete's own cycle and group, and whether an earlier delete-mode cycle of its backend,
# the window before, confirmed it (rule 23), read from the cycles and cycle_groups the run wrote.
CONFIRMED_SQL = """
SELECT c.backend_id, c.listed_at, g.reason, g.verdict,
       (SELECT min(p.listed_at) FROM cycles p JOIN cycle_groups pg ON pg.cycle_id = p.id
         WHERE p.backend_id = c.backend_id AND p.mode = 'delete' AND p.listed_at IS NOT NULL
           AND p.listed_at <= c.listed_at - make_interval(secs => :w)
           AND pg.group_key = g.group_key AND pg.verdict = 'orphan' AND pg.reason IS NOT DISTINCT FROM g.reason
           AND (g.primary_id IS NOT NULL
                OR ARRAY(SELECT r->>'id' FROM jsonb_array_elements(pg.resources) r ORDER BY 1)
                   = ARRAY(SELECT r->>'id' FROM jsonb_array_elements(g.resources) r ORDER BY 1))
           AND NOT EXISTS (SELECT 1 FROM cycles r WHERE r.backend_id = c.backend_id AND r.mode <> 'delete'
                              AND r.listed_at > p.listed_at AND r.listed_at < c.listed_at)) AS confirmed_by
  FROM cycles c LEFT JOIN cycle_groups g ON g.cycle_id = c.id AND g.group_key = :k
 WHERE c.id = :c
"""
STATE_SQL = f"""
SELECT (SELECT coalesce(json_object_agg(backend_id, clean_at), '{{}}') FROM cleanup),
       (SELECT count(*) FROM delete_gates),
       (SELECT coalesce(json_agg(x), '[]') FROM ({CYCLES_SQL}) AS x),
       (SELECT coalesce(json_agg(id), '[]') FROM retired_coverages)
"""


def snapshot_untouchable(snap: Any, retain_days: int | None, now: datetime | None = None) -> str | None:
    """Why the deleter must never delete this snapshot (rule 15), on the simulation's own
    reading of it: one it did not take (the ref tag, the source tag naming the very volume
    it was taken of, the name it gives its snapshots), or one younger than the retention
    (none without one), on the wall clock the product's listing and deleter read."""
    ref, source = snap.tags.get(TAG), snap.source_id
    if not ref or not source or snap.tags.get(SNAPSHOT_SOURCE_KEY) != source or snap.name != f"oc-{ref}-{source}":
        return f"the deleter never took it (tags {snap.tags}, source {source}, name {snap.name})"
    now = now or datetime.now(UTC)
    if retain_days is None or snap.created_at > now - timedelta(days=retain_days):
        return f"it is younger than the retention ({(now - snap.created_at).days} days, keep {retain_days})"
    return None


@dataclass(frozen=True)
class CycleRow:
    id: str
    dead: bool
    mode: str
    listed_at: datetime | None
    outcome: str | None
    applied: int
    open_deletes: int
    dispatched: bool
    tripped: tuple[str, ...]
    blocked: str | None
    failures: int
    batches: int
    events: int
    groups: int
    skipped: int
    deletes_ended: int
    deletes_not_done: int
    backend: str
    expected_batches: int | None = None
    groups_listed: int = 0
    error: str | None = None
    failure_list: tuple[tuple[str, str], ...] = ()  # (region, error) as the cycle recorded them

    def writes(self) -> tuple[Any, ...]:
        """What a fenced-out cycle must never change again."""
        return (self.outcome, self.applied, self.open_deletes, self.dispatched, self.batches, self.events,
                self.groups, self.deletes_ended, self.tripped)


@dataclass
class Violation:
    invariant: str
    message: str
    seed: int
    step: int
    trace: str

    def __str__(self) -> str:
        return (f"VIOLATION {self.invariant} (seed {self.seed}, step {self.step}): {self.message}\n"
                f"--- last events (replay: python -m tests.sim --seeds 1 --start {self.seed}) ---\n{self.trace}")


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.checks: Counter = Counter()
        self.ignored: Counter = Counter()
        self.violations: list[Violation] = []
        self.clean_at: dict[str, datetime | None] = {}
        self.clean_listed_at: dict[str, datetime] = {}
        self.off: set[str] = set()  # backends whose mode is off (R2)
        self.coverage_cycles: dict[str, bool] = {}  # a retired coverage's cycle: might it delete (E2)
        self.ceiling = "delete"  # the stack's ORPHAN_CLEANUP_MAX_MODE (M1)
        self.asked_delete: set[str] = set()  # backends an operator ran once with mode delete (M1)
        self.cycles: dict[str, CycleRow] = {}
        self.listings: dict[str, Any] = {}
        self.results: dict[str, dict[str, str]] = defaultdict(dict)  # cycle -> group -> last answer
        self.touched_groups: dict[str, set[str]] = defaultdict(set)
        self.tripped: set[tuple[str, str]] = set()
        self.in_flight: Counter = Counter()
        self.reported: list[str] = []
        self.attributed: set[str] = set()
        self.fresh = False  # whether ``cycles``/``clean_at`` reflect the database
        self.gates_held = False
        self.unshifted = 0
        # P2: the order of listings and recorded protections; (backend, primary) -> when
        # a delete's protection was recorded; (cycle, group key) -> the protection the
        # last provider delete of that group answered.
        self.order = itertools.count(1)
        self.protection_found: dict[tuple[str, str], int] = {}
        self.protected_answers: dict[tuple[str, str], str] = {}
        self.in_use_answers: dict[tuple[str, str], list[str]] = {}  # (cycle, group key) -> ids in use (U2)
        self.snapshot_accounts: dict[str, str | None] = {}  # cycle -> the account its lease snapshotted (D1)
        self.people_removed: set[str] = set()  # resources people deleted themselves (not the product)
        self.coverage_ids: set[str] = set()  # the retired coverages the database held at the last read (rule 24)

    def fail(self, invariant: str, message: str) -> None:
        if invariant in self.sim.ignore:
            self.ignored[invariant] += 1
            return
        self.violations.append(Violation(invariant, message, self.sim.seed, self.sim.trace.step,
                                         self.sim.trace.dump()))

    # ---- snapshots ---------------------------------------------------------------

    def read_state(self) -> tuple[dict[str, CycleRow], dict[str, datetime | None]]:
        """The cycles, clean_at per backend and whether delete gates are held, in one round trip."""
        clean_raw, gates, rows, coverages = self.sim.admin.run(STATE_SQL)[0]
        coverages = coverages if isinstance(coverages, list) else json.loads(coverages)
        self.coverage_ids = set(coverages)
        self.gates_held = gates > 0
        clean_raw = clean_raw if isinstance(clean_raw, dict) else json.loads(clean_raw)
        clean_at = {b: datetime.fromisoformat(t) if t else None for b, t in clean_raw.items()}
        rows = rows if isinstance(rows, list) else json.loads(rows)
        out = {}
        for r in rows:
            v = list(r.values())
            failures = v[10] if isinstance(v[10], list) else json.loads(v[10] or "[]")
            listed_at = datetime.fromisoformat(v[3]) if v[3] else None
            out[v[0]] = CycleRow(v[0], bool(v[1]), v[2], listed_at, v[4], v[5], v[6], bool(v[7]),
                                 tuple(v[8] or ()), v[9], len(failures), *v[11:21],
                                 failure_list=tuple((str(f.get("region")), str(f.get("error"))) for f in failures))
        return out, clean_at

    def clock_advanced(self, seconds: int) -> None:
        self.unshifted += seconds

    def set_off(self, backends: set[str]) -> None:
        self.off = set(backends)

    def mode_set(self, backend_id: str, mode: str) -> None:
        """The operator committed a mode for a backend (R2 follows the row)."""
        (self.off.add if mode == "off" else self.off.discard)(backend_id)

    def provider_call(self, backend: Any, cloud: Any, what: str) -> None:
        """Every listing and delete call of a provider adapter (I1, R2)."""
        self.checks["I1"] += 1
        if backend.scope_account != cloud.account:
            self.fail("I1", f"backend {backend.id} (account {backend.scope_account}) made a provider call"
                            f" in account {cloud.account}: {what}")
        self.checks["R2"] += 1
        if backend.id in self.off:
            self.fail("R2", f"backend {backend.id} is off, yet a provider call was made for it: {what}")

    def listing_fed(self, cycle_id: str, backend_id: str, record: Any) -> None:
        """A batch of ``cycle_id`` (of ``backend_id``, as the lister wrote it) was published
        while the listing ``record`` ran (I2; R2 for every backend a shared listing feeds)."""
        self.checks["I2"] += 1
        first = self.listings.setdefault(cycle_id, record)
        spec = self.sim.spec_of(backend_id)
        if record is None:
            self.fail("I2", f"cycle {cycle_id[:8]} of {backend_id} published a batch with no listing running")
        elif first is not record:
            self.fail("I2", f"cycle {cycle_id[:8]} of {backend_id} was fed by two listings (by {first.backend}"
                            f" and by {record.backend})")
        elif spec is None or record.scope != spec.listing_scope():
            self.fail("I2", f"cycle {cycle_id[:8]} of {backend_id} was fed by {record.backend}'s listing of"
                            f" {record.scope}, but its backend's row says"
                            f" {spec.listing_scope() if spec else 'nothing (no such backend)'}")
        self.checks["R2"] += 1
        if backend_id in self.off:
            self.fail("R2", f"backend {backend_id} is off, yet a listing fed its cycle {cycle_id[:8]}")

    # ---- hooks from the provider and the delivery loop ------------------------------

    def provider_call_started(self, cycle_id: str | None, group: ResourceGroup) -> None:
        self.checks["T1"] += 1
        if cycle_id is not None and (cycle_id, group.region) in self.tripped:
            self.fail("T1", f"cycle {cycle_id[:8]} called the provider in {group.region} after the region"
                            f" tripped (group {group.key})")
        self.checks["G1"] += 1
        if self.in_flight[group.provider_ref]:
            self.fail("G1", f"two deletes of ref {group.provider_ref} run at once ({group.key})")
        self.in_flight[group.provider_ref] += 1

    def provider_call_finished(self, group: ResourceGroup) -> None:
        self.in_flight[group.provider_ref] -= 1

    def provider_touched(self, cycle_id: str | None, group: ResourceGroup, touched: list[str],
                         before: dict[str, tuple[Any, ...]], retain_days: int | None) -> None:
        """What one group's deletion removed (moved to shutting-down or terminated)."""
        if not touched:
            return
        self.attributed.update(touched)
        self.checks["V1"] += 1
        world = self.sim.world.resources
        meta = self.sim.world.meta
        # The instance's own root volume, launched with it and still on it, goes with it (rule 15).
        own = {rid for rid in touched if (m := meta.get(rid)) is not None and m.origin == "root"
               and m.of_instance == group.primary_id and before[rid][2] == group.primary_id}
        if outside := sorted(set(touched) - set(group.resource_ids()) - own):
            self.fail("V1", f"a delete of {group.key} also removed {outside}, which are not members of the group"
                            f" ({', '.join(self._what(rid, before) for rid in outside)})")
        self.checks["K1"] += 1
        for rid in (rid for rid in touched if world[rid].kind is ResourceKind.SNAPSHOT):
            why = snapshot_untouchable(world[rid], retain_days)
            if why is not None:
                self.fail("K1", f"a delete of {group.key} removed snapshot {rid}: {why}")
        self.checks["J1"] += 1
        journaled = {t for (t,) in self.sim.admin.run(  # the call's target, or what it takes along (blast)
            "SELECT DISTINCT e.x FROM provider_journal j, LATERAL (SELECT j.target UNION ALL"
            " SELECT jsonb_array_elements_text(j.blast)) AS e(x)"
            " WHERE j.phase = 'intent' AND e.x = ANY(CAST(:t AS text[]))", t=touched)}
        if unrecorded := sorted(set(touched) - journaled):
            self.fail("J1", f"a delete of {group.key} removed {unrecorded} without a journal row")
        key = cycle_id or "?"
        self.touched_groups[key].add(group.key)
        row = self.cycles.get(key)
        self.checks["R1"] += 1
        if row is not None and row.mode == "report":
            self.fail("R1", f"report-mode cycle {key[:8]} touched {touched}")
        self.checks["R2"] += 1
        if row is None or row.mode != "delete":
            self.fail("R2", f"cycle {key[:8]} (recorded mode {row.mode if row else None}) touched {touched}")
        elif row.backend in self.off:
            self.fail("R2", f"cycle {key[:8]} touched {touched} after backend {row.backend} was switched off")

    def _what(self, rid: str, before: dict[str, tuple[Any, ...]]) -> str:
        r, m = self.sim.world.resources[rid], self.sim.world.meta.get(rid)
        return (f"{rid}: {r.kind.value} {m.origin if m else '?'}, tags {dict(before[rid][1])}, on"
                f" {before[rid][2]} at {r.device}")

    def delete_reaches(self, cycle_id: str | None, backend: Any, cloud: Any, group: ResourceGroup) -> None:
        """D1 (rule 18): a cycle's deletes go to the account its lease snapshotted, whatever
        the row says now."""
        if cycle_id is None:
            return
        if cycle_id not in self.snapshot_accounts:
            rows = self.sim.admin.run("SELECT backend_snapshot->>'account', backend_snapshot->'settings'->>'project'"
                                      " FROM cycles WHERE id = :c", c=cycle_id)
            self.snapshot_accounts[cycle_id] = (rows[0][1] or rows[0][0]) if rows else None
        account = self.snapshot_accounts[cycle_id]
        self.checks["D1"] += 1
        if account is not None and cloud.account != account:
            self.fail("D1", f"cycle {cycle_id[:8]} (its lease snapshotted account {account}) sent the delete of"
                            f" {group.key} to account {cloud.account}")

    def provider_acts(self, cycle_id: str | None, group: ResourceGroup | None, call: str, target: str,
                      named: str | None, cloud: Any) -> None:
        """Right before the cloud acts on one call for ``target`` (``named``: what the name
        the call takes names now): P3 and U1."""
        where = group.key if group is not None else "?"
        if call == "terminate" and named is not None:
            self.checks["P3"] += 1
            request = cloud.resources.get(cloud.resources[named].spot_request or "")
            if request is not None and request.persistent and request.state is not ResourceState.TERMINATED:
                self.fail("P3", f"a delete of {where} terminated {named} while its persistent spot request"
                                f" {request.id} was open: the request relaunches it (cancel it first)")
        if call == "detach":
            self.checks["U1"] += 1
            holder = cloud.resources.get(cloud.resources[target].attached_to or "")
            if holder is not None and holder.state is not ResourceState.TERMINATED:
                self.fail("U1", f"a delete of {where} detached {target} from {holder.id}, which is"
                                f" {holder.state.value} (never detach from a live instance)")

    def provider_removed(self, cycle_id: str | None, group: ResourceGroup | None, call: str, target: str,
                         removed: list[str], before: dict[str, tuple[Any, ...]]) -> None:
        """What one call removed: its target (read by id), what the provider takes along with
        it, and nothing else (N1: never what took its name since; U1: nothing in use)."""
        if not removed:
            return
        where = group.key if group is not None else "?"
        self.checks["N1"] += 1
        along = {rid for rid, (_state, on, auto) in before.items() if on == target and auto}
        if other := sorted(set(removed) - {target} - along):
            names = {rid: self.sim.world.resources[rid].name for rid in other}
            self.fail("N1", f"a delete of {where} addressed {target} (read by id) and removed {other} {names}"
                            " instead: the name it took names another resource now")
        self.checks["U1"] += 1
        world = self.sim.world.resources
        for rid in removed:
            on = before[rid][1]
            holder = world.get(on or "")
            if world[rid].used_by is not None or (
                    holder is not None and on != target and before[on][0] is not ResourceState.TERMINATED
                    and rid not in along and world[rid].kind is not ResourceKind.SPOT_REQUEST):
                self.fail("U1", f"a delete of {where} removed {rid}, in use by {world[rid].used_by or on}")

    def confirm_window(self, backend_id: str) -> int:
        """W1: a backend's confirmation window (rule 23) as the seed configured it: the stack's,
        lengthened by its row's ``confirm_seconds`` (a shorter one is ignored: rule 8)."""
        stack = self.sim.confirm_seconds
        spec = self.sim.spec_of(backend_id)
        own = spec.row_settings.get("confirm_seconds") if spec is not None and spec.broken is None else None
        return stack if own is None else max(stack, own)

    def _confirmed(self, cycle_id: str, group: ResourceGroup) -> None:
        """W1 (rule 23): the delete of ``group`` by ``cycle_id`` was confirmed by an earlier
        delete-mode listing of the cycle's backend, the window before, with no report-mode
        listing since (the cycle's backend and listing time as its row says, never the request's)."""
        rows = self.sim.admin.run("SELECT backend_id FROM cycles WHERE id = :c", c=cycle_id)
        if not rows:
            return
        window = self.confirm_window(rows[0][0])
        backend, listed_at, reason, verdict, confirmed_by = self.sim.admin.run(
            CONFIRMED_SQL, c=cycle_id, k=group.key, w=window)[0]
        self.checks["W1"] += 1
        if verdict != "orphan":
            self.fail("W1", f"cycle {cycle_id[:8]} of {backend} deleted {group.key}, which it classified"
                            f" {verdict or 'not at all'}")
        elif confirmed_by is None:
            self.fail("W1", f"cycle {cycle_id[:8]} of {backend} (listed {listed_at}) deleted {group.key}"
                            f" ({reason}) unconfirmed: no delete-mode listing of {backend} at least {window}s"
                            " before found it an orphan for that reason without a report-mode listing since")

    def delete_attempt(self, cycle_id: str | None, backend_id: str, cloud: Any, group: ResourceGroup) -> None:
        """P2: a provider delete of a primary whose protection a delete already found comes
        from a delete cycle (its re-read); ``protection_reported`` checks report cycles.
        W1: it was confirmed (``_confirmed``)."""
        if cycle_id is not None:
            self._confirmed(cycle_id, group)
        spec = self.sim.spec_of(backend_id)
        if spec is not None and spec.retired_from is not None:
            self.checks["E2"] += 1
            # as its cycle's lease found it (rule 18): the row may have lowered it since
            allowed = self.coverage_cycles.get(str(cycle_id), self.sim.coverage_may_delete(spec, self.ceiling))
            if not allowed:
                self.fail("E2", f"retired coverage {backend_id} of {spec.retired_from} (last mode {spec.mode},"
                                f" ceiling {self.ceiling}) deleted {group.key}: a coverage is report-only unless both"
                                " say delete")
        self.checks["M1"] += 1
        if self.ceiling == "report" and backend_id not in self.asked_delete:
            self.fail("M1", f"cycle {str(cycle_id)[:8]} of {backend_id} deleted {group.key} under a report ceiling"
                            " that no operator's one-off delete lifted")
        pid = group.primary_id
        found = self.protection_found.get((backend_id, pid)) if pid is not None else None
        if found is None or cycle_id is None:
            return
        self.checks["P2"] += 1
        row = self.cycles.get(cycle_id)
        if row is not None and row.mode != "delete":
            self.fail("P2", f"cycle {cycle_id[:8]} of {backend_id} ({row.mode}) tried to delete {pid}, which an"
                            " earlier delete found termination-protected")

    def protection_reported(self, finished: list[CycleRow]) -> None:
        """P2: a finished report cycle whose listing started after a delete recorded a
        termination protection classified that primary's group protected."""
        for row in finished:
            cid, listing = row.id, self.listings.get(row.id)
            if row.mode != "report" or listing is None:
                continue
            pids = [pid for (b, pid), found in self.protection_found.items()
                    if b == row.backend and listing.order > found
                    and (live := self.sim.world.resources.get(pid)) is not None and live.termination_protected]
            if not pids:
                continue
            self.checks["P2"] += 1
            for pid, verdict, reason in self.sim.admin.run(
                    "SELECT primary_id, verdict, reason FROM cycle_groups WHERE cycle_id = :c"
                    " AND primary_id = ANY(CAST(:p AS text[]))", c=cid, p=pids):
                if (verdict, reason) != ("protected", "termination_protection"):
                    self.fail("P2", f"report cycle {cid[:8]} of {row.backend} classified {pid} {verdict}/{reason},"
                                    " after an earlier delete found it termination-protected (forgot it)")

    def provider_answered(self, cycle_id: str | None, group: ResourceGroup, protection: str | None) -> None:
        """The last answer of a provider delete of ``group``: its protection, if protected."""
        if cycle_id is None:
            return
        if protection is None:
            self.protected_answers.pop((cycle_id, group.key), None)
        else:
            self.protected_answers[(cycle_id, group.key)] = protection

    def in_use_answered(self, cycle_id: str | None, group: ResourceGroup, in_use: list[str]) -> None:
        """The last answer of a provider delete of ``group``: the resources in use it named."""
        if cycle_id is None:
            return
        if in_use:
            self.in_use_answers[(cycle_id, group.key)] = in_use
        else:
            self.in_use_answers.pop((cycle_id, group.key), None)

    def delete_done(self, cycle_id: str, group: ResourceGroup) -> None:
        """P2, U2: a delete delivery returned; if its provider call answered protected or in
        use, how was it recorded?"""
        protection = self.protected_answers.pop((cycle_id, group.key), None)
        in_use = self.in_use_answers.pop((cycle_id, group.key), None)
        if protection is None and in_use is None:
            return
        rows = self.sim.admin.run("SELECT d.state, c.backend_id FROM delete_requests d JOIN cycles c"
                                  " ON c.id = d.cycle_id WHERE d.cycle_id = :c AND d.group_key = :k",
                                  c=cycle_id, k=group.key)
        if not rows:
            return
        state, backend = rows[0]
        if in_use is not None:
            self.checks["U2"] += 1
            if state == "failed":
                self.fail("U2", f"cycle {cycle_id[:8]}: the delete of {group.key} found {in_use} in use outside"
                                " the group, yet was recorded as a failed deletion (the backend fails by it)")
        if protection is None:
            return
        self.checks["P2"] += 1
        if state == "failed":
            self.fail("P2", f"cycle {cycle_id[:8]}: the delete of {group.key} found it protected ({protection}),"
                            " yet was recorded as a failed deletion")
        elif state == "skipped" and protection == "termination_protection" and group.primary_id is not None:
            self.protection_found.setdefault((backend, group.primary_id), next(self.order))

    def function_crashed(self, where: str, exc: BaseException, backends: set[str]) -> None:
        """X2 (rules 16, 20): a backend row whose settings cannot be read fails only its own
        backend's work: while one is broken, no function run for another backend raises
        (but for the faults the simulation injects: the database, the queues, forgeries)."""
        specs = {b: self.sim.spec_of(b) for b in self.sim.run_ids()}
        broken = {b for b, spec in specs.items() if spec is not None and spec.broken is not None}
        if not broken or type(exc).__name__ in BENIGN_CRASHES:
            return
        self.checks["X2"] += 1
        if healthy := sorted(backends - broken):
            self.fail("X2", f"{where} for {healthy} raised {type(exc).__name__}: {str(exc)[:160]}, while the"
                            f" settings of {sorted(broken)} are no JSON object (one bad row fails alone)")

    def region_tripped(self, cycle_id: str, region: str) -> None:
        self.tripped.add((cycle_id, region))

    def gate_refused(self, cycle_id: str, ref: str) -> None:
        self.checks["G2"] += 1
        # Gates are per account and ref (``Backend.scope``) of the cycle's backend (a
        # request's own backend field may be forged): find that scope first.
        rows = self.sim.admin.run(
            "SELECT holder FROM delete_gates g JOIN cycles c ON c.id = :c"
            " JOIN coverages() b ON b.id = c.backend_id AND g.backend_id = b.provider || ':' || b.account"
            " WHERE g.provider_ref = :r", c=cycle_id, r=ref)
        if not rows:
            self.fail("G2", f"a delete of ref {ref} was refused as gate-busy, but no gate of {ref} is held")

    def no_activity_skip(self, backend_id: str) -> None:
        """A1: STEP 1 decided there was nothing to list for ``backend_id``."""
        self.checks["A1"] += 1
        listed = self.clean_listed_at.get(backend_id)
        if listed is None:
            return
        # A retired coverage counts the activity of owners naming the backend it came from (rule 24).
        spec = self.sim.spec_of(backend_id)
        origin = spec.origin if spec is not None else backend_id
        late = [t for t, concerns in self.sim.platform.commit_times
                if t > listed and (concerns is None or backend_id in concerns or origin in concerns)]
        if late:
            self.fail("A1", f"STEP 1 skipped {backend_id}, but {len(late)} ledger write(s) concerning it committed"
                            f" after the listing behind clean_at (listed at {listed:%H:%M:%S}, first write"
                            f" committed {min(late):%H:%M:%S})")

    # ---- around a cleanup step -----------------------------------------------------------

    def before_step(self) -> dict[str, tuple[ResourceState, tuple[tuple[str, str], ...]]]:
        if self.gates_held and self.unshifted:
            shift_gates(self.sim.admin, self.unshifted)
        self.unshifted = 0
        if not self.fresh:
            self.cycles, self.clean_at = self.read_state()
            self.fresh = True
        self.reported = []
        self.attributed = set()
        return self.sim.world.snapshot()

    def after_step(self, before: dict[str, tuple[ResourceState, tuple[tuple[str, str], ...]]]) -> None:
        sim = self.sim
        # Moved to shutting-down or gone in this step (a shutting-down instance that finishes
        # was touched when it started shutting down, by a call or by the platform).
        touched = [rid for rid, r in sim.world.resources.items()
                   if r.state in TOUCHED and rid in before and before[rid][0] not in TOUCHED]
        primaries = {o.vm_of(o.tracked): o for o in sim.platform.owners
                     if o.committed in ("provisioning", "idle", "busy") and not o.soft_deleted}
        primaries.update({o.vm_of(o.tracked): o for o in sim.platform.vol_owners  # volume owners' volumes
                          if o.committed in ("provisioning", "active") and not o.soft_deleted})
        primaries.update({o.vm_of(o.tracked): o for o in sim.platform.world_owners  # the retire world's
                          if o.committed in ("provisioning", "idle", "busy") and not o.soft_deleted})
        for rid in (rid for rid in touched if rid not in self.people_removed):
            self.checks["X1"] += 1
            if rid in primaries:
                o = primaries[rid]
                self.fail("X1", f"{rid} is the primary of live owner {o.id} (backend {o.backend}), yet was touched")
            self.checks["S1-S3"] += 1
            why = sim.platform.untouchable(rid, dict(before[rid][1]))
            if why is not None:
                self.fail(why[0], why[1])
            self.checks["P1"] += 1
            res = sim.world.resources[rid]
            if res.controller is not None or res.protection is not None or res.termination_protected:
                what = res.controller or res.protection or "termination protection"
                self.fail("P1", f"{rid} is protected by rule 14 ({what}), yet was touched")
            if rid not in self.attributed and rid not in self.people_removed:
                self.fail("S2", f"{rid} changed state outside any provider delete call")
        after, clean_at = self.read_state()
        sim.coverages_now(self.coverage_ids)
        if any(r.outcome is not None and (cid not in self.cycles or self.cycles[cid].outcome is None)
               for cid, r in after.items()):
            self._forgotten_protections()  # a finishing cycle closes the orphan rows it did not list
            self.protection_reported([r for cid, r in after.items() if r.outcome is not None
                                      and (cid not in self.cycles or self.cycles[cid].outcome is None)])
        self._one_bad_group([r for cid, r in after.items() if r.outcome is not None
                             and (cid not in self.cycles or self.cycles[cid].outcome is None)])
        self._mode_ceiling(after)
        self._fencing(after)
        self._clean_at(after, clean_at)
        self._blast_radius()
        self.cycles = after

    def _mode_ceiling(self, after: dict[str, CycleRow]) -> None:
        """M1: a cycle started in this step runs in delete mode under a report ceiling only when an
        operator asked for a one-off delete of its backend (with rule 23, such a cycle may only mark)."""
        for cid, r in after.items():
            if cid in self.cycles:
                continue
            spec = self.sim.spec_of(r.backend)
            if spec is not None and spec.retired_from is not None:
                self.checks["E2"] += 1
                self.coverage_cycles[cid] = allowed = self.sim.coverage_may_delete(spec, self.ceiling)
                if r.mode == "delete" and not allowed:
                    self.fail("E2", f"cycle {cid[:8]} of retired coverage {r.backend} runs in delete mode (its"
                                    f" backend's last mode {spec.mode}, ceiling {self.ceiling}): rule 24 says report")
            self.checks["M1"] += 1
            if r.mode == "delete" and self.ceiling == "report" and r.backend not in self.asked_delete:
                self.fail("M1", f"cycle {cid[:8]} of {r.backend} runs in delete mode under a report ceiling"
                                " that no operator's one-off delete lifted")

    def _forgotten_protections(self) -> None:
        """P2 holds the product to a protection only while it remembers it: a complete
        listing that no longer lists the group closes its orphans row (``gone``), as after
        an operator removed its region from the backend; the next try is a new discovery."""
        if not self.protection_found:
            return
        gone = self.sim.admin.run("SELECT backend_id, primary_id FROM orphans WHERE state = 'gone'"
                                  " AND primary_id = ANY(CAST(:p AS text[]))",
                                  p=sorted({pid for _b, pid in self.protection_found}))
        for backend, pid in gone:
            self.protection_found.pop((backend, pid), None)

    def _one_bad_group(self, finished: list[CycleRow]) -> None:
        """O1 (rule 20): a group too large for one message even reduced fails alone: its
        region's failure is recorded, the region's other groups are classified, and neither
        the cycle nor another region fails for it; a group that fits once reduced is
        classified. Judged on what the simulation saw the listing yield (its own measure of
        each group), for cycles whose every batch was applied."""
        for row in finished:
            listing = self.listings.get(row.id)
            if listing is None or listing.crashed or row.id in self.sim.forged_group_cycles \
                    or any(region == "*" for region, _ in row.failure_list):
                continue
            self.checks["O1"] += 1
            anomalies = {region for region, error in row.failure_list if error.startswith("anomaly:")}
            causes = set(listing.failures) | anomalies | set(listing.huge) | listing.borderline
            if unexplained := sorted({f"{region}: {error[:120]}" for region, error in row.failure_list
                                      if region not in causes}):
                self.fail("O1", f"cycle {row.id[:8]} of {row.backend} recorded region failures its listing gives no"
                                f" cause for: {unexplained}")
            oversized = [region for region, _ in row.failure_list if region in listing.huge
                         and region not in listing.failures and region not in anomalies]
            if row.outcome == "failed" and (row.error or "").startswith("no region could be listed") and oversized:
                self.fail("O1", f"cycle {row.id[:8]} of {row.backend} failed for a group too large for a message"
                                f" in {oversized}: one bad group fails alone")
            if row.expected_batches is None or row.applied != row.expected_batches or listing.borderline:
                continue
            expected = sum(n - listing.huge.get(region, 0) for region, n in listing.region_groups.items()
                           if region not in anomalies)
            if row.groups_listed != expected:
                self.fail("O1", f"cycle {row.id[:8]} of {row.backend} classified {row.groups_listed} groups; its"
                                f" listing yielded {expected} that fit a message (too large even reduced:"
                                f" {listing.huge or 'none'}): a bad group took others with it")

    def _fencing(self, after: dict[str, CycleRow]) -> None:
        for cid, row in self.cycles.items():
            if not row.dead:
                continue
            self.checks["F1"] += 1
            now = after.get(cid)
            if now is not None and now.writes() != row.writes():
                self.fail("F1", f"cycle {cid[:8]} wrote after losing its lease: {row.writes()} -> {now.writes()}")
        for cid in self.reported:
            row = self.cycles.get(cid)
            self.checks["F1"] += 1
            if row is not None and row.dead:
                self.fail("F1", f"cycle {cid[:8]} reported an orphan after losing its lease")

    def _clean_at(self, after: dict[str, CycleRow], clean_at: dict[str, datetime | None]) -> None:
        newly = [r for cid, r in after.items()
                 if r.outcome == "clean" and (cid not in self.cycles or self.cycles[cid].outcome != "clean")]
        for row in newly:
            self.checks["C1"] += 1
            self._clean_facts(row)
        for backend in sorted(set(clean_at) | set(self.clean_at)):
            self._clean_at_of(backend, [r for r in newly if r.backend == backend], clean_at.get(backend))

    def _clean_at_of(self, backend: str, newly: list[CycleRow], clean_at: datetime | None) -> None:
        sim = self.sim
        before = self.clean_at.get(backend)
        if clean_at == before:
            return
        spec = sim.spec_of(backend)
        if clean_at is None and spec is not None and spec.gone:
            # Its cleanup row went with it: a removed backend, a retired coverage that retired (rule 24).
            self.clean_at.pop(backend, None)
            return
        self.checks["C1"] += 1
        if clean_at is None or (before is not None and clean_at <= before):
            self.fail("C1", f"clean_at of {backend} moved from {before} to {clean_at}")
        elif not newly:
            self.fail("C1", f"clean_at of {backend} moved to {clean_at} with no cycle finishing clean")
        else:
            def seen(r: CycleRow) -> datetime | None:
                """When the simulation saw the cycle list (its first provider call), else its row's listed_at."""
                listing = self.listings.get(r.id)
                at = listing.at if listing is not None and listing.at is not None else r.listed_at
                return min(at, r.listed_at) if at is not None and r.listed_at is not None else at

            best = max(newly, key=lambda r: seen(r) or datetime.min.replace(tzinfo=clean_at.tzinfo))
            listed = seen(best)
            if listed is None or clean_at > listed - timedelta(seconds=sim.margin):
                self.fail("C1", f"clean_at of {backend} {clean_at:%H:%M:%S} is past the listing time {listed}"
                                f" minus the margin ({sim.margin}s) (cycle {best.id[:8]}, its row says"
                                f" listed_at {best.listed_at})")
            if listed is not None:
                self.clean_listed_at[backend] = listed
        self.clean_at[backend] = clean_at

    def _clean_facts(self, row: CycleRow) -> None:
        listing = self.listings.get(row.id)
        problems = []
        if listing is None:
            problems.append("the simulation saw no listing for it")
        else:
            if listing.failures:
                problems.append(f"its listing failed in {listing.failures}")
            if listing.crashed:
                problems.append("its listing raised")
        if row.failures:
            problems.append(f"{row.failures} region failure(s) recorded")
        if row.skipped:
            problems.append(f"{row.skipped} group(s) skipped")
        if row.deletes_not_done:
            problems.append(f"{row.deletes_not_done} deletion(s) not done")
        if row.tripped:
            problems.append(f"regions tripped {row.tripped}")
        if row.blocked:
            problems.append("deletes blocked by the blast-radius cap")
        # The last answer per group counts: an error whose recording crashed is retried, and
        # the retry's confirmed deletion is what the cycle records (at-least-once delivery).
        # A protection a delete found is the group's verdict, not a failure (rule 14).
        bad = {g: a for g, a in self.results.get(row.id, {}).items() if a not in ("deleted", "protected")}
        if bad:
            problems.append(f"last provider answers {bad}")
        if problems:
            self.fail("C1", f"cycle {row.id[:8]} finished clean although " + "; ".join(problems))

    def _blast_radius(self) -> None:
        sim = self.sim
        for cid, groups in self.touched_groups.items():
            self.checks["B1"] += 1
            listing = self.listings.get(cid)
            listed = listing.groups if listing is not None else 0
            n = len(groups)
            if n > sim.max_deletes or (n > 10 and listed and n / listed > sim.max_delete_share):
                self.fail("B1", f"cycle {cid[:8]} touched {n} groups of {listed} listed"
                                f" (cap {sim.max_deletes}, share {sim.max_delete_share})")
