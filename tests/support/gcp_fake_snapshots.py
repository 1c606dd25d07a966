"""Snapshots in the fake Compute Engine server (see ``gcp_fake``), in the v1 wire format:

- ``POST .../zones/Z/disks/D/createSnapshot`` (body: a Snapshot with ``name``, ``labels``,
  ``description``) answers a zonal operation; the snapshot gets ``snapshot_status``
  (default ``READY``; ``CREATING`` to keep it being taken), ``sourceDisk``/``sourceDiskId``
  of the disk; a name in use answers 409 ``alreadyExists``;
- ``GET .../global/snapshots`` (``filter`` with a ``labels.KEY`` term, ``maxResults``,
  ``pageToken``), ``GET``/``DELETE .../global/snapshots/NAME`` (the delete answers a
  global operation); ``GET``/``POST .../global/operations/NAME[/wait]``.

Snapshots are global: keyed by ``(project, name)``. Tests arrange them with
``add_snapshot`` (``created=`` backdates ``creationTimestamp``) and shape them with
``set_snapshot_field`` (hostile shapes included).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Any

from tests.support.gcp_fake_state import FakeState, _copy, _fingerprint, _now, _poll
from tests.support.gcp_fake_wire import GOOGLE_BASE, WireError, aggregated_page, page_params, strip_empty

_PREFIX = r"^/compute/v1/projects/(?P<project>[^/]+)"
_ROUTES = [
    ("create", re.compile(_PREFIX + r"/zones/(?P<zone>[^/]+)/disks/(?P<disk>[^/]+)/createSnapshot$")),
    ("snapshots", re.compile(_PREFIX + r"/global/snapshots$")),
    ("snapshot", re.compile(_PREFIX + r"/global/snapshots/(?P<name>[^/]+)$")),
    ("global_op", re.compile(_PREFIX + r"/global/operations/(?P<name>[^/]+?)(?P<wait>/wait)?$")),
]
SNAPSHOT_STATUSES = frozenset({"CREATING", "UPLOADING", "READY", "FAILED", "DELETING"})


class FakeSnapshots(FakeState):
    """Global snapshots and operations; ``dispatch_snapshots`` answers their routes."""

    def reset(self) -> None:
        with self._lock:
            super().reset()
            self.snapshot_status = "READY"
            self._snapshots: dict[tuple[str, str], dict[str, Any]] = {}
            self._global_ops: dict[tuple[str, str], list[Any]] = {}

    # --- arranging state ---------------------------------------------------------------

    def add_snapshot(self, name: str, *, disk: dict[str, Any] | None = None, zone: str = "us-central1-a",
                     labels: dict[str, str] | None = None, status: str = "READY",
                     created: datetime | None = None, project: str | None = None) -> dict[str, Any]:
        """Store a snapshot of ``disk`` (a body ``add_disk`` returned; default: a disk named
        ``NAME-src`` of ``zone`` that no longer exists); returns a copy of its body."""
        with self._lock:
            project = project or self.project
            source = disk or {"selfLink": f"{GOOGLE_BASE}/projects/{project}/zones/{zone}/disks/{name}-src",
                              "id": str(self._new_id()), "sizeGb": "10"}
            body = self._snapshot_body(project, name, source, labels or {}, status, "")
            if created is not None:
                body["creationTimestamp"] = created.isoformat(timespec="milliseconds")
            self._snapshots[(project, name)] = body
            return _copy(body)

    def snapshot(self, name: str, *, project: str | None = None) -> dict[str, Any] | None:
        """The stored snapshot body (a copy) or ``None``; not an API call."""
        with self._lock:
            body = self._snapshots.get((project or self.project, name))
            return _copy(body) if body else None

    def snapshot_names(self, *, project: str | None = None) -> set[str]:
        with self._lock:
            return {n for p, n in self._snapshots if p == (project or self.project)}

    def set_snapshot_field(self, name: str, field: str, value: Any, *, project: str | None = None) -> None:
        """Set one top-level field of a snapshot's body as is; ``...`` removes it."""
        with self._lock:
            body = self._snapshots[(project or self.project, name)]
            if value is ...:
                body.pop(field, None)
            else:
                body[field] = value

    # --- routes ------------------------------------------------------------------------

    def dispatch_snapshots(self, method: str, path: str, query: dict[str, str],
                           body: bytes) -> dict[str, Any] | None:
        """The JSON answer of a snapshot route, or None when ``path`` is not one."""
        for kind, rx in _ROUTES:
            m = rx.match(path)
            if m is not None:
                return getattr(self, f"_on_{kind}")(method, query, body, **m.groupdict())
        return None

    def _on_create(self, method: str, query: dict[str, str], body: bytes, project: str, zone: str,
                   disk: str) -> dict[str, Any]:
        if method != "POST":
            raise WireError(405, "Method not allowed")
        stored = self._store["disks"].get((project, zone, disk))
        if stored is None:
            raise WireError(404, f"The resource 'projects/{project}/zones/{zone}/disks/{disk}' was not found")
        try:
            wanted = json.loads(body or b"{}")
        except ValueError as e:
            raise WireError(400, "Invalid JSON payload received.") from e
        name = wanted.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", name):
            raise WireError(400, f"Invalid value for field 'resource.name': '{name}'.")
        if (project, name) in self._snapshots:
            raise WireError(409, f"The resource 'projects/{project}/global/snapshots/{name}' already exists",
                            "alreadyExists")
        labels = wanted.get("labels") or {}
        self._snapshots[(project, name)] = self._snapshot_body(
            project, name, stored.body, labels, self.snapshot_status, str(wanted.get("description", "")))
        op = self._op(project, stored.body, "createSnapshot", scope=("zones", zone))
        self._ops[(project, "zones", zone, op["name"])] = [op, self.operation_polls]
        return dict(op)

    def _on_snapshots(self, method: str, query: dict[str, str], body: bytes, project: str) -> dict[str, Any]:
        if method != "GET":
            raise WireError(405, "Insert is not supported by this fake")
        pred = self._predicate(query)  # type: ignore[attr-defined]  # FakeApi's
        offset, size = page_params(query)
        items = [b for (p, _), b in sorted(self._snapshots.items()) if p == project and pred(b)]
        page, token = aggregated_page([("global", "item", b) for b in items], "items", offset, size,
                                      render=lambda b: strip_empty(_copy(b), ("labels",)))
        out: dict[str, Any] = {"kind": "compute#snapshotList", "id": f"projects/{project}/global/snapshots",
                               "items": page.get("global", {}).get("items", []),
                               "selfLink": f"{GOOGLE_BASE}/projects/{project}/global/snapshots"}
        if token:
            out["nextPageToken"] = token
        return out

    def _on_snapshot(self, method: str, query: dict[str, str], body: bytes, project: str,
                     name: str) -> dict[str, Any]:
        stored = self._snapshots.get((project, name))
        if stored is None:
            raise WireError(404, f"The resource 'projects/{project}/global/snapshots/{name}' was not found")
        if method == "GET":
            return strip_empty(_copy(stored), ("labels",))
        if method != "DELETE":
            raise WireError(405, "Method not allowed")
        del self._snapshots[(project, name)]
        op = self._op(project, stored, "delete", scope=None)
        self._global_ops[(project, op["name"])] = [op, self.operation_polls]
        return dict(op)

    def _on_global_op(self, method: str, query: dict[str, str], body: bytes, project: str, name: str,
                      wait: str | None) -> dict[str, Any]:
        return _poll(self._global_ops.get((project, name)), method, wait,
                     f"projects/{project}/global/operations/{name}")

    # --- internals ---------------------------------------------------------------------

    def _snapshot_body(self, project: str, name: str, disk: dict[str, Any], labels: dict[str, str],
                       status: str, description: str) -> dict[str, Any]:
        return {"kind": "compute#snapshot", "id": str(self._new_id()), "name": name, "description": description,
                "creationTimestamp": _now(), "status": status, "sourceDisk": disk["selfLink"],
                "sourceDiskId": disk["id"], "diskSizeGb": disk.get("sizeGb", "10"), "storageBytes": "0",
                "storageLocations": ["us"], "labels": dict(labels), "labelFingerprint": _fingerprint(labels),
                "selfLink": f"{GOOGLE_BASE}/projects/{project}/global/snapshots/{name}"}

    def _op(self, project: str, target: dict[str, Any], op_type: str,
            scope: tuple[str, str] | None) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}-{hashlib.sha1(target['selfLink'].encode()).hexdigest()[:8]}"
        where = f"{scope[0]}/{scope[1]}" if scope else "global"
        op: dict[str, Any] = {"kind": "compute#operation", "id": str(self._new_id()), "name": name,
                              "operationType": op_type, "targetLink": target["selfLink"], "targetId": target["id"],
                              "status": "RUNNING", "progress": 0, "insertTime": _now(),
                              "selfLink": f"{GOOGLE_BASE}/projects/{project}/{where}/operations/{name}"}
        if scope:
            op["zone"] = f"{GOOGLE_BASE}/projects/{project}/{scope[0]}/{scope[1]}"
        return op
