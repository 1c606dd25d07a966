"""Several backends and accounts, operators and forged messages (a mixin of
``Simulation``; issue #18).

Per seed (stream ``"<seed>:topology"``):

- the backend ``sim`` in account ``ACCOUNT`` (its ``SimCloud`` is ``sim.cloud``);
- sometimes ``sim-b``, a second backend of the same AWS account (same cloud,
  its own regions, owners the platform writes with ``backend_id = 'sim-b'``,
  its own cleanup cycles): each lists the other's VMs, which stay tracked;
- sometimes ``sim-c``, a third backend of the same account in the first one's
  regions, sometimes with other credentials (a ``role_arn``: the same account,
  yet a listing of its own);
- sometimes ``sim-fo``, a failover backend in ``FAILOVER_ACCOUNT`` (a second
  cloud): live owners move there (a new VM, ``backend_id``/``primary_id``
  rewritten) and their old VM stays in the first account, an orphan
  (``backend_mismatch``) of the first backend;
- listings shared by the tick (stream ``"<seed>:sharing"``): ``sim-b`` often in
  the first backend's regions, ``sim-fo`` often in them too (another account:
  it must never share their listing), operators' region edits joining and
  splitting them mid-run;
- sometimes a platform that writes ``backend_id = 'aws'``, which names no
  backend row (such owners are skipped, never orphans; the settle phase fixes
  the rows);
- an operator editing ``backends`` rows with plain SQL (regions added or
  removed, mode flipped, ``off`` included, the margin setting raised);
- credentials that reach another account for a while (``wrong_credentials``):
  the identity check fails the cycle, nothing is listed or deleted;
- the skew of the functions' own clock against the database (used only by the
  ``function_clock`` mutation: the product reads the database clock);
- forged queue messages (``message_forged``): an altered copy of a listing
  batch (mode flipped, backend switched, listed_at moved) or of a delete
  request (backend switched, a resource of another group added) injected next
  to the real one, which still flows. The product must refuse the copy;
- forged listing jobs (``job_forged``): a copy of a tick's job merged with
  another waiting job, naming another backend too (preferably of another
  account) or one backend fewer. A job is a hint: the lister re-applies STEP 1
  and regroups by the rows' listing keys.
"""

from __future__ import annotations

import json
import random
from collections import ChainMap
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import ResourceState, is_valid_ref
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch, ListingJob
from tests.sim.cloud import SimCloud, _resource, listing_scope
from tests.sim.owners import LIVE, PROTECT, PROTECT_B, PROTECT_KEYS, TAG
from tests.sim.world import (
    ACCOUNT,
    BACKEND,
    BACKEND_B,
    BACKEND_C,
    BACKEND_FO,
    FAILOVER_ACCOUNT,
    MARGIN,
    STRANGER_ACCOUNT,
    stream,
)

if TYPE_CHECKING:
    from tests.sim.engine import Simulation

ALL_REGIONS = ("r1", "r2", "r3")
#: Other credentials of the first account (``sim-c`` sometimes): same account, another listing.
OTHER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/oc-lister-c"


@dataclass
class BackendSpec:
    id: str
    account: str
    regions: tuple[str, ...]  # the regions the platform creates in (the row's original regions)
    mode: str
    settings: dict[str, Any] = field(default_factory=dict)
    row_regions: tuple[str, ...] = ()  # the row as the operator left it
    row_settings: dict[str, Any] = field(default_factory=dict)
    broken: str | None = None  # settings that are no JSON object, while the row holds them (the settings world)
    configured_account: str = ""  # the account it was set up with (the moves world moves the row)
    # A retired coverage (rule 24): the backend it came from and why ('removed' | 'moved'); gone:
    # a coverage that retired itself, or a backend whose row was deleted.
    retired_from: str | None = None
    why: str | None = None
    gone: bool = False

    @property
    def origin(self) -> str:
        """The backend id owners name for what this covers (its own, or the one it came from)."""
        return self.retired_from or self.id

    def row(self) -> RowState:
        """Its row as the simulation last wrote it (what a trigger sees as OLD next time)."""
        settings = json.loads(self.broken) if self.broken is not None else dict(self.row_settings)
        return RowState(self.account, tuple(self.row_regions), self.mode, settings)

    @property
    def credentials(self) -> tuple[str, str | None]:
        """The account and role its row lists with (what a wrong-credentials spell hits)."""
        return self.account, self.row_settings.get("role_arn")

    def listing_scope(self) -> tuple[object, ...]:
        """What a listing feeding this backend's cycle must cover, as its row is now (I2)."""
        return listing_scope(self.account, self.row_regions, TAG, self.row_settings.get("protect_tag_key", PROTECT),
                             self.row_settings.get("role_arn"))


