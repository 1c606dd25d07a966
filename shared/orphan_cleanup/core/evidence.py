"""The evidence of a verdict: the facts ``classify`` read, as the compact record a
cycle keeps with each group it records (``record_of``), and what such a record
says in words: each rule in one sentence, each owner time against the listing
time and the margin, the one-line C3 ``detail`` of a group, and the record with
long keys for ``explain --json``. Pure, like ``classify``: data in, data out; the
classifier (``payload``) stores the record and its detail, ``orphan-cleanup
explain`` renders the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from orphan_cleanup.core.backends import DEFAULT_PROTECT_KEY, DEFAULT_TAG_KEY
from orphan_cleanup.core.classify import ClassifyContext, malformed
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.listing_rules import attached_user
from orphan_cleanup.core.owners import Keep, OwnerStatus, Record
from orphan_cleanup.core.verdicts import Verdict

#: Every reason ``classify.classify`` can give, and its rule in one sentence
#: (README's reason table says the same; tests/unit/test_evidence.py keeps the three equal).
RULES: dict[str, str] = {
    "malformed_ref": "a resource carrying the ref tag key with an empty or invalid value is not ours: never touched",
    "no_record": "a ref that is not in this ledger belongs to someone else: never touched",
    "record_mismatch": "the ledger answered with a record of another ref: skipped, fail closed",
    "unsupported_owner_type": "only instance, gateway and volume owners are cleaned up: any other owner type"
                              " is left alone",
    "owner_deleted": "the ref's owner row is gone (hard-deleted): its resources are orphans once old enough",
    "owner_soft_deleted": "the owner has deleted_at set: its resources are orphans once old enough",
    "owner_pending": "a pending owner's resources may be in flight: skipped",
    "owner_terminating": "a terminating owner is the platform's to finish: skipped",
    "owner_terminated": "a terminated owner's resources are orphans once its times are older than the margin",
    "terminated_at_missing": "a terminated owner without terminated_at cannot be checked against the margin: skipped",
    "unknown_status": "an owner status outside the known list: skipped, fail closed",
    "no_provisioning_data": "a live owner without backend_id/primary_id cannot be matched to a VM: left alone",
    "unknown_owner_backend": "a live owner naming no known backend may be anyone's: skipped, never an orphan",
    "owner_backend_conflict": "a live owner records this VM but names a backend of another account: skipped",
    "leftover_of_orphan": "VM-less resources all seen before in an orphan group of this ref stay orphans",
    "unattached_of_live_owner": "VM-less resources of a live owner, not seen in an orphan group: protected",
    "tracked": "a live owner of this account whose primary_id is this VM: tracked, never touched",
    "suspected_copy": "another VM with a live owner's ref made after its provisioning plus the margin is a copy:"
                      " protected",
    "primary_mismatch": "a live owner of this account records another VM, listed beside this one and provisioned"
                        " after it was created: a lost attempt, an orphan",
    "primary_not_listed": "a live owner of this account records a primary this listing does not show beside this VM"
                          " (a mangled id, a name, an unlisted region): this VM may be its only one, skipped",
    "backend_mismatch": "the owner's provisioning data names a backend of another account or provider:"
                        " a failover leftover, an orphan",
    "recent_owner_change": "an orphan candidate whose owner changed within the margin of the listing: skipped",
    "recent_resource": "an orphan candidate with a resource created within the margin of the listing: skipped",
    "protect_tag": "an orphan candidate carrying the protect tag is reported, never deleted",
    "kept_by_operator": "an operator kept this ref (orphans keep): its groups are reported, never deleted, until"
                        " the keep ends or is released",
    "managed_by_controller": "an orphan candidate that an Auto Scaling group, fleet or managed instance group would"
                             " re-create is reported, never deleted: cleanup never fights another controller",
    "termination_protection": "an orphan candidate with AWS termination protection is reported, never deleted"
                              " (found by the delete's re-read, read again by every delete cycle)",
    "deletion_protection": "an orphan candidate with GCP deletion protection is reported, never deleted",
    "malformed_group": "a listed group that no adapter could have produced: skipped, fail closed",
    "owner_deleting": "a deleting volume owner is the platform's to finish: skipped",
    "deleted_at_missing": "a deleted volume owner without deleted_at cannot be checked against the margin: skipped",
    "in_use": "an orphan candidate volume that an instance holds is never deleted from under it: skipped until"
              " it is detached",
}

#: The reasons reached through STEP 5 (``classify._orphan_unless_recent``): for these,
#: every owner time and resource creation time was compared with the margin.
STEP5 = frozenset({"owner_deleted", "owner_soft_deleted", "owner_terminated", "leftover_of_orphan",
                   "primary_mismatch", "backend_mismatch", "recent_owner_change", "recent_resource",
                   "protect_tag", "malformed_group", "in_use"})

OWNER_TIMES = (("is", "issued_at"), ("cr", "created_at"), ("pr", "provisioned_at"), ("te", "terminated_at"),
               ("de", "deleted_at"))


# ---- the record -------------------------------------------------------------------

def record_of(group: ResourceGroup, record: Record | None, ctx: ClassifyContext,
              verdict: Verdict) -> dict[str, Any]:
    """The facts ``classify.classify`` read to reach ``verdict`` (from the same
    inputs), as the compact record each cycle_groups row keeps (``evidence``).
    Decides nothing: the verdict is an input, only its reason selects a fact.

    Short keys; a key whose value is null, empty or the default is left out:

    - ``m`` the margin (seconds); ``tk``, ``pk`` the ref and protect tag keys (when
      not the defaults), ``pkx`` the protect keys of the account's other backends;
    - the owner: ``o`` id, ``on`` name, ``ot`` type (when not instance), ``gone`` 1
      when its instances row is hard-deleted, ``st`` status, ``ob`` backend_id,
      ``os`` that backend's ``provider:account`` scope, ``sc`` this backend's scope
      (when the owner names another backend), ``pid`` primary_id, ``rf`` the
      record's ref (when not the group's), ``t`` {``is``, ``cr``, ``pr``, ``te``,
      ``de``}: issued/created/provisioned/terminated/deleted at, as seconds before
      the cycle's ``listed_at`` (negative: after; exact to the microsecond, and
      what STEP 5 compares; ``owner_times`` gives the timestamps back);
    - the group: ``cn`` {id: controller} of resources a controller manages, ``pp``
      {id: protection} of protected resources (as listed, or remembered from an
      earlier delete), ``pt`` ids carrying the protect tag, ``rr`` ids created within the
      margin, ``ko`` how many of a VM-less group's resources earlier orphan groups
      held, ``mg`` why the group is malformed, ``lp`` (a retry leak) the owner's
      recorded primary, listed beside this VM (or volume), ``au`` (a volume in use) what
      holds it. The resources' own times and tags are
      in the row's ``resources``."""
    # On the classifier's hot path (every recorded group): plain statements, no helpers.
    listed = ctx.listed_at
    ev: dict[str, Any] = {"m": int(ctx.margin.total_seconds())}
    if ctx.tag_key != DEFAULT_TAG_KEY:
        ev["tk"] = ctx.tag_key
    if ctx.protect_key != DEFAULT_PROTECT_KEY:
        ev["pk"] = ctx.protect_key
    if ctx.more_protect_keys:
        ev["pkx"] = sorted(ctx.more_protect_keys)
    if record is not None:
        status = record.status.value if isinstance(record.status, OwnerStatus) else record.status
        for key, value in (("o", _cut(record.owner_id)), ("on", _cut(record.owner_name)), ("st", status),
                           ("ob", record.backend_id), ("os", record.owner_backend_scope),
                           ("pid", record.primary_id)):
            if value is not None:
                ev[key] = value
        if record.owner_type != "instance":
            ev["ot"] = record.owner_type
        if not record.instance_found:
            ev["gone"] = 1
        if record.backend_id is not None and record.backend_id != ctx.backend_id:
            ev["sc"] = ctx.scope
        if record.provider_ref != group.provider_ref:
            ev["rf"] = record.provider_ref
        times = {}
        for key, t in (("is", record.issued_at), ("cr", record.created_at), ("pr", record.provisioned_at),
                       ("te", record.terminated_at), ("de", record.deleted_at)):
            if t is not None:
                times[key] = (listed - t).total_seconds()
        if times:
            ev["t"] = times
        if verdict.reason == "primary_mismatch":
            ev["lp"] = record.primary_id  # listed beside this VM: what the deleter relies on (rule 17)
        if group.primary_id is None and record.known_orphan_resource_ids:
            ev["ko"] = sum(1 for r in group.resources if r.id in record.known_orphan_resource_ids)
    horizon = listed - ctx.margin
    keys = ctx.protect_keys
    protected = [r.id for r in group.resources if not keys.isdisjoint(r.tags)]
    recent = [r.id for r in group.resources if r.created_at is not None and r.created_at >= horizon]
    if protected:
        ev["pt"] = protected
    controllers = {r.id: r.controller for r in group.resources if r.controller is not None}
    if controllers:
        ev["cn"] = controllers
    protections: dict[str, str] = {r.id: r.protection for r in group.resources if r.protection is not None}
    if record is not None and group.primary_id in record.protected_primaries:
        protections.setdefault(group.primary_id, record.protected_primaries[group.primary_id])
    if protections:
        ev["pp"] = protections
    if recent:
        ev["rr"] = recent
    if verdict.reason == "malformed_group":
        ev["mg"] = malformed(group, ctx.tag_key, ctx.scope.partition(":")[0],
                             record.owner_type if record is not None else "instance")
    if verdict.reason == "in_use" and (primary := group.primary) is not None:
        ev["au"] = attached_user(primary)
    return ev


