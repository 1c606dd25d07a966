"""The Compute Engine calls the GCP adapter makes, each with a timeout and
errors translated to ours. Clients are injected; nothing here reads the
environment or creates a client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud.compute_v1.types import compute

from orphan_cleanup.errors import (
    AccessDenied,
    DependencyNotReady,
    ProviderError,
    ProviderTimeout,
    ResourceNotFound,
)
from orphan_cleanup.providers.gcp_kinds import (
    IN_USE_OP_CODES,
    NOT_FOUND_OP_CODES,
    GcpKind,
    gcp_errors,
    translate,
)

DONE = compute.Operation.Status.DONE


def read_retry(timeout: float) -> Retry:
    """Reads retry on throttling only, within ``timeout`` in total. A 503 or a
    timeout is not retried: the region is skipped for this cycle (seed 004)."""
    return Retry(
        predicate=if_exception_type(gexc.TooManyRequests),
        initial=0.5, maximum=4.0, multiplier=2.0, timeout=timeout,
    )


class GcpCalls:
    """Get, delete (and wait), aggregated list, for the kinds of ``gcp_kinds``;
    and the project read of the identity check.

    ``clients`` maps ``GcpKind.client`` (``instances``/``disks``/``addresses``,
    plus ``projects``) and ``operations`` maps ``GcpKind.scope`` (``zone``/``region``) to the SDK
    clients. ``retry`` applies to reads (``None``: no retries).
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
    ) -> None:
        self.project = project
        self._clients = dict(clients)
        self._operations = dict(operations)
        self.timeout = timeout
        self.operation_timeout = operation_timeout
        self.page_size = page_size
        self.retry = retry
        self.poll_interval = poll_interval
        self._sleep = sleep
        self._clock = clock

    def _request(self, spec: GcpKind, location: str, name: str) -> dict[str, str]:
        return {"project": self.project, spec.scope: location, spec.name_field: name}

    def project_name(self) -> str:
        """The ``name`` (project id) of the project these calls address, by ``projects.get``.

        Never "assume it is there": a 403 raises ``AccessDenied``, a 404 a plain
        ``ProviderError`` (not ``ResourceNotFound``, which deletion reads as done),
        any other failure its usual ``ProviderError`` subclass.
        """
        what = f"projects.get {self.project}"
        try:
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
            pager = self._clients[spec.client].aggregated_list(
                request=request, timeout=self.timeout, retry=self.retry
            )
            yield from pager.pages

    def get(self, spec: GcpKind, location: str, name: str) -> Any | None:
        """The resource named ``name`` now, or ``None`` when it does not exist (404)."""
        try:
            with gcp_errors(location):
                return self._clients[spec.client].get(
                    request=self._request(spec, location, name), timeout=self.timeout, retry=self.retry
                )
        except ResourceNotFound:
            return None

    def delete(self, spec: GcpKind, location: str, name: str) -> None:
        """Delete by name and wait for the operation, at most ``operation_timeout``.

        Returns when the operation is done, or still running at the deadline
        (the caller confirms by re-reading). Already gone (404) returns quietly.
        Raises ``DependencyNotReady`` when the API says the resource is in use,
        another ``ProviderError`` when the call or the operation failed.
        """
        try:
            with gcp_errors(location):
                op = self._clients[spec.client].delete_unary(
                    request=self._request(spec, location, name), timeout=self.timeout, retry=None
                )
        except ResourceNotFound:
            return
        self._wait(spec, location, op)

    def _wait(self, spec: GcpKind, location: str, op: Any) -> None:
        ops = self._operations[spec.scope]
        request = {"project": self.project, spec.scope: location, "operation": op.name}
        deadline = self._clock() + self.operation_timeout
        while op.status != DONE:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            try:
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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
