"""Request routing of the fake Compute Engine server (see ``gcp_fake``): the
v1 paths, list filtering and paging, get/delete semantics, operations, and
``instances.attachDisk``/``instances.detachDisk`` (zonal operations of type
``attachDisk``/``detachDisk``; the rules are ``gcp_fake_state``'s).

A list whose ``filter`` pins a numeric id (``id = N``) is a read by id: it needs no
``labels.KEY`` term (it is as narrow as a get), finds the resource whatever its labels,
and counts as one read of it, exactly like a ``get`` (``gcp_fake_state``)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tests.support.gcp_fake_images import FakeImages
from tests.support.gcp_fake_state import COLLECTIONS, DISK_SOURCE, SINGULAR, _copy, _poll, _Stored
from tests.support.gcp_fake_wire import (
    GOOGLE_BASE,
    ListFilter,
    WireError,
    aggregated_page,
    operation_body,
    page_params,
    parse_filter,
    project_body,
    scope_warning,
    strip_empty,
)

_PREFIX = r"^/compute/v1/projects/(?P<project>[^/]+)"
_SCOPED = _PREFIX + r"/(?P<scope>zones|regions)/(?P<loc>[^/]+)"
_COLL = r"(?P<coll>instances|disks|addresses|forwardingRules)"
_ROUTES = [
    ("project", re.compile(_PREFIX + "$")),
    ("aggregated", re.compile(_PREFIX + r"/aggregated/" + _COLL + "$")),
    ("operation", re.compile(_SCOPED + r"/operations/(?P<name>[^/]+?)(?P<wait>/wait)?$")),
    ("list", re.compile(_SCOPED + "/" + _COLL + "$")),
    ("item", re.compile(_SCOPED + "/" + _COLL + r"/(?P<name>[^/]+)$")),
    ("disk_verb", re.compile(_SCOPED + r"/(?P<coll>instances)/(?P<name>[^/]+)/(?P<verb>attachDisk|detachDisk)$")),
]


class FakeApi(FakeImages):
    """``dispatch(method, path, query)`` -> JSON body, or ``WireError``. Call with the lock held."""

    def dispatch(self, method: str, path: str, query: dict[str, str], body: bytes = b"") -> dict[str, Any]:
        if (answer := self.dispatch_snapshots(method, path, query, body)) is not None:
            return answer
        if (answer := self.dispatch_images(method, path, query, body)) is not None:
            return answer
        for kind, rx in _ROUTES:
            m = rx.match(path)
            if m is None:
                continue
            args = m.groupdict()
            if kind not in ("aggregated", "project"):
                if args.get("coll") and COLLECTIONS[args["coll"]] != args["scope"]:
                    break
                if not self._known(args["scope"], args["loc"]):
                    where = f"projects/{args['project']}/{args['scope']}/{args['loc']}"
                    raise WireError(404, f"The resource '{where}' was not found")
                if (hit := self._matches(self._failing, args["loc"])) is not None:
                    raise WireError(self._failing[hit], f"Injected failure of {hit}")
            handler = getattr(self, f"_on_{kind}")
            return handler(method, query, body, **args)
        raise WireError(404, f"The requested URL {path} was not found on this server.")

    def _filter(self, query: dict[str, str]) -> ListFilter:
        """The list call's ``filter``; with ``require_label_filter``, one that names no label
        key and pins no id is refused (a listing that forgot its label filter)."""
        text = query.get("filter", "")
        if not text:
            if self.require_label_filter:
                raise WireError(400, "This fake requires a 'filter' with a labels.KEY or id term on list calls.")
            return ListFilter(lambda item: True, frozenset(), frozenset())
        parsed = parse_filter(text)
        if self.require_label_filter and not parsed.label_keys and not parsed.ids:
            raise WireError(400, "This fake requires a labels.KEY or id = N term in 'filter' on list calls.")
        return parsed

    def _predicate(self, query: dict[str, str]) -> Any:
        return self._filter(query).predicate

    def _listed(self, coll: str, project: str, loc: str, flt: ListFilter) -> list[dict[str, Any]]:
        """The bodies of ``coll`` in ``loc`` that ``flt`` matches, by name; a list pinned to
        an id reads each match as a get does (``_read``)."""
        rows = sorted((n, s) for (p, where, n), s in self._store[coll].items() if (p, where) == (project, loc))
        found = []
        for name, stored in rows:
            if not flt.predicate(stored.body):
                continue
            body = self._read(coll, (project, loc, name), stored) if flt.ids else stored.body
            if body is not None:
                found.append(body)
        return found

    def _render(self, stored: _Stored) -> dict[str, Any]:
        return _render_body(stored.body)

    def _on_project(self, method: str, query: dict[str, str], body: bytes, project: str) -> dict[str, Any]:
        if method != "GET":
            raise WireError(405, "Method not allowed")
        found = [(p, n) for p, n in self._projects.items() if project in (p, n)]
        if not found:
            raise WireError(404, f"The resource 'projects/{project}' was not found")
        name, number = found[0]
        if {project, name, number} & self._denied_projects:
            raise WireError(403, f"Required 'compute.projects.get' permission for 'projects/{project}'")
        return project_body(name, number)

    def _on_aggregated(self, method: str, query: dict[str, str], body: bytes, project: str,
                       coll: str) -> dict[str, Any]:
        if method != "GET":
            raise WireError(405, "Method not allowed")
        flt = self._filter(query)
        offset, size = page_params(query)
        scope = COLLECTIONS[coll]
        units: list[tuple[str, str, dict[str, Any]]] = []
        for loc in self._locations(scope):
            key = f"{scope}/{loc}"
            if self._matches(self._unreachable, loc) or self._matches(self._failing, loc):
                units.append((key, "warning", scope_warning("UNREACHABLE", key, f"Scope '{key}' is unreachable.")))
                continue
            found = self._listed(coll, project, loc, flt)
            units.extend((key, "item", b) for b in found)
            if not found:
                units.append((key, "warning", scope_warning(
                    "NO_RESULTS_ON_PAGE", key, f"There are no results for scope '{key}' on this page.")))
        items, token = aggregated_page(units, coll, offset, size, render=_render_body)
        answer: dict[str, Any] = {
            "kind": f"compute#{SINGULAR[coll]}AggregatedList", "id": f"projects/{project}/aggregated/{coll}",
            "items": items, "selfLink": f"{GOOGLE_BASE}/projects/{project}/aggregated/{coll}",
        }
        unreachable = [k for k, v in items.items() if v.get("warning", {}).get("code") == "UNREACHABLE"]
        if unreachable:
            answer["unreachables"] = unreachable
        if token:
            answer["nextPageToken"] = token
        return answer

    def _on_list(self, method: str, query: dict[str, str], body: bytes, project: str, scope: str, loc: str,
                 coll: str) -> dict[str, Any]:
        if method == "POST" and coll == "forwardingRules":
            return self._insert_rule(project, loc, body)
        if method != "GET":
            raise WireError(405, "Insert is not supported by this fake")
        flt = self._filter(query)
        offset, size = page_params(query)
        items = self._listed(coll, project, loc, flt)
        page, token = aggregated_page([(loc, "item", b) for b in items], coll, offset, size, render=_render_body)
        answer: dict[str, Any] = {"kind": f"compute#{SINGULAR[coll]}List",
                                  "items": page.get(loc, {}).get(coll, []),
                                  "selfLink": f"{GOOGLE_BASE}/projects/{project}/{scope}/{loc}/{coll}"}
        if token:
            answer["nextPageToken"] = token
        return answer

    def _insert_rule(self, project: str, region: str, body: bytes) -> dict[str, Any]:
        """``forwardingRules.insert`` (body: a ForwardingRule with ``name``, ``IPAddress`` (an
        address of the region, by IP or by its link), ``target``, ``labels``): a regional
        operation; the address it names becomes in use."""
        try:
            wanted = json.loads(body or b"{}")
        except ValueError as e:
            raise WireError(400, "Invalid JSON payload received.") from e
        name = wanted.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", name):
            raise WireError(400, f"Invalid value for field 'resource.name': '{name}'.")
        if (project, region, name) in self._store["forwardingRules"]:
            raise WireError(409, f"The resource 'projects/{project}/regions/{region}/forwardingRules/{name}' "
                                 "already exists", "alreadyExists")
        ip = str(wanted.get("IPAddress") or "")
        address = next((n for (p, loc, n), a in self._store["addresses"].items() if (p, loc) == (project, region)
                        and ip in (a.body.get("address"), a.body.get("selfLink"))), None)
        if address is not None and self._store["addresses"][(project, region, address)].body.get("users"):
            raise WireError(400, f"The address '{ip}' is already being used", "resourceInUseByAnotherResource")
        rule = self.add_forwarding_rule(name, region=region, labels=wanted.get("labels") or {}, address=address,
                                        ip=None if address else ip or None, target=wanted.get("target"),
                                        project=project)
        op_name = f"operation-{next(self._ids)}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
        op = operation_body(project, "regions", region, op_name, str(self._new_id()), rule, "RUNNING", "insert")
        self._ops[(project, "regions", region, op_name)] = [op, self.operation_polls]
        return dict(op)

    def _on_item(self, method: str, query: dict[str, str], body: bytes, project: str, scope: str, loc: str,
                 coll: str, name: str) -> dict[str, Any]:
        key = (project, loc, name)
        stored = self._store[coll].get(key)
        what = f"projects/{project}/{scope}/{loc}/{coll}/{name}"
        if stored is None:
            raise WireError(404, f"The resource '{what}' was not found")
        if method == "GET":
            if self._read(coll, key, stored) is None:
                raise WireError(404, f"The resource '{what}' was not found")
            return self._render(stored)
        if method != "DELETE":
            raise WireError(405, "Method not allowed")
        if coll != "instances" and stored.body.get("users"):
            raise WireError(400, f"The {SINGULAR[coll]} resource '{what}' is already being used by "
                                 f"'{stored.body['users'][0]}'", "resourceInUseByAnotherResource")
        target = dict(stored.body)
        if coll == "instances" and not stored.ignore_delete and stored.gets_left is None:
            wait = self.delete_stopping_gets if stored.stopping_gets is None else stored.stopping_gets
            if wait > 0:
                stored.body["status"], stored.gets_left = "STOPPING", wait
            else:
                self._drop(coll, *key)
        elif coll != "instances":
            self._drop(coll, *key)
        op_name = f"operation-{next(self._ids)}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
        op = operation_body(project, scope, loc, op_name, str(self._new_id()), target, "RUNNING")
        self._ops[(project, scope, loc, op_name)] = [op, self.operation_polls]
        return dict(op)

    def _on_operation(self, method: str, query: dict[str, str], body: bytes, project: str, scope: str, loc: str,
                      name: str, wait: str | None) -> dict[str, Any]:
        return _poll(self._ops.get((project, scope, loc, name)), method, wait,
                     f"projects/{project}/{scope}/{loc}/operations/{name}")

    def _on_disk_verb(self, method: str, query: dict[str, str], body: bytes, project: str, scope: str, loc: str,
                      coll: str, name: str, verb: str) -> dict[str, Any]:
        """``instances.attachDisk`` (body: an AttachedDisk; ``source`` a full or partial disk
        URL of the instance's zone) and ``instances.detachDisk`` (query ``deviceName``)."""
        if method != "POST":
            raise WireError(405, "Method not allowed")
        inst = self._store["instances"].get((project, loc, name))
        if inst is None:
            raise WireError(404, f"The resource 'projects/{project}/zones/{loc}/instances/{name}' was not found")
        if verb == "detachDisk":
            if not query.get("deviceName"):
                raise WireError(400, "Required field 'deviceName' not specified")
            self._detach(inst, query["deviceName"])
        else:
            try:
                wanted = json.loads(body or b"{}")
            except ValueError as e:
                raise WireError(400, "Invalid JSON payload received.") from e
            where = DISK_SOURCE.search(str(wanted.get("source") or ""))
            if where is None:
                raise WireError(400, f"Invalid value for field 'resource.source': '{wanted.get('source')}'.")
            disk = self._store["disks"].get((where.group(1), where.group(2), where.group(3)))
            if disk is None:
                raise WireError(404, f"The resource '{where.group(0).lstrip('/')}' was not found")
            self._attach(inst, disk, boot=wanted.get("boot") is True, auto_delete=wanted.get("autoDelete") is True,
                         device_name=wanted.get("deviceName") or None)
        op_name = f"operation-{next(self._ids)}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
        op = operation_body(project, scope, loc, op_name, str(self._new_id()), inst.body, "RUNNING", verb)
        self._ops[(project, scope, loc, op_name)] = [op, self.operation_polls]
        return dict(op)



def _render_body(body: dict[str, Any]) -> dict[str, Any]:
    """A stored body as the API shows it: a copy, without empty labels/users."""
    return strip_empty(_copy(body))