def _cut(text: str | None, limit: int = 64) -> str | None:
    # The platform's free text: kept short, the record stays a few hundred bytes.
    return text if text is None or len(text) <= limit else text[:limit - 1] + "…"


# ---- its words ---------------------------------------------------------------------

def span(seconds: float) -> str:
    """``3h12m``, ``5m``, ``5m12s``, ``2d3h``: the two largest units, a zero second one left out."""
    s = int(round(abs(seconds)))
    if s == 0:
        return "0s" if seconds == 0 else "under 1s"
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for i, (unit, size) in enumerate(units):
        if s >= size:
            text = f"{s // size}{unit}"
            if i + 1 < len(units) and (rest := s % size // units[i + 1][1]):
                text += f"{rest}{units[i + 1][0]}"
            return text
    raise AssertionError("unreachable")


def relative(t: datetime, ref: datetime, what: str = "listing") -> str:
    """``3h12m before listing`` / ``2m after listing``."""
    delta = (ref - t).total_seconds()
    return f"{span(delta)} {'before' if delta >= 0 else 'after'} {what}"


def within_margin(t: datetime, listed_at: datetime, margin_seconds: int) -> bool:
    """STEP 5's test: at or after the horizon (listing time minus the margin)."""
    return t >= listed_at - timedelta(seconds=margin_seconds)


def owner_times(ev: Mapping[str, Any], listed_at: datetime) -> dict[str, datetime]:
    """The owner timestamps of a record (kept as seconds before ``listed_at``), by
    column name, in the ledger's order."""
    t = ev.get("t") or {}
    return {name: listed_at - timedelta(seconds=t[k]) for k, name in OWNER_TIMES if k in t}


def has_owner(ev: Mapping[str, Any]) -> bool:
    return any(k in ev for k in ("o", "st", "gone", "t"))


def keep_record(keep: Keep) -> dict[str, Any]:
    """An operator's keep as the evidence keeps it (``kp``): ``r`` its reason, ``at`` when it
    was written, ``u`` its end (None: until released), ISO timestamps."""
    return {"r": keep.reason, "at": keep.kept_at.isoformat(), "u": keep.until.isoformat() if keep.until else None}


def keep_line(reason: str | None, until: str | None) -> str:
    """``kept by the operator until released: debugging``: a keep in one line."""
    return f"kept by the operator until {until or 'released'}" + (f": {reason}" if reason else "")


def detail(reason: str, ev: Mapping[str, Any], group: ResourceGroup, listed_at: datetime) -> str | None:
    """The group's one-line C3 ``detail``: the facts behind its verdict, or None where
    there is nothing to add (a tracked VM)."""
    if reason == "tracked":  # most rows of a manual run: nothing to say, nothing to compute
        return None
    if reason == "kept_by_operator":
        kp = ev.get("kp") or {}
        return keep_line(kp.get("r"), kp.get("u"))
    o, st, m = ev.get("o") or "?", ev.get("st"), ev.get("m", 0)
    margin, before = span(m), ev.get("t") or {}

    def when(key: str) -> str:
        x = before.get(key)
        return "(no time recorded)" if x is None else f"{span(x)} {'before' if x >= 0 else 'after'} listing"

    n = len(group.resources)
    if reason == "owner_terminated":
        return f"owner {o} terminated {when('te')} (margin {margin})"
    if reason == "owner_soft_deleted":
        return f"owner {o} soft-deleted {when('de')} (margin {margin})"
    if reason == "owner_deleted":
        return f"owner row of {o} is gone (hard-deleted); ref issued {when('is')}"
    if reason == "owner_pending":  # a stuck one is never decided until the platform reaps its row (README)
        return f"owner {o} pending since {when('cr')}: skipped until the platform records or reaps it"
    if reason == "leftover_of_orphan":
        return f"all {n} resource(s) were in an earlier orphan group of this ref; owner {o} is {st}"
    if reason == "unattached_of_live_owner":
        return f"owner {o} is {st}; {ev.get('ko', 0)} of {n} resource(s) were in an earlier orphan group"
    if reason in ("primary_mismatch", "backend_mismatch", "suspected_copy"):
        where = f" on backend {ev.get('ob')} ({ev.get('os')})" if reason == "backend_mismatch" else ""
        return f"owner {o} records {ev.get('pid')}{where}; {copy_gap(ev, group, listed_at)}"
    if reason == "primary_not_listed":
        what = "a volume" if ev.get("ot") == "volume" else "an instance"
        return f"owner {o} records {ev.get('pid')!r}, which this listing does not show as {what} of its ref"
    if reason == "recent_owner_change":
        recent = ", ".join(f"{name} {when(key)}" for key, name in OWNER_TIMES if before.get(key, m + 1) <= m)
        return f"owner {o} {recent or 'changed'}, within the {margin} margin"
    if reason == "recent_resource":
        return f"{', '.join(ev.get('rr', []))} created within the {margin} margin of listing"
    if reason == "protect_tag":
        ids = ev.get("pt", [])
        return f"{', '.join(ids)} {'carries' if len(ids) == 1 else 'carry'} {ev.get('pk', DEFAULT_PROTECT_KEY)}"
    if reason == "malformed_group":
        return str(ev.get("mg"))
    if reason == "in_use":
        return f"{group.primary_id} is attached to instance {ev.get('au')}: never deleted from under it"
    if reason == "managed_by_controller":
        return "; ".join(f"{i} is managed by {c}" for i, c in (ev.get("cn") or {}).items()) or None
    if reason in ("termination_protection", "deletion_protection"):
        ids = [i for i, p in (ev.get("pp") or {}).items() if p == reason]
        what = "termination protection (DisableApiTermination)" if reason == "termination_protection" \
            else "deletionProtection"
        return f"{', '.join(ids) or 'the primary'} {'has' if len(ids) <= 1 else 'have'} {what}"
    if reason == "unknown_owner_backend":
        return f"live owner {o} names backend {ev.get('ob')!r}, which is no backends row"
    if reason == "owner_backend_conflict":
        return f"owner {o} records this VM but on backend {ev.get('ob')} ({ev.get('os')})"
    if reason == "owner_pending":
        return f"owner {o} is pending, created {when('cr')}"
    if reason in ("owner_terminating", "owner_deleting", "unknown_status", "terminated_at_missing",
                  "deleted_at_missing", "no_provisioning_data"):
        return f"owner {o} status {st}" + {"terminated_at_missing": ", no terminated_at",
                                          "deleted_at_missing": ", no deleted_at",
                                          "no_provisioning_data": ", no backend_id/primary_id"}.get(reason, "")
    if reason == "unsupported_owner_type":
        return f"ref owned by {ev.get('ot')!r} {o}"
    if reason == "no_record":
        return "no provider_refs row for this ref"
    if reason == "record_mismatch":
        return f"the ledger answered for ref {ev.get('rf')!r}"
    if reason == "malformed_ref":
        return f"{ev.get('tk', DEFAULT_TAG_KEY)} value {group.provider_ref!r} is not a ref"
    return None


def snapshot_pairs(value: Any) -> list[tuple[str, str]] | None:
    """``[(volume or disk id, snapshot id), ...]`` from a recorded ``DeleteResult`` field
    (a list of two-string lists); None when the record has another shape (fail closed:
    nothing is named from a record that cannot be read)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        return None
    pairs = []
    for pair in value:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) and x for x in pair)):
            return None
        pairs.append((pair[0], pair[1]))
    return pairs


def snapshot_note(taken: Sequence[tuple[str, str]], pending: Sequence[tuple[str, str]] = ()) -> str | None:
    """The snapshots a deletion kept in words, for the group's ``detail``
    and ``explain``: ``snapshot snap-0abc of vol-123``; None when it kept none."""
    words = [f"snapshot {sid} of {vid}" for vid, sid in taken]
    words += [f"snapshot {sid} of {vid} (still being taken: {vid} kept)" for vid, sid in pending]
    return "; ".join(words) or None


def copy_gap(ev: Mapping[str, Any], group: ResourceGroup, listed_at: datetime) -> str:
    """A VM with a live owner's ref against the owner's provisioning: a lost attempt
    (created before provisioned_at + margin) or a copy (after)."""
    provisioned = owner_times(ev, listed_at).get("provisioned_at")
    primary = group.primary
    if primary is None or primary.created_at is None or provisioned is None:
        return "no creation or provisioning time to tell a copy from a lost attempt"
    gap = (primary.created_at - provisioned).total_seconds()
    margin = ev.get("m", 0)
    kind = "a copy" if gap > margin else "a lost attempt"
    when = f"{span(gap)} {'after' if gap > 0 else 'before'}" if gap else "at the time of"
    this = "this volume" if ev.get("ot") == "volume" else "this VM"
    return f"{this} was created {when} the owner's provisioning (margin {span(margin)}): {kind}"


def expand(reason: str, ev: Mapping[str, Any] | None, group: ResourceGroup,
           listed_at: datetime) -> dict[str, Any] | None:
    """The stored record with long keys and its comparisons made, for ``explain --json``."""
    if ev is None:
        return None
    margin = int(ev.get("m", 0))
    tag_key, protect_key = ev.get("tk", DEFAULT_TAG_KEY), ev.get("pk", DEFAULT_PROTECT_KEY)
    protect_keys = {protect_key, *ev.get("pkx", ())}

    def judged(t: datetime) -> dict[str, Any]:
        return {"at": t.isoformat(), "seconds_before_listed_at": round((listed_at - t).total_seconds(), 3),
                "within_margin": within_margin(t, listed_at, margin)}

    owner = None
    if has_owner(ev):
        owner = {"id": ev.get("o"), "name": ev.get("on"), "type": ev.get("ot", "instance"),
                 "row": "hard_deleted" if ev.get("gone") else "found", "status": ev.get("st"),
                 "backend_id": ev.get("ob"), "backend_scope": ev.get("os"), "this_backend_scope": ev.get("sc"),
                 "primary_id": ev.get("pid"),
                 "times": {name: judged(t) for name, t in owner_times(ev, listed_at).items()}}
    return {
        "rule": RULES.get(reason), "margin_seconds": margin,
        "horizon": (listed_at - timedelta(seconds=margin)).isoformat(), "margin_applied": reason in STEP5,
        "owner": owner,
        "resources": [{"id": r.id, "kind": r.kind.value, "ref_tag": r.tags.get(tag_key),
                       "protect_tag": not protect_keys.isdisjoint(r.tags),
                       "created": judged(r.created_at) if r.created_at is not None else None}
                      for r in group.resources],
        "tag_key": tag_key, "protect_key": protect_key, "account_protect_keys": sorted(protect_keys - {protect_key}),
        "protected": list(ev.get("pt", [])), "recent_resources": list(ev.get("rr", [])),
        "known_orphan_resources": ev.get("ko"), "malformed": ev.get("mg"),
        "copy_check": copy_gap(ev, group, listed_at) if reason in ("primary_mismatch", "backend_mismatch",
                                                        "suspected_copy") else None,
    }
