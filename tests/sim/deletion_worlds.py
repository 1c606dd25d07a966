"""The deletion's worlds (SAFETY.md rules 15, 18, 20 and 21): what makes each check of the
one deletion algorithm matter. ``Worlds`` is a mixin of ``Simulation`` (setup, listing
forgeries, operators), ``WorldPeople`` one of ``Platform`` (history, people).

Each world is on in a share of the seeds and draws only from streams of its own
(``"<seed>:<world>"`` for its choices, ``"<seed>:<world>:faults"`` for its dice), so the
other streams draw as before and a seed without a world runs as it did:

- ``names`` (rule 21): a name is reused between a deletion's read and its call. People
  arm a hook on a resource named by a message in flight; right after the deletion reads
  it by id, it is renamed (``instances.setName``) or deleted by its owner, and a new
  resource takes its name: someone else's, protected, or (of a finished owner) the same
  template. The memory cloud's delete calls address names, as GCP's do;
- ``swap`` (rule 15): every instance has its own root volume (no ref tag, deleted with it,
  attached at launch); people stop an instance and swap its root for a volume of theirs,
  attached later with delete-on-termination;
- ``inuse`` (rule 15): people attach an orphan's detached volume to an instance of theirs,
  now or right after a deletion read it (the delete call then meets ``ResourceInUse``);
- ``ages`` (rule 15): the backends of the first account keep snapshots for a retention;
  the deleter's own snapshots of finished owners' volumes are old (listed, deleted), young
  (never listed) or used by an image; backups carry refs too; a forged listing batch adds a
  young snapshot of ours, claimed old;
- ``spot`` (rule 14/15): some of the platform's VMs are spot instances whose request (a
  member of the group) is persistent: it relaunches its instance unless cancelled first;
- ``settings`` (rule 16/20): a backend row's settings become a value that is not a JSON
  object for a while (a platform bug), then are fixed;
- ``moves`` (rule 18): ``sim-d``, a backend of the first account without owners of its
  own, has its row moved to another account for a while and back;
- ``bulk`` (rule 20): people tag volumes with a finished owner's ref: a few with large
  tags (a group too large for a message until reduced), or so many that even reduced the
  group is too large (its region fails, alone);
- ``forge2`` (rule 21): a forged copy of a listing batch alters every field but the ids
  (details, attachments, creation times, states, sizes, tags, controllers, protections);
- ``volumes`` (C1 volume owners, rules 1/17/21; ``volume_owners.py``): the platform also
  provisions standalone volume owners (a ``volumes`` row each), with lost attempts, crashes
  before recording, hard-deleted placeholders, volumes left behind, and people attaching a
  volume owner's volume to an instance of theirs.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind, ResourceState, is_valid_ref
from orphan_cleanup.core.messages import ListingBatch
from orphan_cleanup.providers.operations import AT_LAUNCH
from tests.sim.cloud import ENVELOPE, GONE, ResMeta, SimCloud
from tests.sim.owners import LISTING_LAG_MAX, PROTECT, PROTECT_KEYS, TAG
from tests.sim.world import ACCOUNT, STRANGER_ACCOUNT, Dice, stream
from tests.support.memory_cloud import ROOT_DEVICE

if TYPE_CHECKING:
    from tests.sim.engine import Simulation
    from tests.sim.platform import Platform

#: world -> share of the seeds it is on in.
SHARES = {"names": 0.35, "swap": 0.35, "inuse": 0.35, "ages": 0.35, "spot": 0.35, "settings": 0.3,
          "moves": 0.3, "bulk": 0.35, "forge2": 0.35, "modes": 0.35, "volumes": 0.35, "retire": 0.35}
BACKEND_D = "sim-d"
#: Values of ``backends.settings`` that are no JSON object (as jsonb literals), a JSON string
#: whose text is no JSON (``'"oops"'``, the product bug in README findings, fixed) included.
#: A JSON string whose text is an object (double-encoded) is not here: the product decodes
#: it and reads the object inside as the row's settings.
BROKEN_SETTINGS = ("null", "[]", "42", '["orphan-cleanup-protect"]', '"oops"')


@dataclass
class World:
    name: str
    on: bool
    rng: random.Random
    dice: Dice


def young(snap: Any, retain: int | None, now: datetime | None = None) -> bool:
    return retain is not None and snap.created_at > (now or datetime.now(UTC)) - timedelta(days=retain)


def ours(snap: Any) -> bool:
    """A snapshot the deleter took itself, on the simulation's own reading."""
    ref, source = snap.tags.get(TAG), snap.source_id
    return bool(ref) and bool(source) and snap.tags.get(SNAPSHOT_SOURCE_KEY) == source \
        and snap.name == f"oc-{ref}-{source}"


