"""The Compute Engine calls the GCP adapter makes, each with a timeout and
errors translated to ours. Clients are injected; nothing here reads the
environment or creates a client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud.compute_v1.types import compute

from orphan_cleanup.core.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderTimeout,
    ResourceNotFound,
)
from orphan_cleanup.core.journal import NO_JOURNAL, Journal, journaled
from orphan_cleanup.providers.gcp.errors import (
    IN_USE_OP_CODES,
    NOT_FOUND_OP_CODES,
    gcp_errors,
    is_throttle,
    translate,
)
from orphan_cleanup.providers.gcp.kinds import GcpKind
from orphan_cleanup.providers.ratelimit import DESCRIBE, MUTATE, RateLimits, TokenBucket

DONE = compute.Operation.Status.DONE


def read_retry(timeout: float, on_throttle: Callable[[], None] | None = None) -> Retry:
    """Reads retry on throttling only (429, or 403 ``rateLimitExceeded``), within
    ``timeout`` in total. A 503 or a timeout is not retried: the region is skipped
    for this cycle (seed 004). ``on_throttle`` runs before each retry (``GcpCalls``:
    the bucket slows down and the retry takes a token)."""

    def predicate(exc: Exception) -> bool:
        if not is_throttle(exc):
            return False
        if on_throttle is not None:
            on_throttle()
        return True

    return Retry(predicate=predicate, initial=0.5, maximum=4.0, multiplier=2.0, timeout=timeout)


class GcpCalls:
    """Get, find by id, delete (and wait), aggregated list, for the kinds of ``kinds``;
    and the project read of the identity check.

    ``clients`` maps ``GcpKind.client`` (``instances``/``disks``/``addresses``/``snapshots``/
    ``forwarding_rules``/``images``, plus ``projects``; a kind whose client is missing fails
    every call of it) and ``operations`` maps ``GcpKind.scope`` (``zone``/``region``/``global``) to the SDK
    clients. ``retry`` applies to reads (``None``: no retries).

    With ``limits``, every request (each page, each retry, each operation wait) takes
    a token of the project's bucket for its class (reads: ``describe``; deletes and
    snapshots: ``mutate``); use ``read_retry(timeout, calls.on_throttle)`` as ``retry``
    so that a throttled read slows the bucket down before it is retried.
    """

    def __init__(
        self,
        project: str,
        clients: Mapping[str, Any],
        operations: Mapping[str, Any],
        *,
        timeout: float,
        operation_timeout: float,
        page_size: int,
        retry: Retry | None,
        poll_interval: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        limits: RateLimits | None = None,
    ) -> None:
        self.project = project
        self._limits = limits
        self._clients = {name: _Missing(name) if client is None else client for name, client in clients.items()}
        self._operations = dict(operations)
        self.timeout = timeout
        self.operation_timeout = operation_timeout
        self.page_size = page_size
        self.retry = retry
        self.poll_interval = poll_interval
        self._sleep = sleep
        self._clock = clock

    def _bucket(self, api_class: str) -> TokenBucket | None:
        if self._limits is None:
            return None
        return self._limits.bucket(self.project, "global", "compute", api_class)

    def _take(self, api_class: str = DESCRIBE) -> None:
        """One token before a request (the project's quota counts every request)."""
        bucket = self._bucket(api_class)
        if bucket is not None:
            bucket.acquire()

    def on_throttle(self) -> None:
        """A read was refused for its rate and is about to be retried: slow the
        bucket down, and make the retry take a token like any request."""
        bucket = self._bucket(DESCRIBE)
        if bucket is not None:
            bucket.throttled()
            bucket.acquire()

    def _request(self, spec: GcpKind, location: str, name: str) -> dict[str, str]:
        if spec.scope == "global":  # snapshots, images: no zone or region in the request
            return {"project": self.project, spec.name_field: name}
        return {"project": self.project, spec.scope: location, spec.name_field: name}

    def project_name(self) -> str:
        """The ``name`` (project id) of the project these calls address, by ``projects.get``.

        Never "assume it is there": a 403 raises ``AccessDenied``, a 404 a plain
        ``ProviderError`` (not ``ResourceNotFound``, which deletion reads as done),
        any other failure its usual ``ProviderError`` subclass.
        """
        what = f"projects.get {self.project}"
        try:
            self._take()
            with gcp_errors(region=None):
                project = self._clients["projects"].get(
                    request={"project": self.project}, timeout=self.timeout, retry=self.retry
                )
        except ResourceNotFound as e:
            raise ProviderError(f"{what}: project not found ({_one_line(e)})") from e
        except AccessDenied as e:
            raise AccessDenied(f"{what}: access denied ({_one_line(e)})") from e
        except ProviderError as e:
            raise type(e)(f"{what}: {_one_line(e)}") from e
        if not project.name:
            raise ProviderError(f"{what}: the reply names no project")
        return str(project.name)

    def pages(self, spec: GcpKind, list_filter: str) -> Iterator[Any]:
        """Every page of the kind's aggregated list restricted by ``list_filter``.
        Raises ``ProviderError`` (subclasses) on any failed page."""
        request = {"project": self.project, "filter": list_filter, "max_results": self.page_size}
        with gcp_errors(region=None):
            self._take()
            pager = self._clients[spec.client].aggregated_list(
                request=request, timeout=self.timeout, retry=self.retry
            )
            yield from self._paced(pager.pages)

    def global_pages(self, spec: GcpKind, list_filter: str) -> Iterator[Any]:
        """Every page of a global kind's ``list`` (snapshots) restricted by ``list_filter``."""
        request = {"project": self.project, "filter": list_filter, "max_results": self.page_size}
        with gcp_errors(region=None):
            self._take()
            pager = self._clients[spec.client].list(request=request, timeout=self.timeout, retry=self.retry)
            yield from self._paced(pager.pages)

    def create_snapshot(self, disk: GcpKind, zone: str, name: str, snapshot: Mapping[str, Any], *,
                        target: str, journal: Journal = NO_JOURNAL) -> None:
        """``disks.createSnapshot`` of the disk ``name`` (numeric id ``target``, journaled:
        SAFETY.md rule 19) and wait for its operation, at most ``operation_timeout`` (the
        caller re-reads the snapshot: its status decides)."""
        with journaled(journal, "compute.disks.createSnapshot", target, region=zone):
            self._take(MUTATE)
            with gcp_errors(zone):
                op = self._clients[disk.client].create_snapshot_unary(
                    request={**self._request(disk, zone, name), "snapshot_resource": dict(snapshot)},
                    timeout=self.timeout, retry=None)
            self._wait(disk, zone, op)

    def _paced(self, pages: Iterator[Any]) -> Iterator[Any]:
        """The pager's pages, a token taken before each page after the first (fetched
        by the list call itself)."""
        for page in pages:
            yield page
            if page.next_page_token:
                self._take()

    def find(self, spec: GcpKind, location: str, resource_id: str) -> list[Any]:
        """The resources of ``location`` whose numeric id is ``resource_id``, by a ``list``
        filtered on ``id`` (the API's get and delete take names, and a name can be reused or
        changed: a read by id is a list narrowed to the id). Zero items: it does not exist
        there; the caller refuses anything but one item of that id."""
        if not resource_id.isdigit():
            raise ProviderError(f"{resource_id!r} is not a Compute Engine resource id", region=location)
        request: dict[str, Any] = {"project": self.project, "filter": f"id = {resource_id}"}
        if spec.scope != "global":
            request[spec.scope] = location
        with gcp_errors(location):
            self._take()
            pager = self._clients[spec.client].list(request=request, timeout=self.timeout, retry=self.retry)
            return [item for page in self._paced(pager.pages) for item in getattr(page, "items", ())]

    def get(self, spec: GcpKind, location: str, name: str) -> Any | None:
        """The resource named ``name`` now, or ``None`` when it does not exist (404)."""
        try:
            self._take()
            with gcp_errors(location):
                return self._clients[spec.client].get(
                    request=self._request(spec, location, name), timeout=self.timeout, retry=self.retry
                )
        except ResourceNotFound:
            return None

    def delete(self, spec: GcpKind, location: str, name: str, *, target: str, blast: Sequence[str] = (),
               journal: Journal = NO_JOURNAL) -> None:
        """Delete by name and wait for the operation, at most ``operation_timeout``; the
        call is journaled with its numeric id ``target`` and what the API deletes along
        with it (``blast``: an instance's auto-delete disks), SAFETY.md rule 19.

        Returns when the operation is done, or still running at the deadline
        (the caller confirms by re-reading). Already gone (404) returns quietly.
        Raises ``DependencyNotReady`` when the API says the resource is in use,
        another ``ProviderError`` when the call or the operation failed.
        """
        with journaled(journal, f"compute.{spec.collection}.delete", target, region=location, blast=blast) as entry:
            try:
                self._take(MUTATE)
                with gcp_errors(location):
                    op = self._clients[spec.client].delete_unary(
                        request=self._request(spec, location, name), timeout=self.timeout, retry=None
                    )
            except ResourceNotFound:
                entry.outcome = "gone"
                return
            self._wait(spec, location, op)

    def _wait(self, spec: GcpKind, location: str, op: Any) -> None:
        ops = self._operations[spec.scope]
        request = {"project": self.project, "operation": op.name}
        if spec.scope != "global":
            request[spec.scope] = location
        deadline = self._clock() + self.operation_timeout
        while op.status != DONE:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            try:
                self._take()
                with gcp_errors(location):
                    op = ops.wait(request=request, timeout=min(self.timeout, remaining), retry=self.retry)
            except ProviderTimeout:
                return
            if op.status != DONE:
                # ``wait`` blocks server side; this only guards against a busy loop.
                self._sleep(min(self.poll_interval, max(deadline - self._clock(), 0.0)))
        self._raise_for_operation(op, location)

    def _raise_for_operation(self, op: Any, location: str) -> None:
        codes = {e.code for e in op.error.errors}
        if not codes or codes & NOT_FOUND_OP_CODES:
            return
        text = f"operation {op.name} failed: {', '.join(sorted(codes))}"
        if codes & IN_USE_OP_CODES:
            raise DependencyNotReady(text, region=location)
        if op.http_error_status_code:
            raise translate(gexc.from_http_status(op.http_error_status_code, text), region=location)
        raise ProviderError(text, region=location)


class _Missing:
    """A client the provider was built without: any call of it fails (``ProviderError``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, method: str) -> Any:
        raise ProviderError(f"no {self.name} client: this provider was built without it")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
