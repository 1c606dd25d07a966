"""State of the fake Compute Engine server (see ``gcp_fake``) and the helpers
tests use to arrange it.

Resources are stored as their v1 JSON bodies (``id`` a decimal string, uint64),
keyed by ``(project, zone-or-region, name)``. Ids are never reused, even across
``reset()``; a name can be reused after a delete and then gets a new id.

Instance deletion: by default the instance disappears at once. With
``delete_stopping_gets = N`` (server-wide) or ``add_instance(..., stopping_gets=N)``
it turns ``STOPPING`` and the next N direct GETs still see it, the one after
answers 404. ``ignore_delete=True`` makes a delete "succeed" without effect
(the silent failure of seed 002). When an instance goes, it is removed from
disks' and addresses' ``users``; disks attached with ``auto_delete`` go with it.
Deleting a disk or address that has users answers 400
``resourceInUseByAnotherResource``. Operations are ``RUNNING`` in the delete
response and ``DONE`` on the next get/wait (``operation_polls`` delays that).

Reads: a ``get`` and a list whose ``filter`` pins the resource's numeric id
(``id = N``, a read by id) are the same read: each counts against the N reads a
``STOPPING`` instance has left. A list that does not pin an id counts nothing.

Attached disks: ``attach_disk``/``detach_disk``/``swap_boot_disk`` (and the REST
``instances.attachDisk``/``detachDisk`` of ``gcp_fake_api``) keep the instance's
``disks[]`` (``source``, ``deviceName``, ``index``, ``boot``, ``autoDelete``), the disk's
``users`` and its ``lastAttachTimestamp``/``lastDetachTimestamp`` in step. As on Compute
Engine, a boot disk is attached or detached only while its instance is ``TERMINATED``
(stopped), an instance has at most one boot disk, and a disk attached read-write to one
instance cannot be attached to another (400 ``resourceInUseByAnotherResource``).

Forwarding rules (regional, ``add_forwarding_rule``): a rule created on a static address
is that address's user (``IN_USE``) until the rule is deleted.

Creation times: ``add_instance``/``add_disk``/``add_address``/``add_forwarding_rule`` take ``created=`` (an
aware ``datetime``, written as the API writes it, or a string stored as is); by default
``creationTimestamp`` is now, in the API's style (``2024-05-01T09:30:00.123-07:00``).

Projects: ``projects.get`` knows the default project, every project a resource
was added to and those of ``add_project``; it finds a project by id or by
number (as the real API does) and answers with the project id as ``name``.
An unknown project answers 404; ``deny_project`` makes it answer 403.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from tests.support.gcp_fake_wire import GOOGLE_BASE, WireError, project_number, region_of, self_link

#: Collection -> the scope kind it lives in.
COLLECTIONS = {"instances": "zones", "disks": "zones", "addresses": "regions", "forwardingRules": "regions"}
SINGULAR = {"instances": "instance", "disks": "disk", "addresses": "address", "forwardingRules": "forwardingRule"}
DEFAULT_ZONES = {"us-central1": "abcf", "us-east1": "bcd", "europe-west1": "bcd", "asia-east1": "abc"}
INSTANCE_STATUSES = frozenset(
    {"PROVISIONING", "STAGING", "RUNNING", "STOPPING", "SUSPENDING", "SUSPENDED", "REPAIRING", "TERMINATED"}
)
_PACIFIC = timezone(timedelta(hours=-7))


@dataclass
class _Stored:
    body: dict[str, Any]
    stopping_gets: int | None = None
    ignore_delete: bool = False
    gets_left: int | None = None  # set while STOPPING after a delete


class FakeState:
    """Resources, operations and the helpers tests use to arrange them."""

    def __init__(self, project: str) -> None:
        self.project = project
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.require_label_filter = True
            self.delete_stopping_gets = 0
            self.operation_polls = 0
            self._zones = {f"{r}-{z}" for r, zs in DEFAULT_ZONES.items() for z in zs}
            self._store: dict[str, dict[tuple[str, str, str], _Stored]] = {c: {} for c in COLLECTIONS}
            self._ops: dict[tuple[str, str, str, str], list[Any]] = {}
            self._unreachable: set[str] = set()
            self._failing: dict[str, int] = {}
            self._projects: dict[str, str] = {self.project: project_number(self.project)}
            self._denied_projects: set[str] = set()

    # --- arranging state ---------------------------------------------------------

    def add_zone(self, zone: str) -> None:
        """Make a zone (and its region) known; unknown zones answer 404."""
        with self._lock:
            self._zones.add(zone)

    def add_instance(
        self, name: str, *, zone: str = "us-central1-a", labels: dict[str, str] | None = None,
        status: str = "RUNNING", project: str | None = None, stopping_gets: int | None = None,
        ignore_delete: bool = False, metadata: dict[str, str] | None = None, deletion_protection: bool = False,
        created_by: str | None = None, created: datetime | str | None = None,
    ) -> dict[str, Any]:
        """Create an instance; returns a copy of its JSON body (``["id"]``, ``["selfLink"]``).

        ``metadata`` becomes ``metadata.items`` in the v1 wire shape
        (``{"kind", "fingerprint", "items": [{"key", "value"}]}``); ``created_by`` names the
        instance group manager (``NAME``, in this zone) that made it, as a MIG writes it
        (``projects/NUMBER/zones/Z/instanceGroupManagers/NAME``); ``deletionProtection`` is
        always shown, as the API does; ``created``: its ``creationTimestamp`` (default now)."""
        if status not in INSTANCE_STATUSES:
            raise ValueError(f"unknown instance status {status}")
        items = dict(metadata or {})
        if created_by is not None:
            number = self._projects.get(project or self.project) or project_number(project or self.project)
            items["created-by"] = f"projects/{number}/zones/{zone}/instanceGroupManagers/{created_by}"
        meta: dict[str, Any] = {"kind": "compute#metadata", "fingerprint": _fingerprint(items)}
        if items:
            meta["items"] = [{"key": k, "value": v} for k, v in items.items()]
        body = {"kind": "compute#instance", "status": status, "disks": [], "metadata": meta,
                "deletionProtection": deletion_protection,
                "machineType": f"{GOOGLE_BASE}/projects/{project or self.project}/zones/{zone}/machineTypes/e2-small"}
        return self._add("instances", name, zone, labels, body, project, created,
                         stopping_gets=stopping_gets, ignore_delete=ignore_delete)

    def add_disk(
        self, name: str, *, zone: str = "us-central1-a", labels: dict[str, str] | None = None,
        attached_to: str | None = None, auto_delete: bool = False, boot: bool = False,
        project: str | None = None, created: datetime | str | None = None,
    ) -> dict[str, Any]:
        """Create a disk, optionally attached to the instance named ``attached_to``
        in the same zone (it appears in the disk's ``users``), as created with it: whatever
        the instance's status, with the disk's name as its ``deviceName`` and its creation
        time as its ``lastAttachTimestamp``. ``created``: its ``creationTimestamp`` (default
        now)."""
        body: dict[str, Any] = {"kind": "compute#disk", "status": "READY", "sizeGb": "10", "users": []}
        with self._lock:
            disk = self._add("disks", name, zone, labels, body, project, created)
            if attached_to is not None:
                inst = self._stored("instances", project, zone, attached_to)
                stored = self._stored("disks", project, zone, name)
                self._link(inst, stored, boot=boot, auto_delete=auto_delete, device_name=name)
                stored.body["lastAttachTimestamp"] = stored.body["creationTimestamp"]
                disk = self.get("disks", zone, name, project=project) or disk
            return disk

    def add_address(
        self, name: str, *, region: str = "us-central1", labels: dict[str, str] | None = None,
        attached_to: str | None = None, zone: str | None = None, project: str | None = None,
        created: datetime | str | None = None,
    ) -> dict[str, Any]:
        """Create a static address; ``attached_to`` names an instance of that region
        (``zone`` disambiguates) that becomes its user (status ``IN_USE``)."""
        body: dict[str, Any] = {"kind": "compute#address", "status": "RESERVED", "users": [],
                                "addressType": "EXTERNAL", "address": f"203.0.113.{next(self._ids) % 250 + 1}"}
        with self._lock:
            if attached_to is not None:
                zones = [zone] if zone else sorted(z for z in self._zones if region_of(z) == region)
                instances = self._store["instances"]
                found = [s for z in zones if (s := instances.get((project or self.project, z, attached_to)))]
                if len(found) != 1:
                    raise ValueError(f"need exactly one instance {attached_to!r} in {region}, found {len(found)}")
                body.update(status="IN_USE", users=[found[0].body["selfLink"]])
            return self._add("addresses", name, region, labels, body, project, created)

    def add_forwarding_rule(
        self, name: str, *, region: str = "us-central1", labels: dict[str, str] | None = None,
        address: str | None = None, ip: str | None = None, target: str | None = None,
        project: str | None = None, created: datetime | str | None = None,
    ) -> dict[str, Any]:
        """Create a regional forwarding rule. ``address`` names a static address of the region:
        its ``IPAddress`` becomes the rule's, and the rule its user (status ``IN_USE``), as
        Compute Engine does; otherwise ``ip`` (default: an ephemeral one). ``target``: the
        ``target`` link as is (a target pool, target instance or backend service)."""
        with self._lock:
            project = project or self.project
            stored = self._store["addresses"].get((project, region, address)) if address else None
            if address is not None and stored is None:
                raise WireError(404, f"The resource 'projects/{project}/regions/{region}/addresses/{address}' "
                                     "was not found")
            chosen = stored.body["address"] if stored else ip or f"198.51.100.{next(self._ids) % 250 + 1}"
            body: dict[str, Any] = {
                "kind": "compute#forwardingRule", "IPAddress": chosen, "IPProtocol": "TCP", "portRange": "80-80",
                "loadBalancingScheme": "EXTERNAL", "networkTier": "PREMIUM", "fingerprint": _fingerprint({"n": name}),
                "target": target or f"{GOOGLE_BASE}/projects/{project}/regions/{region}/targetPools/{name}-pool"}
            rule = self._add("forwardingRules", name, region, labels, body, project, created)
            if stored is not None:
                stored.body.setdefault("users", []).append(rule["selfLink"])
                stored.body["status"] = "IN_USE"
            return rule

    def attach_disk(self, instance: str, disk: str, *, zone: str = "us-central1-a", boot: bool = False,
                    auto_delete: bool = False, device_name: str | None = None,
                    project: str | None = None) -> dict[str, Any]:
        """Attach an existing disk of the zone to an instance, as ``instances.attachDisk``
        does (no API call, same checks: ``WireError`` when the API would refuse); returns a
        copy of the instance's body."""
        with self._lock:
            project = project or self.project
            inst = self._stored("instances", project, zone, instance)
            self._attach(inst, self._stored("disks", project, zone, disk), boot=boot, auto_delete=auto_delete,
                         device_name=device_name)
            return _copy(inst.body)

    def detach_disk(self, instance: str, device_name: str, *, zone: str = "us-central1-a",
                    project: str | None = None) -> dict[str, Any]:
        """Detach the disk attached as ``device_name``, as ``instances.detachDisk`` does (no
        API call, same checks); returns a copy of the instance's body."""
        with self._lock:
            inst = self._stored("instances", project, zone, instance)
            self._detach(inst, device_name)
            return _copy(inst.body)

    def swap_boot_disk(self, instance: str, new_disk: str, *, zone: str = "us-central1-a",
                       auto_delete: bool = True, project: str | None = None) -> dict[str, Any]:
        """Replace a stopped instance's boot disk: detach the one attached ``boot`` (if any)
        and attach ``new_disk`` (an existing disk of the zone) as its boot disk, index 0,
        ``deviceName`` the disk's name. Refused (``WireError`` 400) unless the instance is
        ``TERMINATED``, as Compute Engine refuses it; returns a copy of the instance's body."""
        with self._lock:
            project = project or self.project
            inst = self._stored("instances", project, zone, instance)
            new = self._stored("disks", project, zone, new_disk)
            _must_be_stopped(inst, "swap the boot disk of")
            _attachable(inst, new)  # before anything is detached: a refused swap changes nothing
            for attached in [d for d in inst.body.get("disks", []) if d.get("boot") is True]:
                self._detach(inst, str(attached.get("deviceName")))
            self._attach(inst, new, boot=True, auto_delete=auto_delete, device_name=new_disk)
            return _copy(inst.body)

    def get(self, collection: str, location: str, name: str, *, project: str | None = None) -> dict[str, Any] | None:
        """The stored JSON body (a copy) or ``None``; does not count as an API call."""
        with self._lock:
            stored = self._store[collection].get((project or self.project, location, name))
            return _copy(stored.body) if stored else None

    def names(self, collection: str, *, project: str | None = None) -> set[str]:
        with self._lock:
            return {n for (p, _, n) in self._store[collection] if p == (project or self.project)}

    def set_labels(self, collection: str, location: str, name: str, labels: dict[str, str], *,
                   project: str | None = None) -> None:
        with self._lock:
            stored = self._stored(collection, project, location, name)
            stored.body["labels"] = dict(labels)
            stored.body["labelFingerprint"] = _fingerprint(labels)

    def set_field(self, collection: str, location: str, name: str, field: str, value: Any, *,
                  project: str | None = None) -> None:
        """Set one top-level field of the stored JSON body to ``value``, as is (no
        checks: hostile shapes included); ``value`` ``...`` removes the field."""
        with self._lock:
            body = self._stored(collection, project, location, name).body
            if value is ...:
                body.pop(field, None)
            else:
                body[field] = value

    def set_status(self, collection: str, location: str, name: str, status: str, *,
                   project: str | None = None) -> None:
        with self._lock:
            self._stored(collection, project, location, name).body["status"] = status

    def remove(self, collection: str, location: str, name: str, *, project: str | None = None) -> None:
        """Delete a resource out of band (no API call), with the usual cascades."""
        with self._lock:
            self._drop(collection, project or self.project, location, name)

    def replace(self, collection: str, location: str, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Delete and re-create a resource under the same name: same body, new id."""
        with self._lock:
            stored = self._stored(collection, project, location, name)
            stored.body["id"] = str(self._new_id())
            stored.body["creationTimestamp"] = _now()
            stored.gets_left = None
            return _copy(stored.body)

    def add_project(self, project: str, *, number: str | None = None) -> str:
        """Make a project known to ``projects.get``; returns its number (its ``id``)."""
        with self._lock:
            self._projects[project] = number or self._projects.get(project) or project_number(project)
            return self._projects[project]

    def number_of(self, project: str | None = None) -> str:
        """The number of a known project (``KeyError`` otherwise)."""
        with self._lock:
            return self._projects[project or self.project]

    def deny_project(self, project: str | None = None) -> None:
        """``projects.get`` of that project (by id or number) answers 403, as for
        credentials without ``compute.projects.get`` on it; other calls are unaffected."""
        with self._lock:
            self._denied_projects.add(project or self.project)

    def make_unreachable(self, scope: str) -> None:
        with self._lock:
            self._unreachable.add(scope)

    def fail_region(self, scope: str, status: int = 503) -> None:
        with self._lock:
            self._failing[scope] = status

    # --- internals -----------------------------------------------------------------

    def _new_id(self) -> int:
        # 19-digit uint64 values, as Compute Engine hands out; never reused.
        return 4_100_000_000_000_000_000 + next(self._ids) * 7_919_000_013

    def _add(self, coll: str, name: str, location: str, labels: dict[str, str] | None,
             body: dict[str, Any], project: str | None, created: datetime | str | None = None,
             **meta: Any) -> dict[str, Any]:
        project = project or self.project
        scope = COLLECTIONS[coll]
        with self._lock:
            self.add_project(project)
            if scope == "zones":
                self._zones.add(location)
            if (project, location, name) in self._store[coll]:
                raise ValueError(f"{coll} {name} already exists in {location}")
            loc_key = "zone" if scope == "zones" else "region"
            body.update(id=str(self._new_id()), name=name, creationTimestamp=_timestamp(created),
                        labels=dict(labels or {}), labelFingerprint=_fingerprint(labels or {}),
                        selfLink=self_link(project, scope, location, coll, name))
            body[loc_key] = f"{GOOGLE_BASE}/projects/{project}/{scope}/{location}"
            self._store[coll][(project, location, name)] = _Stored(body, **meta)
            return _copy(body)

    def _read(self, coll: str, key: tuple[str, str, str], stored: _Stored) -> dict[str, Any] | None:
        """One read of a stored resource by the API (a ``get``, or a list pinned to its id):
        its body, or None when it is gone now (a ``STOPPING`` instance past its reads)."""
        if stored.gets_left is not None:
            if stored.gets_left <= 0:
                self._drop(coll, *key)
                return None
            stored.gets_left -= 1
        return stored.body

    def _stored(self, coll: str, project: str | None, location: str, name: str) -> _Stored:
        stored = self._store[coll].get((project or self.project, location, name))
        if stored is None:
            raise KeyError(f"no {coll} {name} in {location}")
        return stored

    def _attach(self, inst: _Stored, disk: _Stored, *, boot: bool, auto_delete: bool,
                device_name: str | None) -> None:
        """``instances.attachDisk``'s checks (read-write attachments only), then ``_link``."""
        _attachable(inst, disk)
        attached = inst.body.get("disks", [])
        if boot:
            _must_be_stopped(inst, "attach a boot disk to")
            if any(d.get("boot") is True for d in attached):
                raise WireError(400, f"Instance '{inst.body['name']}' already has a boot disk")
        if device_name is not None and any(d.get("deviceName") == device_name for d in attached):
            raise WireError(400, f"Invalid value for field 'resource.deviceName': '{device_name}'. "
                                 "The device name is already in use.")
        self._link(inst, disk, boot=boot, auto_delete=auto_delete, device_name=device_name)

    def _link(self, inst: _Stored, disk: _Stored, *, boot: bool, auto_delete: bool,
              device_name: str | None) -> None:
        """Record an attachment on both sides: the instance's ``disks[]`` entry (index 0 for
        a boot disk, the next free one otherwise) and the disk's ``users``."""
        attached = inst.body.setdefault("disks", [])
        taken = [d["index"] for d in attached if isinstance(d.get("index"), int)]
        index = 0 if boot else max([1, *(i + 1 for i in taken)])
        attached.append({"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE",
                         "source": disk.body["selfLink"], "deviceName": device_name or f"persistent-disk-{index}",
                         "index": index, "boot": boot, "autoDelete": auto_delete, "interface": "SCSI",
                         "diskSizeGb": disk.body.get("sizeGb", "10")})
        disk.body.setdefault("users", []).append(inst.body["selfLink"])
        disk.body["lastAttachTimestamp"] = _now()

    def _detach(self, inst: _Stored, device_name: str) -> None:
        """``instances.detachDisk``: the attachment named ``device_name`` goes from the
        instance, the instance from the disk's ``users``; a boot disk only while stopped."""
        attached = inst.body.get("disks", [])
        found = [d for d in attached if d.get("deviceName") == device_name]
        if not found:
            raise WireError(400, f"Invalid value for field 'deviceName': '{device_name}'. "
                                 f"No attached disk found with device name '{device_name}'.")
        if found[0].get("boot") is True:
            _must_be_stopped(inst, "detach the boot disk of")
        attached.remove(found[0])
        where = DISK_SOURCE.search(str(found[0].get("source") or ""))
        disk = self._store["disks"].get((where.group(1), where.group(2), where.group(3))) if where else None
        if disk is not None:
            users = disk.body.get("users") or []
            if inst.body["selfLink"] in users:
                users.remove(inst.body["selfLink"])
            disk.body["lastDetachTimestamp"] = _now()

    def _drop(self, coll: str, project: str, location: str, name: str) -> None:
        stored = self._store[coll].pop((project, location, name), None)
        if stored is not None and coll == "forwardingRules":
            self._release(stored.body["selfLink"])
        if stored is None or coll != "instances":
            return
        link = stored.body["selfLink"]
        auto = {d.get("source") for d in stored.body.get("disks", []) if d.get("autoDelete")}  # SCRATCH: none
        for (p, loc, n), disk in list(self._store["disks"].items()):
            if link in disk.body.get("users", []):
                disk.body["users"].remove(link)
                if disk.body["selfLink"] in auto:
                    self._store["disks"].pop((p, loc, n))
        self._release(link)

    def _release(self, link: str) -> None:
        """A user (instance, forwarding rule) is gone: the addresses it held no longer name it."""
        for addr in self._store["addresses"].values():
            if link in addr.body.get("users", []):
                addr.body["users"].remove(link)
                if not addr.body["users"]:
                    addr.body["status"] = "RESERVED"

    def _locations(self, scope: str) -> list[str]:
        return sorted(self._zones if scope == "zones" else {region_of(z) for z in self._zones})

    def _known(self, scope: str, location: str) -> bool:
        return location in self._locations(scope)

    def _matches(self, scopes: set[str] | dict[str, int], location: str) -> str | None:
        for s in (location, region_of(location)):
            if s in scopes:
                return s
        return None


def _copy(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(body))


def _poll(entry: list[Any] | None, method: str, wait: str | None, path: str) -> dict[str, Any]:
    """``operations.get`` (GET) or ``operations.wait`` (POST .../wait) of a recorded
    ``[operation, polls left]``: DONE once its polls are used up. 404 when there is no such
    operation or the verb does not match the path."""
    if entry is None or (method == "POST") != bool(wait):
        raise WireError(404, f"The resource '{path}' was not found")
    op, polls = entry
    if polls > 0:
        entry[1] = polls - 1
    else:
        op.update(status="DONE", progress=100, endTime=_now())
    return dict(op)


def _now() -> str:
    return datetime.now(_PACIFIC).isoformat(timespec="milliseconds")


def _timestamp(created: datetime | str | None) -> str:
    """A ``creationTimestamp``: now (default), an aware datetime as the API writes it, or a
    string as is (hostile shapes included)."""
    if created is None:
        return _now()
    if isinstance(created, str):
        return created
    if created.tzinfo is None:
        raise ValueError("created must be timezone-aware: Compute Engine writes an offset")
    return created.isoformat(timespec="milliseconds")


#: ``.../projects/P/zones/Z/disks/N`` (full URL or partial): an attached disk's ``source``.
DISK_SOURCE = re.compile(r"(?:^|/)projects/([^/]+)/zones/([^/]+)/disks/([^/]+)$")


def link_path(link: str) -> str:
    """``https://.../compute/v1/projects/p/zones/z/disks/d`` -> ``projects/p/zones/z/disks/d``."""
    at = link.find("projects/")
    return link[at:] if at >= 0 else link


def _attachable(inst: _Stored, disk: _Stored) -> None:
    """A disk can be attached to an instance of its zone, and only while no instance uses it
    (the fake attaches read-write only)."""
    what = f"The disk resource '{link_path(disk.body['selfLink'])}'"
    if disk.body.get("zone") != inst.body.get("zone"):
        raise WireError(400, f"{what} is not in the zone of instance '{inst.body['name']}'")
    if users := disk.body.get("users"):
        raise WireError(400, f"{what} is already being used by '{link_path(users[0])}'",
                        "resourceInUseByAnotherResource")


def _must_be_stopped(inst: _Stored, doing: str) -> None:
    if inst.body.get("status") != "TERMINATED":
        raise WireError(400, f"Cannot {doing} instance '{inst.body['name']}' while it is "
                             f"{inst.body.get('status')}: stop it first.")


def _fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:12]