@dataclass(frozen=True)
class RowState:
    """A ``backends`` row: what rule 24's trigger reads as OLD and NEW."""

    account: str
    regions: tuple[str, ...]
    mode: str
    settings: Any


def predict_coverage(old: RowState, new: RowState | None) -> tuple[str, tuple[str, ...], str, str] | None:
    """The retired coverage a statement taking ``old`` to ``new`` (None: a DELETE) leaves, as
    rule 24 says (account, regions, the row's last mode, why), or None. Every row here is AWS:
    its scope is its account. Added regions and changes of mode or of settings within the
    account leave none."""
    if new is None or new.account != old.account:
        gone = tuple(sorted(old.regions))
    else:
        gone = tuple(sorted(set(old.regions) - set(new.regions)))
    if not gone:
        return None
    return old.account, gone, old.mode, "removed" if new is None else "moved"


def lowered(mode: str | None, row_mode: str | None) -> str | None:
    """A retired coverage's mode as its backend's row lowers it (rule 24: never raises it)."""
    if row_mode == "off":
        return "off"
    if row_mode == "report" and mode != "off":
        return "report"
    return mode


class AllClouds:
    """Read-only view of every cloud of the run (resource ids never collide)."""

    def __init__(self, clouds: dict[str, SimCloud]) -> None:
        self.clouds = clouds

    @property
    def resources(self) -> ChainMap:
        return ChainMap(*(c.resources for c in self.clouds.values()))

    @property
    def meta(self) -> ChainMap:
        return ChainMap(*(c.meta for c in self.clouds.values()))

    def exists(self, rid: str) -> bool:
        return any(c.exists(rid) for c in self.clouds.values())

    def of(self, rid: str) -> SimCloud:
        return next(c for c in self.clouds.values() if rid in c.resources)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.clouds.values():
            out.update(c.snapshot())
        return out

    def __iter__(self) -> Iterator[SimCloud]:
        return iter(self.clouds.values())