class Worlds:
    """The simulation's side of the deletion's worlds."""

    def setup_worlds(self: Simulation) -> None:
        self.worlds: dict[str, World] = {}
        for name, share in SHARES.items():
            rng = stream(self.seed, name)
            self.worlds[name] = World(name, rng.random() < share, rng,
                                      Dice(stream(self.seed, f"{name}:faults"), self.rates, self.dice.counts))
        rates = {"names": ("user_reuse_name", (0.3, 0.6)), "swap": ("user_swap_root", (0.2, 0.4)),
                 "inuse": ("user_borrow_volume", (0.2, 0.4)), "ages": ("snapshot_forged_young", (0.25, 0.5)),
                 "settings": ("settings_broken", (0.05, 0.1)), "moves": ("backend_moved", (0.05, 0.1)),
                 "bulk": ("user_inflate_group", (0.2, 0.4)), "forge2": ("message_forged2", (0.25, 0.5)),
                 "modes": ("message_forged_mode", (0.25, 0.5))}
        for name, (kind, choices) in rates.items():
            w = self.worlds[name]
            if w.on:
                self.rates[kind] = w.rng.choice(choices)
        if self.worlds["ages"].on:
            self.rates["user_deregister_image"] = 0.05
        if self.worlds["volumes"].on:  # volume owners (volume_owners.py)
            w = self.worlds["volumes"]
            self.rates["volume_owner_action"] = w.rng.choice((0.3, 0.5))
            self.rates["volume_create_timeout"] = w.rng.choice((0.15, 0.3))
            self.rates["volume_crash_after_create"] = w.rng.choice((0.05, 0.15))
            self.rates["volume_left_behind"] = w.rng.choice((0.1, 0.3))
            self.rates["user_attach_owner_volume"] = w.rng.choice((0.01, 0.03))
        self.retain_days = self.worlds["ages"].rng.choice((7, 30)) if self.worlds["ages"].on else None
        self.forged_group_cycles: set[str] = set()  # cycles a forged batch with another group count was sent to
        # backend -> the young snapshot its forger claims old: the same one on every forged batch
        # while it qualifies (a forger that changed its claim each time would never get past the mark, rule 23)
        self.forged_snapshot: dict[str, str] = {}
        self.forged_mode: set[str] = set()  # backends whose report-mode batches the modes forger says delete
        self.broken_until: dict[str, int] = {}  # backend -> step its broken settings are fixed
        self.moved_until = 0

    def on(self: Simulation, name: str) -> bool:
        return self.worlds[name].on

    def world_backends(self: Simulation, regions: tuple[str, ...]) -> None:
        """Before the rows are written: ``sim-d`` (moves) and the retention (ages)."""
        from tests.sim.backends import BackendSpec

        if self.on("moves"):
            self.backends[BACKEND_D] = BackendSpec(BACKEND_D, ACCOUNT, regions, self.mode)
        self.retire_backends()  # the retire world (retire.py)
        if self.retain_days is not None:
            for b in self.backends.values():
                if b.account == ACCOUNT:
                    b.settings = {**b.settings, "retain_snapshots_days": self.retain_days}
        for b in self.backends.values():
            b.configured_account = b.account

    def world_queues(self: Simulation) -> None:
        if self.on("forge2"):
            self.listing_q.extra_forgers.append((self.worlds["forge2"].dice, "message_forged2", self.forge_everything))
        if self.on("ages"):
            self.listing_q.extra_forgers.append((self.worlds["ages"].dice, "snapshot_forged_young",
                                                 self.forge_young_snapshot))
            self.listing_q.persistent["snapshot_forged_young"] = self.forging_young_snapshot
        if self.on("modes"):
            self.listing_q.extra_forgers.append((self.worlds["modes"].dice, "message_forged_mode", self.forge_mode))
            self.listing_q.persistent["message_forged_mode"] = \
                lambda body: ListingBatch.model_validate_json(body).backend in self.forged_mode
        for cloud in self.clouds.values():
            cloud.roots = self.on("swap")
            cloud.spot_rng = self.worlds["spot"].rng if self.on("spot") else None

    def settle_worlds(self: Simulation) -> None:
        for w in self.worlds.values():
            w.dice.enabled = False

    # ---- operators (a platform action) -----------------------------------------------

    def world_operators(self: Simulation) -> None:
        """A broken settings value fixed when due, or a new one; ``sim-d`` moved or back; ``sim``
        switched to report once a delete of it met a termination protection (rule 14)."""
        step = self.trace.step
        if self.rule14:
            self.platform.rule14_operator()
        for bid, until in sorted(self.broken_until.items()):
            if until <= step:
                self.fix_settings(bid)
        if self.on("settings") and self.worlds["settings"].dice.roll("settings_broken"):
            self.break_settings()
        if self.on("volumes"):
            self.platform.volume_step()
        self.retire_step()
        if self.on("moves"):
            spec = self.backends[BACKEND_D]
            if spec.account != spec.configured_account and self.moved_until <= step:
                self.move_backend(spec.configured_account)
            elif spec.account == spec.configured_account and self._deleting(BACKEND_D) \
                    and (self.worlds["moves"].dice.roll("backend_moved") or self.worlds["moves"].rng.random() < 0.5):
                # moved while a delete cycle of it has deletes under way: what rule 18 is about
                self.moved_until = step + self.worlds["moves"].rng.randint(3, 15)
                self.move_backend(STRANGER_ACCOUNT)

    def _deleting(self: Simulation, bid: str) -> bool:
        """A delete cycle of ``bid`` that has not finished sent delete requests."""
        return bool(self.admin.run("SELECT 1 FROM cycles WHERE backend_id = :b AND outcome IS NULL"
                                   " AND mode = 'delete' AND dispatched LIMIT 1", b=bid))

    def break_settings(self: Simulation) -> None:
        """A platform bug writes a settings value that is no JSON object into a row of the
        first account that protects with the default key only (rule 16's defaults cover it)
        and lists with the function's own credentials (jsonb ``null`` reads as no settings)."""
        w = self.worlds["settings"]
        cands = [b for b, s in sorted(self.backends.items())
                 if b != "sim" and s.account == ACCOUNT and b not in self.broken_until
                 and "protect_tag_key" not in s.settings and "role_arn" not in s.settings]
        if not cands:
            return
        bid = w.rng.choice(cands)
        value = w.rng.choice(BROKEN_SETTINGS)
        self.broken_until[bid] = self.trace.step + w.rng.randint(2, 12)
        self.backends[bid].broken = value
        self.edit_backend_row(bid, f"settings -> {value} (not an object)", "settings = CAST(:s AS jsonb)", s=value)

    def fix_settings(self: Simulation, bid: str) -> None:
        self.broken_until.pop(bid, None)
        spec = self.backends[bid]
        spec.broken = None
        self.edit_backend_row(bid, "settings fixed", "settings = CAST(:s AS jsonb)", s=json.dumps(spec.row_settings))

    def move_backend(self: Simulation, account: str) -> None:
        spec = self.backends[BACKEND_D]
        spec.account = account
        self.edit_backend_row(BACKEND_D, f"account -> {account}", "account = :a", a=account)

    def restore_worlds(self: Simulation) -> None:
        """The settle phase: broken rows fixed, ``sim-d`` back home."""
        for bid in sorted(self.broken_until):
            self.fix_settings(bid)
        self.retire_step(settling=True)
        if self.on("moves") and self.backends[BACKEND_D].account != self.backends[BACKEND_D].configured_account:
            self.move_backend(self.backends[BACKEND_D].configured_account)

    # ---- forged listing batches ------------------------------------------------------

    def forge_everything(self: Simulation, body: str) -> str | None:
        """Every field of every listed resource but its id, kind and lookup region altered
        (rule 21: the deleter takes none of them)."""
        batch = ListingBatch.model_validate_json(body)
        if not batch.groups:
            return None
        rng = self.worlds["forge2"].rng
        groups = tuple(g.model_copy(update={"resources": tuple(self._forged(r, g, rng) for r in g.resources)})
                       for g in batch.groups)
        self.dice.counts["message_forged2:fields"] += 1
        self.trace(f"queue: forged copy of batch {batch.seq} of {batch.cycle_id[:8]} (every field but the ids)")
        return batch.model_copy(update={"groups": groups}).model_dump_json()

    def forge_mode(self: Simulation, body: str) -> str | None:
        """A report-mode batch's copy saying delete (rule 12: the cycle's mode is its row's);
        the same on every later report-mode batch of that backend, so that a trusted one would
        mark in one listing and sweep in the next (rule 23)."""
        batch = ListingBatch.model_validate_json(body)
        if batch.mode != "report":
            return None
        self.forged_mode.add(batch.backend)
        self.dice.counts["message_forged_mode:batch"] += 1
        self.trace(f"queue: forged copy of batch {batch.seq} of {batch.cycle_id[:8]} (mode delete, read first)")
        return batch.model_copy(update={"mode": "delete"}).model_dump_json()

    @staticmethod
    def _forged(r: Resource, g: ResourceGroup, rng: random.Random) -> Resource:
        tags = {k: v for k, v in r.tags.items() if k not in PROTECT_KEYS and not k.startswith("aws:")}
        tags[f"forged-{rng.randint(0, 99)}"] = "x" * rng.randint(1, 20)
        if rng.random() < 0.05 and TAG in tags:
            tags[TAG] = "zz" + tags[TAG][2:]  # another ref: a malformed group
        created = r.created_at - timedelta(days=rng.randint(1, 400)) if r.created_at and rng.random() < 0.8 \
            else (r.created_at or datetime(2030, 1, 1, tzinfo=UTC)) + timedelta(seconds=rng.randint(1, 3600))
        state = rng.choice([s for s in ResourceState if s is not r.state])
        attached = rng.choice([None, g.primary_id, f"i-{rng.randint(0, 0xffffffff):08x}"])
        name = f"forged-{rng.randint(0, 1 << 30):x}"
        details = {"name": name, "self_link": f"projects/p/zones/z9-x/{r.kind.value}s/{name}",
                   "device_name": rng.choice(["/dev/sda1", "/dev/sdf", "boot"]), "zone": "z9-x",
                   "region": "z9", "size_gb": rng.randint(1, 16000), "attached_at": str(created)}
        return r.model_copy(update={"tags": tags, "created_at": created, "state": state, "attached_to": attached,
                                    "details": details, "controller": None, "protection": None})

    def forging_young_snapshot(self: Simulation, body: str) -> bool:
        """Whether the ages forger already claims a snapshot of this batch's backend old (it goes on
        in the settle phase: nothing it claims may be deleted, so the run still settles)."""
        return ListingBatch.model_validate_json(body).backend in self.forged_snapshot

    def forge_young_snapshot(self: Simulation, body: str) -> str | None:
        """A forged copy adding a young snapshot of ours (never listed) to the batch, claimed
        old (rule 15: the deleter re-reads its age); the same snapshot on each forged batch of a
        backend while it qualifies."""
        batch = ListingBatch.model_validate_json(body)
        spec = self.backends.get(batch.backend)
        if spec is None or self.retain_days is None:
            return None
        cloud = self.clouds[spec.account]
        regions = {g.region for g in batch.groups} or set(spec.row_regions)
        listed = {rid for g in batch.groups for rid in g.resource_ids()}
        snaps = sorted(s.id for s in cloud.resources.values() if s.kind is ResourceKind.SNAPSHOT
                       and s.state is not ResourceState.TERMINATED and s.region in regions and s.id not in listed
                       and ours(s) and young(s, self.retain_days) and is_valid_ref(s.tags.get(TAG)))
        if not snaps:
            return None
        rng = self.worlds["ages"].rng
        kept = self.forged_snapshot.get(batch.backend)
        snap = cloud.resources[kept if kept in snaps else rng.choice(snaps)]
        self.forged_snapshot[batch.backend] = snap.id
        claimed = Resource(kind=snap.kind, id=snap.id, region=snap.region, state=ResourceState.AVAILABLE,
                           tags=dict(snap.tags), created_at=datetime.now(UTC) - timedelta(days=self.retain_days + 30))
        ref = snap.tags[TAG]
        groups = list(batch.groups)
        same = [i for i, g in enumerate(groups) if g.provider_ref == ref and g.region == snap.region]
        if same:
            i = rng.choice(same)
            groups[i] = groups[i].model_copy(update={"resources": (*groups[i].resources, claimed)})
        else:
            groups.append(ResourceGroup(provider_ref=ref, region=snap.region, resources=(claimed,)))
            self.forged_group_cycles.add(batch.cycle_id)
        self.dice.counts["snapshot_forged_young:batch"] += 1
        self.trace(f"queue: forged copy of batch {batch.seq} of {batch.cycle_id[:8]} (+ young snapshot {snap.id},"
                   " claimed old)")
        return batch.model_copy(update={"groups": tuple(groups)}).model_dump_json()


