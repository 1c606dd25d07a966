"""Images in the fake Compute Engine server (see ``gcp_fake``), in the v1 wire format:

- ``GET .../global/images`` (``filter`` with a ``labels.KEY`` or ``id = N`` term,
  ``maxResults``, ``pageToken``), ``POST .../global/images`` (``images.insert``: body an
  Image with ``name``, ``sourceDisk`` (a disk's full or partial link), ``labels``; a global
  operation);
- ``GET``/``DELETE .../global/images/NAME`` (the delete answers a global operation).

Images are global: keyed by ``(project, name)``; a name can be reused after a delete and
then gets a new id. Tests arrange them with ``add_image`` and shape them with
``set_image_field`` (hostile shapes included).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from tests.support.gcp_fake_snapshots import FakeSnapshots
from tests.support.gcp_fake_state import DISK_SOURCE, _copy, _fingerprint, _now
from tests.support.gcp_fake_wire import GOOGLE_BASE, WireError, aggregated_page, page_params, strip_empty

_PREFIX = r"^/compute/v1/projects/(?P<project>[^/]+)"
_ROUTES = [
    ("images", re.compile(_PREFIX + r"/global/images$")),
    ("image", re.compile(_PREFIX + r"/global/images/(?P<name>[^/]+)$")),
]
IMAGE_STATUSES = frozenset({"PENDING", "READY", "FAILED", "DELETING"})


class FakeImages(FakeSnapshots):
    """Global images; ``dispatch_images`` answers their routes."""

    def reset(self) -> None:
        with self._lock:
            super().reset()
            self._images: dict[tuple[str, str], dict[str, Any]] = {}

    # --- arranging state ---------------------------------------------------------------

    def add_image(self, name: str, *, disk: dict[str, Any] | None = None, zone: str = "us-central1-a",
                  labels: dict[str, str] | None = None, status: str = "READY",
                  created: datetime | None = None, project: str | None = None,
                  source_disk: str | None = None) -> dict[str, Any]:
        """Store an image made from ``disk`` (a body ``add_disk`` returned; default: a disk
        named ``NAME-src`` of ``zone`` that no longer exists); ``source_disk=""`` makes one
        from no disk (a file or a snapshot: no ``sourceDisk``). Returns a copy of its body."""
        if status not in IMAGE_STATUSES:
            raise ValueError(f"unknown image status {status}")
        with self._lock:
            project = project or self.project
            if (project, name) in self._images:
                raise ValueError(f"image {name} already exists")
            source = disk or {"selfLink": source_disk if source_disk is not None
                              else f"{GOOGLE_BASE}/projects/{project}/zones/{zone}/disks/{name}-src",
                              "id": str(self._new_id()), "sizeGb": "10"}
            body = self._image_body(project, name, source, labels or {}, status)
            if created is not None:
                body["creationTimestamp"] = created.isoformat(timespec="milliseconds")
            self._images[(project, name)] = body
            return _copy(body)

    def image(self, name: str, *, project: str | None = None) -> dict[str, Any] | None:
        """The stored image body (a copy) or ``None``; not an API call."""
        with self._lock:
            body = self._images.get((project or self.project, name))
            return _copy(body) if body else None

    def image_names(self, *, project: str | None = None) -> set[str]:
        with self._lock:
            return {n for p, n in self._images if p == (project or self.project)}

    def set_image_field(self, name: str, field: str, value: Any, *, project: str | None = None) -> None:
        """Set one top-level field of an image's body as is; ``...`` removes it."""
        with self._lock:
            body = self._images[(project or self.project, name)]
            if value is ...:
                body.pop(field, None)
            else:
                body[field] = value

    def replace_image(self, name: str, *, project: str | None = None) -> dict[str, Any]:
        """Delete and re-create an image under the same name: same body, new id."""
        with self._lock:
            body = self._images[(project or self.project, name)]
            body.update(id=str(self._new_id()), creationTimestamp=_now())
            return _copy(body)

    # --- routes ------------------------------------------------------------------------

    def dispatch_images(self, method: str, path: str, query: dict[str, str], body: bytes) -> dict[str, Any] | None:
        """The JSON answer of an image route, or None when ``path`` is not one."""
        for kind, rx in _ROUTES:
            m = rx.match(path)
            if m is not None:
                return getattr(self, f"_on_{kind}")(method, query, body, **m.groupdict())
        return None

    def _on_images(self, method: str, query: dict[str, str], body: bytes, project: str) -> dict[str, Any]:
        if method == "POST":
            return self._insert_image(project, body)
        if method != "GET":
            raise WireError(405, "Method not allowed")
        pred = self._predicate(query)  # type: ignore[attr-defined]  # FakeApi's
        offset, size = page_params(query)
        items = [b for (p, _), b in sorted(self._images.items()) if p == project and pred(b)]
        page, token = aggregated_page([("global", "item", b) for b in items], "items", offset, size,
                                      render=lambda b: strip_empty(_copy(b), ("labels",)))
        out: dict[str, Any] = {"kind": "compute#imageList", "id": f"projects/{project}/global/images",
                               "items": page.get("global", {}).get("items", []),
                               "selfLink": f"{GOOGLE_BASE}/projects/{project}/global/images"}
        if token:
            out["nextPageToken"] = token
        return out

    def _insert_image(self, project: str, body: bytes) -> dict[str, Any]:
        try:
            wanted = json.loads(body or b"{}")
        except ValueError as e:
            raise WireError(400, "Invalid JSON payload received.") from e
        name = wanted.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", name):
            raise WireError(400, f"Invalid value for field 'resource.name': '{name}'.")
        if (project, name) in self._images:
            raise WireError(409, f"The resource 'projects/{project}/global/images/{name}' already exists",
                            "alreadyExists")
        where = DISK_SOURCE.search(str(wanted.get("sourceDisk") or ""))
        disk = self._store["disks"].get((where.group(1), where.group(2), where.group(3))) if where else None
        if disk is None:
            raise WireError(400, f"Invalid value for field 'resource.sourceDisk': '{wanted.get('sourceDisk')}'.")
        stored = self._image_body(project, name, disk.body, wanted.get("labels") or {}, "READY")
        self._images[(project, name)] = stored
        op = self._op(project, stored, "insert", scope=None)
        self._global_ops[(project, op["name"])] = [op, self.operation_polls]
        return dict(op)

    def _on_image(self, method: str, query: dict[str, str], body: bytes, project: str, name: str) -> dict[str, Any]:
        stored = self._images.get((project, name))
        if stored is None:
            raise WireError(404, f"The resource 'projects/{project}/global/images/{name}' was not found")
        if method == "GET":
            return strip_empty(_copy(stored), ("labels",))
        if method != "DELETE":
            raise WireError(405, "Method not allowed")
        del self._images[(project, name)]
        op = self._op(project, stored, "delete", scope=None)
        self._global_ops[(project, op["name"])] = [op, self.operation_polls]
        return dict(op)

    # --- internals ---------------------------------------------------------------------

    def _image_body(self, project: str, name: str, disk: dict[str, Any], labels: dict[str, str],
                    status: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "compute#image", "id": str(self._new_id()), "name": name, "creationTimestamp": _now(),
            "status": status, "sourceType": "RAW", "diskSizeGb": disk.get("sizeGb", "10"),
            "archiveSizeBytes": "0", "storageLocations": ["us"], "labels": dict(labels),
            "labelFingerprint": _fingerprint(labels),
            "selfLink": f"{GOOGLE_BASE}/projects/{project}/global/images/{name}"}
        if disk.get("selfLink"):
            body.update(sourceDisk=disk["selfLink"], sourceDiskId=disk["id"])
        return body