class Backends:
    def setup_backends(self: Simulation, regions: tuple[str, ...]) -> None:
        topo = stream(self.seed, "topology")
        self.clouds = {ACCOUNT: self.cloud}
        self.world = AllClouds(self.clouds)
        # sim's own confirmation window (rule 23) in some seeds (engine.py; W1 reads the row's)
        own = {} if self.confirm_row is None else {"confirm_seconds": self.confirm_row}
        self.backends: dict[str, BackendSpec] = {BACKEND: BackendSpec(BACKEND, ACCOUNT, regions, self.mode, own)}
        roll = topo.random()
        shared, failover = roll < 0.3 or roll > 0.85, 0.55 < roll
        if shared:
            regs = tuple(sorted(topo.sample(ALL_REGIONS, topo.randint(1, 3))))
            # its own protect key half the time (rule 16; a stream of its own: the other
            # draws of a seed stay as they were)
            keys = {"protect_tag_key": PROTECT_B} if stream(self.seed, "protect-keys").random() < 0.5 else {}
            self.backends[BACKEND_B] = BackendSpec(BACKEND_B, ACCOUNT, regs, self.mode, keys)
        if failover:
            self.clouds[FAILOVER_ACCOUNT] = SimCloud(FAILOVER_ACCOUNT, id_base=0x40000000)
            regs = tuple(sorted(topo.sample(ALL_REGIONS, topo.randint(1, 2))))
            self.backends[BACKEND_FO] = BackendSpec(BACKEND_FO, FAILOVER_ACCOUNT, regs, self.mode)
            self.rates["failover"] = topo.choice((0.05, 0.1, 0.2))
        self._sharing(stream(self.seed, "sharing"), regions)
        if topo.random() < 0.2:
            self.rates["unknown_backend"] = topo.choice((0.1, 0.3))
        if topo.random() < 0.4:
            self.rates["backend_edit"] = topo.choice((0.05, 0.1))
        if topo.random() < 0.15:  # a backend switched off from the start (the settle phase turns it on)
            off = topo.choice(sorted(self.backends))
            self.backends[off].mode = "off"
            if off == BACKEND:
                self.mode = "off"
            self.rates["mode_override"] = max(self.rates.get("mode_override", 0.0), 0.1)
        if topo.random() < 0.2:
            self.rates["wrong_credentials"] = topo.choice((0.05, 0.15))
        # The account wrong credentials reach: the other cloud of the run, or a stranger's.
        self.clouds.setdefault(STRANGER_ACCOUNT, SimCloud(STRANGER_ACCOUNT, id_base=0x80000000))
        self.wrong_until: dict[tuple[str, str | None], int] = {}  # credentials -> until step
        # The functions' clock against the database's (the function_clock mutation's world):
        # sometimes well past the margin, either way.
        self.skew = topo.choice((0, 5, -5, 30, -90, MARGIN + 60, MARGIN * 3, -(MARGIN * 3)))
        self.world_backends(regions)
        self.coverages: dict[str, BackendSpec] = {}  # every retired coverage of the run, by id (rule 24)
        self.removed: dict[str, BackendSpec] = {}  # backends whose rows were deleted
        for b in self.backends.values():
            b.row_regions, b.row_settings = b.regions, dict(b.settings)
            self.admin.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                           " VALUES (:i, 'aws', :a, CAST(:r AS text[]), CAST(:s AS jsonb), :m)",
                           i=b.id, a=b.account, r=list(b.regions), s=json.dumps(b.settings), m=b.mode)
        self.rows: dict[str, RowState] = {b.id: b.row() for b in self.backends.values()}
        self.checker.set_off({b.id for b in self.backends.values() if b.mode == "off"})

    def _sharing(self: Simulation, rng: random.Random, regions: tuple[str, ...]) -> None:
        """Backends the tick lists together (same account, regions and credentials), and
        some that look alike but must not share (other credentials, another account)."""
        if BACKEND_B in self.backends and rng.random() < 0.5:
            self.backends[BACKEND_B].regions = regions
        if BACKEND_FO in self.backends and rng.random() < 0.5:
            self.backends[BACKEND_FO].regions = regions
        if rng.random() < 0.35:
            settings = {"role_arn": OTHER_ROLE} if rng.random() < 0.35 else {}
            self.backends[BACKEND_C] = BackendSpec(BACKEND_C, ACCOUNT, regions, self.mode, settings)

    def spec_of(self: Simulation, bid: str) -> BackendSpec | None:
        """A backend's spec, a retired coverage's (rule 24), or a removed backend's."""
        return self.backends.get(bid) or self.coverages.get(bid) or self.removed.get(bid)

    def gone(self: Simulation, bid: str) -> bool:
        """A removed backend, or a retired coverage that retired itself (or an unknown id)."""
        spec = self.spec_of(bid)
        return spec is None or spec.gone

    def coverage_mode(self: Simulation, spec: BackendSpec) -> str | None:
        """A retired coverage's mode now: its own, lowered by its backend's row while it exists."""
        live = self.backends.get(spec.retired_from or "")
        return lowered(spec.mode, live.mode) if live is not None else spec.mode

    def coverage_may_delete(self: Simulation, spec: BackendSpec, ceiling: str) -> bool:
        """A retired coverage deletes only when its mode and the stack's ceiling say delete (rule 24)."""
        return self.coverage_mode(spec) == "delete" and ceiling == "delete"

    def coverages_off(self: Simulation, bid: str) -> None:
        """R2: the live retired coverages of ``bid`` whose mode is off now are never listed."""
        for c in self.coverages.values():
            if c.retired_from == bid and not c.gone:
                (self.checker.off.add if self.coverage_mode(c) == "off" else self.checker.off.discard)(c.id)

    def live_coverages(self: Simulation) -> list[str]:
        """The retired coverages whose rows are there now (the tick runs them)."""
        return sorted(c for c, spec in self.coverages.items() if not spec.gone)

    def run_ids(self: Simulation) -> list[str]:
        """Everything the tick runs: the backends and the live retired coverages."""
        return sorted([*self.backends, *self.live_coverages()])

    @property
    def home_backends(self: Simulation) -> list[str]:
        """The backends the platform provisions new owners into (the first account's)."""
        return [b for b in (BACKEND, BACKEND_B, BACKEND_C) if b in self.backends]

    def cloud_for(self: Simulation, backend: Backend) -> SimCloud:
        """The cloud a backend's credentials reach: its configured account's, unless
        those credentials (account and role, shared by the backends listed together)
        are wrong for now (another account)."""
        right = self.clouds[backend.account]
        if self.wrong_until.get((backend.account, backend.settings.role_arn), 0) > self.trace.step \
                and self.dice.enabled:
            return next(c for a, c in sorted(self.clouds.items()) if a != backend.account)
        return right

    def credentials_spell(self: Simulation, bid: str) -> None:
        spec = self.spec_of(bid)
        if spec is None:
            return
        creds = spec.credentials
        if self.wrong_until.get(creds, 0) <= self.trace.step and self.dice.roll("wrong_credentials"):
            self.wrong_until[creds] = self.trace.step + self.rng_sched.randint(2, 12)
            self.trace(f"operator: {bid}'s credentials reach another account until step {self.wrong_until[creds]}")

    # ---- the operator: plain SQL on backends rows ------------------------------------

    def edit_backend_row(self: Simulation, bid: str, label: str, assignment: str, **params: Any) -> None:
        """Plain SQL on a row (the caller already updated its spec, but for the mode); a retired
        coverage it leaves is predicted and checked (rule 24, E1)."""
        spec = self.backends[bid]
        old = self.rows[bid]
        self.admin.run(f"UPDATE backends SET {assignment} WHERE id = :b", b=bid, **params)
        self.platform.commit_times.append((self.clock(), frozenset({bid})))
        if "m" in params:
            spec.mode = params["m"]
            self.checker.mode_set(bid, params["m"])
        self.rows[bid] = spec.row()
        self.trace(f"operator: backend {bid} {label}")
        self.coverage_taken_over(bid, self.rows[bid])
        self.coverage_left(bid, old, self.rows[bid])
        self.coverages_off(bid)

    def remove_backend_row(self: Simulation, bid: str, label: str) -> None:
        """The platform deletes a backend's row with plain SQL (rule 24: what it covered stays
        listed as a retired coverage, unless it was off)."""
        spec = self.backends[bid]
        for c in self.coverages.values():  # the row's last mode keeps lowering them (rule 24)
            if c.retired_from == bid and not c.gone:
                c.mode = lowered(c.mode, spec.mode)
        self.backends.pop(bid)
        old = self.rows.pop(bid)
        self.admin.run("DELETE FROM backends WHERE id = :b", b=bid)
        self.platform.commit_times.append((self.clock(), frozenset({bid})))
        spec.gone = True
        self.removed[bid] = spec
        self.checker.off.discard(bid)
        self.trace(f"platform: backend {bid} {label} (DELETE FROM backends)")
        self.coverage_left(bid, old, None)

    def coverage_taken_over(self: Simulation, bid: str, new: RowState) -> None:
        """E1 (rule 24): a backend that lists its own retired coverage's account and regions again
        takes them over; a coverage left with none retires at once. The database must agree."""
        for c in self.coverages.values():
            if c.retired_from != bid or c.gone or c.account != new.account or not set(c.regions) & set(new.regions):
                continue
            c.regions = c.row_regions = tuple(r for r in c.regions if r not in new.regions)
            self.checker.checks["E1"] += 1
            rows = self.admin.run("SELECT regions FROM retired_coverages WHERE id = :c", c=c.id)
            if not c.regions:
                c.gone = True
                self.checker.off.discard(c.id)
                self.trace(f"rule 24: {bid} lists retired coverage {c.id}'s regions again: it retired")
                if rows:
                    self.checker.fail("E1", f"{bid} lists all of retired coverage {c.id}'s regions again, yet it stays")
            elif [tuple(sorted(r[0] or ())) for r in rows] != [tuple(sorted(c.regions))]:
                self.checker.fail("E1", f"{bid} lists some of retired coverage {c.id}'s regions again: it should"
                                        f" keep {list(c.regions)}, yet the database has {rows}")

    def coverage_left(self: Simulation, bid: str, old: RowState, new: RowState | None) -> None:
        """E1 (rule 24): right after its own statement on ``bid``'s row, the simulation reads the
        retired coverages it did not know and holds them to its prediction: one row with the old
        account, the regions no longer covered, the old settings, the mode the old one implies
        and why, or none. A coverage found is registered under the id the product gave it."""
        expected = predict_coverage(old, new)
        rows = self.admin.run("SELECT id, backend_id, provider, account, regions, settings::text, mode, why"
                              " FROM retired_coverages WHERE NOT (id = ANY(CAST(:k AS text[]))) ORDER BY id",
                              k=sorted(self.coverages))
        self.checker.checks["E1"] += 1
        if expected is None:
            if rows:
                self.checker.fail("E1", f"the edit of {bid} ({old} -> {new}) should leave no retired coverage,"
                                        f" yet left {rows}")
            return
        account, regions, mode, why = expected
        want = [bid, "aws", account, regions, old.settings, mode, why]
        found = [r for r in rows if [r[1], r[2], r[3], tuple(sorted(r[4] or ())),
                                     json.loads(r[5]), r[6], r[7]] == want]
        if len(rows) != 1 or not found:
            self.checker.fail("E1", f"the {'deletion' if new is None else 'edit'} of {bid} should leave one retired"
                                    f" coverage {want}, yet left {rows or 'none'}")
        # The coverage is registered under the id the product gave it; a missing one (E1 failed)
        # under a placeholder id, gone at once: L2 still judges what it should have covered.
        cid = (found or rows)[0][0] if rows else f"{bid}~missing-{len(self.coverages) + 1}"
        spec = BackendSpec(cid, account, regions, mode, old.settings if isinstance(old.settings, dict) else {},
                           row_regions=regions,
                           row_settings=dict(old.settings) if isinstance(old.settings, dict) else {},
                           broken=None if isinstance(old.settings, dict) else json.dumps(old.settings),
                           configured_account=account, retired_from=bid, why=why, gone=not rows)
        self.coverages[cid] = spec
        if self.coverage_mode(spec) == "off" and not spec.gone:
            self.checker.off.add(cid)
        self.trace(f"rule 24: {bid} leaves retired coverage {cid} ({why}: {account} {list(regions)}, {mode})")

    def coverages_now(self: Simulation, ids: set[str]) -> None:
        """The retired coverages the database holds after a step of the cleanup: one that is
        gone retired itself, which only a clean cycle of it may do (E1)."""
        for cid in self.live_coverages():
            if cid in ids:
                continue
            spec = self.coverages[cid]
            spec.gone = True
            rows = self.admin.run("SELECT c.outcome, c.backend_id FROM events e JOIN cycles c ON c.id = e.cycle_id"
                                  " WHERE e.kind = 'coverage_retired' AND e.backend_id = :b", b=cid)
            self.checker.checks["E1"] += 1
            if not any(outcome == "clean" and backend == cid for outcome, backend in rows):
                self.checker.fail("E1", f"retired coverage {cid} of {spec.retired_from} is gone without a clean cycle"
                                        f" of it retiring it (events {rows})")
            self.trace(f"rule 24: retired coverage {cid} retired itself")
        if unknown := sorted(ids - set(self.coverages)):
            self.checker.checks["E1"] += 1
            self.checker.fail("E1", f"retired coverages {unknown} appeared without a statement of the simulation")

    def operator_edit(self: Simulation) -> None:
        """An operator edits a backend row mid-run (regions, mode incl. off, margin)."""
        self.dice.counts["backend_edit"] += 1
        rng = self.rng_platform
        b = self.backends[rng.choice(sorted(self.backends))]
        kind = rng.choice(("regions", "mode", "mode", "margin"))
        if kind == "regions":
            missing = [r for r in ALL_REGIONS if r not in b.row_regions]
            if missing and (len(b.row_regions) == 1 or rng.random() < 0.5):
                regs = tuple(sorted((*b.row_regions, rng.choice(missing))))
            elif len(b.row_regions) > 1:
                gone = rng.choice(b.row_regions)  # drawn once: never every region (a row lists at least one)
                regs = tuple(r for r in b.row_regions if r != gone)
            else:
                return
            b.row_regions = regs
            self.edit_backend_row(b.id, f"regions -> {list(regs)}", "regions = CAST(:r AS text[])", r=list(regs))
        elif kind == "mode":
            mode = rng.choice([m for m in ("delete", "report", "off") if m != b.mode])
            self.set_mode(mode, b.id)
        else:  # only ever raised: the checker's C1 uses the run's margin as the lower bound
            b.row_settings = {**b.row_settings, "margin_seconds": rng.choice((MARGIN, MARGIN + 60, MARGIN * 2))}
            self.edit_backend_row(b.id, f"settings -> {b.row_settings}", "settings = CAST(:s AS jsonb)",
                                  s=json.dumps(b.row_settings))

    def restore_backends(self: Simulation) -> None:
        """The settle phase: every row back to its configuration, in the seed's final mode."""
        self.wrong_until.clear()
        self.restore_worlds()
        for b in self.backends.values():
            if b.row_regions != b.regions:
                b.row_regions = b.regions
                self.edit_backend_row(b.id, f"regions restored {list(b.regions)}", "regions = CAST(:r AS text[])",
                                      r=list(b.regions))
            if b.row_settings != b.settings:
                b.row_settings = dict(b.settings)
                self.edit_backend_row(b.id, "settings restored", "settings = CAST(:s AS jsonb)",
                                      s=json.dumps(b.settings))
            if b.mode != self.final_mode:
                self.set_mode(self.final_mode, b.id)

    # ---- forged messages --------------------------------------------------------------

    def _other_backend(self: Simulation, bid: str) -> str | None:
        spec = self.spec_of(bid)
        same = [b for b, s in self.backends.items() if b != bid and spec is not None and s.account == spec.account]
        other = same or [b for b in self.backends if b != bid]
        return self.rng_cloud.choice(sorted(other)) if other else None

    def forge_batch(self: Simulation, body: str) -> str | None:
        batch = ListingBatch.model_validate_json(body)
        rng = self.rng_cloud
        if batch.mode != "report" and rng.random() < 0.4:
            return None
        kind = "mode" if batch.mode == "report" and rng.random() < 0.7 else rng.choice(("mode", "listed_at", "backend"))
        if kind == "backend" and (other := self._other_backend(batch.backend)) is not None:
            forged = batch.model_copy(update={"backend": other})
        elif kind == "listed_at" or kind == "backend":
            shift = rng.choice((-1, 1)) * rng.randint(60, 900)
            forged = batch.model_copy(update={"listed_at": batch.listed_at + timedelta(seconds=shift)})
        else:
            forged = batch.model_copy(update={"mode": "report" if batch.mode == "delete" else "delete"})
        self.dice.counts[f"message_forged:batch_{kind}"] += 1
        self.trace(f"queue: forged copy of batch {batch.seq} of {batch.cycle_id[:8]} ({kind})")
        return forged.model_dump_json()

    def forge_job(self: Simulation, body: str) -> str | None:
        job = ListingJob.model_validate_json(body)
        rng = self.rng_cloud
        named = list(job.backends)
        others = [b for b in sorted(self.backends) if b not in named]
        # The backends of another job of the same tick were due too: a merged copy is the
        # forgery most likely to start backends of other scopes together.
        waiting = sorted({b for m in self.jobs_q.messages for b in ListingJob.model_validate_json(m.body).backends}
                         - set(named))
        if waiting and rng.random() < 0.6:
            named = [*waiting, *named] if rng.random() < 0.5 else [*named, *waiting]
            kind, what = "merged", f"+ {waiting}"
        elif others and (len(named) == 1 or rng.random() < 0.7):
            first = self.spec_of(named[0])
            account = first.account if first is not None else None
            pool = [b for b in others if self.backends[b].account != account] or others
            extra = rng.choice(pool)
            named.insert(rng.randint(0, len(named)), extra)
            kind, what = "added", f"+ {extra}"
        elif len(named) > 1:
            gone = named.pop(rng.randrange(len(named)))
            kind, what = "dropped", f"- {gone}"
        else:
            return None
        self.dice.counts[f"job_forged:{kind}"] += 1
        self.trace(f"queue: forged copy of job {list(job.backends)} ({what})")
        return ListingJob(backends=tuple(named)).model_dump_json()

    def forge_request(self: Simulation, body: str) -> str | None:
        req = DeleteRequest.model_validate_json(body)
        rng = self.rng_cloud
        other = self._other_backend(req.backend)
        if other is not None and rng.random() < 0.25:
            self.dice.counts["request_forged:backend"] += 1
            self.trace(f"queue: forged copy of delete {req.group.key} (backend -> {other})")
            return req.model_copy(update={"backend": other}).model_dump_json()
        extra = self._extra_resource(req)
        if extra is None:
            return None
        group = req.group.model_copy(update={"resources": (*req.group.resources, extra)})
        self.dice.counts["request_forged:resources"] += 1
        self.trace(f"queue: forged copy of delete {req.group.key} (+ {extra.id})")
        return req.model_copy(update={"group": group}).model_dump_json()

    def _extra_resource(self: Simulation, req: DeleteRequest) -> Any:
        """A resource of another group of the same ref, else the VM of a live owner."""
        ids = set(req.group.resource_ids())
        spec = self.spec_of(req.backend)
        cloud = self.clouds[spec.account] if spec is not None else self.cloud
        alive = [r for r in cloud.resources.values() if r.state is not ResourceState.TERMINATED and r.id not in ids]
        primaries = {o.vm_of(o.tracked) for o in self.platform.owners if o.committed in LIVE}
        same = [r for r in alive if r.tags.get(TAG) == req.group.provider_ref]
        # The most harmful first: the live owner's own VM, a protected resource, then any.
        protected = [r for r in same if not PROTECT_KEYS.isdisjoint(r.tags)]
        pool = ([r for r in same if r.id in primaries] or protected or same
                or [r for r in alive if is_valid_ref(r.tags.get(TAG)) and r.id in primaries])
        return _resource(self.rng_cloud.choice(sorted(pool, key=lambda r: r.id))) if pool else None