class WorldPeople:
    """The platform's and people's side of the deletion's worlds (a mixin of ``Platform``)."""

    def world_history(self: Platform) -> None:
        sim = self.sim
        if sim.on("ages"):
            self._ages_history()
        if sim.on("spot"):  # a request left open on a VM the history terminated: cancelled, or a leftover
            rng = sim.worlds["spot"].rng
            for cloud in sim.clouds.values():
                for r in sorted(cloud.resources.values(), key=lambda r: r.id):
                    holder = cloud.resources.get(r.attached_to or "")
                    if r.kind is ResourceKind.SPOT_REQUEST and holder is not None \
                            and holder.state is ResourceState.TERMINATED and rng.random() < 0.5:
                        r.state = ResourceState.TERMINATED

    def _ages_history(self: Platform) -> None:
        """Snapshots of finished owners' volumes: the deleter's own (old, young, one an image
        uses) and others' (a backup without the source tag, a copy under another name)."""
        sim, w = self.sim, self.sim.worlds["ages"]
        rng, cloud, retain, wall = w.rng, sim.cloud, sim.retain_days, datetime.now(UTC)
        assert retain is not None
        done = [o for o in self.owners if o.committed in ("terminated", "gone") or o.soft_deleted]
        for o in rng.sample(done, min(len(done), rng.randint(1, 3))):
            region = o.attempts[-1].region if o.attempts else rng.choice(self.regions)
            for kind in rng.sample(("old", "young", "image", "backup", "copy"), rng.randint(2, 4)):
                source = f"vol-{rng.randint(0x10000000, 0x3fffffff):08x}"  # a volume since deleted
                days = retain + rng.randint(2, 60) if kind != "young" else rng.randint(0, retain - 2)
                at = wall - timedelta(days=days, hours=rng.randint(0, 11))
                tags = {TAG: o.ref, SNAPSHOT_SOURCE_KEY: source}
                if kind == "backup":
                    tags = {TAG: o.ref, "aws:backup:source-resource": source}
                meta = ResMeta(origin="ours" if kind in ("old", "young", "image") else "foreign", owner_id=o.id,
                               attempt=None, visible_at=sim.clock())
                rid = cloud.add(ResourceKind.SNAPSHOT, region, tags, now=sim.clock(), meta=meta)
                snap = cloud.resources[rid]
                snap.created_at, snap.source_id = at, source
                snap.name = f"copy-of-{source}" if kind == "copy" else f"oc-{o.ref}-{source}"
                if kind == "image":
                    snap.used_by = f"ami-{rng.randint(0, 1 << 32):08x}"
                sim.trace(f"history: {kind} snapshot {rid} of {o.id}'s {source}, {days} days old")

    def world_people(self: Platform) -> None:
        sim = self.sim
        if sim.on("names"):
            self.reuse_name()
        if sim.on("swap"):
            self.swap_root()
        if sim.on("inuse"):
            self.borrow_volume()
        if sim.on("bulk"):
            self.inflate_group()
        if sim.on("ages") and sim.worlds["ages"].dice.roll("user_deregister_image"):
            used = sorted(r.id for r in sim.cloud.resources.values() if r.used_by is not None)
            if used:
                rid = sim.worlds["ages"].rng.choice(used)
                sim.trace(f"user: deregistered {sim.cloud.resources[rid].used_by}, which used {rid}")
                sim.cloud.resources[rid].used_by = None

    def _in_flight_first(self: Platform, cands: list[str], rng: random.Random) -> str | None:
        """Preferably a resource named by a waiting delete request, else one being
        classified, else an orphan, else any."""
        if not cands:
            return None
        deleting, listed = self.sim.resources_in_messages()
        roll = rng.random()
        for pool in ([c for c in cands if c in deleting] if roll < 0.7 else [],
                     [c for c in cands if c in listed] if roll < 0.85 else [],
                     [c for c in cands if self.is_orphan(c, known=frozenset())], cands):
            if pool:
                return rng.choice(pool)
        return None

    # ---- names -------------------------------------------------------------------------

    def reuse_name(self: Platform) -> None:
        sim, w = self.sim, self.sim.worlds["names"]
        if not w.dice.roll("user_reuse_name"):
            return
        world = sim.world
        cands = sorted(rid for rid, r in world.resources.items() if r.state not in GONE
                       and is_valid_ref(r.tags.get(TAG)) and r.kind is not ResourceKind.SNAPSHOT)
        rid = self._in_flight_first(cands, w.rng)
        if rid is None:
            return
        cloud = world.of(rid)
        cloud.after_read(rid, lambda: self._take_name(cloud, rid))
        sim.trace(f"user: will reuse the name of {rid} ({cloud.resources[rid].name}) once it is read")

    def _take_name(self: Platform, cloud: SimCloud, rid: str) -> None:
        """Right after a read of ``rid``: its name goes to a new resource."""
        sim, rng, now = self.sim, self.sim.worlds["names"].rng, self.sim.clock()
        r = cloud.resources[rid]
        if r.state in GONE:
            return
        name, tags = r.name, dict(r.tags)
        if rng.random() < 0.5 and self.is_orphan(rid, known=frozenset()):
            how = "deleted by its owner"
            sim.checker.people_removed.add(rid)
            if r.kind is ResourceKind.INSTANCE:
                cloud.finish_termination(r)
            else:
                cloud.detach(rid)
                r.state = ResourceState.TERMINATED
        else:
            how = "renamed"
            cloud.rename(rid, f"{name}-was")
        owner = self.by_ref.get(tags.get(TAG, ""))
        finished = owner is not None and (owner.committed in ("terminated", "gone") or owner.soft_deleted)
        roll = rng.random()
        if roll < 0.4:
            new_tags = {**tags, PROTECT: "yes"}
        elif roll < 0.7 or not finished:
            new_tags = {"Name": f"someone-{name}"}
        else:
            new_tags = tags
        meta = ResMeta(origin="reused", owner_id=owner.id if owner is not None else None, attempt=None,
                       visible_at=now + timedelta(seconds=rng.randint(0, LISTING_LAG_MAX)),
                       ghost_for=rng.choice((0, 30)), shutdown_for=rng.choice((0, 20)))
        new = cloud.add(r.kind, r.region, new_tags, now=now, meta=meta)
        cloud.resources[new].name = name
        sim.trace(f"user: {rid} {how}; {new} {new_tags} now takes its name {name}")

    # ---- swapped roots ---------------------------------------------------------------

    def swap_root(self: Platform) -> None:
        sim, w, now = self.sim, self.sim.worlds["swap"], self.sim.clock()
        if not w.dice.roll("user_swap_root"):
            return
        world = sim.world
        cands = sorted(rid for rid, r in world.resources.items()
                       if r.kind is ResourceKind.INSTANCE and r.state is ResourceState.ACTIVE and TAG in r.tags
                       and now - r.created_at > AT_LAUNCH + timedelta(minutes=1))
        vm = self._in_flight_first(cands, w.rng)
        if vm is None:
            return
        cloud = world.of(vm)
        instance = cloud.resources[vm]
        instance.stopped = True
        for d in [d for d in cloud.resources.values() if d.attached_to == vm and d.device == ROOT_DEVICE]:
            cloud.detach(d.id)
        meta = ResMeta(origin="foreign", owner_id=None, attempt=None, visible_at=now)
        new = cloud.add(ResourceKind.VOLUME, instance.region, {"Name": "restored-root"},
                        now=now - timedelta(days=w.rng.randint(0, 90)), meta=meta)
        cloud.attach(new, vm, device=ROOT_DEVICE, at=now, auto_delete=True)
        instance.stopped = w.rng.random() < 0.5  # started again, or left stopped
        sim.trace(f"user: stopped {vm} and swapped its root for {new} (theirs, delete-on-termination)")

    # ---- in use ------------------------------------------------------------------------

    def borrow_volume(self: Platform) -> None:
        sim, w = self.sim, self.sim.worlds["inuse"]
        if not w.dice.roll("user_borrow_volume"):
            return
        world = sim.world
        cands = sorted(rid for rid, r in world.resources.items() if r.kind is ResourceKind.VOLUME
                       and r.state is ResourceState.AVAILABLE and r.attached_to is None
                       and is_valid_ref(r.tags.get(TAG)))
        vid = self._in_flight_first(cands, w.rng)
        if vid is None:
            return
        cloud = world.of(vid)
        if w.rng.random() < 0.5:
            cloud.after_read(vid, lambda: self._borrow(cloud, vid))
            sim.trace(f"user: will attach {vid} to an instance of theirs once it is read")
        else:
            self._borrow(cloud, vid)

    def _borrow(self: Platform, cloud: SimCloud, vid: str) -> None:
        sim, now = self.sim, self.sim.clock()
        r = cloud.resources[vid]
        if r.state is not ResourceState.AVAILABLE or r.attached_to is not None:
            return
        hosts = sorted(h.id for h in cloud.resources.values() if h.kind is ResourceKind.INSTANCE
                       and h.state is ResourceState.ACTIVE and h.region == r.region and h.tags == {"Name": "borrower"})
        if hosts:
            host = hosts[0]
        else:
            host = cloud.add(ResourceKind.INSTANCE, r.region, {"Name": "borrower"}, now=now,
                             meta=ResMeta(origin="foreign", owner_id=None, attempt=None, visible_at=now))
        cloud.attach(vid, host, device="/dev/sdf", at=now)
        sim.trace(f"user: attached {vid} to {host}, an instance of theirs")

    # ---- inflated groups -------------------------------------------------------------

    def inflate_group(self: Platform) -> None:
        sim, w, now = self.sim, self.sim.worlds["bulk"], self.sim.clock()
        if not w.dice.roll("user_inflate_group"):
            return
        done = [o for o in self.owners if (o.committed in ("terminated", "gone") or o.soft_deleted) and o.attempts]
        if not done:
            return
        o = w.rng.choice(done)
        region = o.attempts[-1].region
        limit = sim.listing_q.max_message_bytes - ENVELOPE
        huge = limit <= 8192 and w.rng.random() < 0.7
        if huge:  # so many that their ids alone are too large for a message
            n, tags = limit // 80 + w.rng.randint(5, 15), {TAG: o.ref}
        else:  # a few, with tags that make them too large until reduced
            n = w.rng.randint(2, 3)
            tags = {TAG: o.ref, **{f"note-{i:02d}": "x" * 90 for i in range(w.rng.randint(15, 30))}}
        meta = ResMeta(origin="bulk-huge" if huge else "bulk", owner_id=o.id, attempt=None,
                       visible_at=now + timedelta(seconds=w.rng.randint(0, LISTING_LAG_MAX)))
        cloud = sim.clouds[sim.backends[o.home].account]
        for _ in range(n):
            cloud.add(ResourceKind.VOLUME, region, dict(tags), now=now, meta=meta)
        sim.trace(f"user: tagged {n} volumes with {o.id}'s ref {o.ref} in {region}"
                  + (" (too many for one message)" if huge else " (large tags)"))

    # ---- spot requests -----------------------------------------------------------------

    def cancel_spot(self: Platform, vm: Any) -> None:
        """The platform cancels its VM's spot request before terminating it."""
        cloud = self.sim.world.of(vm.id)
        request = cloud.resources.get(vm.spot_request or "")
        if request is not None and request.state is not ResourceState.TERMINATED:
            request.state = ResourceState.TERMINATED

