"""A small fake of the Compute Engine v1 REST API, for tests, demos and benchmarks.

It speaks the real JSON wire format, so the real ``google-cloud-compute`` client
(REST transport, ``url_scheme="http"``, anonymous credentials) talks to it
unchanged. Covered: instances and disks (zonal), addresses and forwarding rules
(regional; ``forwardingRules.insert`` too, a rule on an address making it ``IN_USE``):
aggregated list, zonal/regional list (``filter`` on labels, ``name``, ``status``
and the numeric ``id``), get, delete; ``instances.attachDisk``/``detachDisk``
(a boot disk only while the instance is stopped); zonal and regional
operations (get and ``/wait``); snapshots (``disks.createSnapshot``, global
list/get/delete and operations: ``gcp_fake_snapshots``); images (global list, get,
delete, insert: ``gcp_fake_images``); ``projects.get``
(``GET /compute/v1/projects/P``). Errors use Google's body format
(``{"error": {"code", "message", "errors": [{"reason": ...}]}}``).

Deliberate strictness: every list call must carry a ``filter`` naming at least
one ``labels.KEY`` term (e.g. ``labels.provider_ref:*``) or pinning a numeric id
(``id = 123``: a read by id, as narrow as a get), otherwise 400, so a client that
forgets the label filter fails loudly (``require_label_filter``). A list pinned to
an id counts as a read of that resource exactly as a get does (``gcp_fake_state``).

Pytest (plugin enabled in ``tests/conftest.py``)::

    def test_x(gcp):                      # function-scoped, state reset
        vm = gcp.add_instance("vm-1", zone="us-central1-a", labels={"provider_ref": "abcdefabcdef"})
        gcp.add_disk("vm-1-data", zone="us-central1-a", labels=..., attached_to="vm-1")
        gcp.add_address("vm-1-ip", region="us-central1", labels=..., attached_to="vm-1")
        provider = build_gcp_provider(backend, endpoint=gcp.url, timeout=5)
        gcp.make_unreachable("us-central1-b")   # UNREACHABLE warning in aggregated lists
        gcp.fail_region("europe-west1")         # 503 on every call scoped there (+ warning)
        gcp.add_fault(path_contains="/aggregated/disks", status=503, times=1)
        gcp.add_project("other-project")        # projects.get knows it (unknown ones: 404)
        gcp.deny_project("other-project")       # projects.get of it answers 403
        gcp.on_operation("/disks/disk-a", lambda: gcp.remove("disks", "us-central1-a", "disk-b"))
        gcp.swap_boot_disk("vm-1", "other-disk")  # the VM must be TERMINATED (stopped)
        assert gcp.count("GET", "/aggregated/instances") == 2

Outside pytest: ``with FakeCompute() as fake: ...`` (``fake.url`` is the endpoint).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.support.gcp_fake_api import FakeApi
from tests.support.gcp_fake_wire import WireError, error_body

__all__ = ["Call", "FakeCompute", "gcp", "gcp_server"]


@dataclass(frozen=True)
class Call:
    """One request the fake received, with the status it answered."""

    method: str
    path: str
    query: dict[str, str]
    status: int


@dataclass
class _Fault:
    method: str | None
    path_contains: str | None
    status: int | None
    delay: float
    times: int | None
    reason: str | None = None

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path_contains is None or self.path_contains in path
        )


@dataclass
class _Hook:
    method: str | None
    path_contains: str
    action: Callable[[], None]
    times: int | None

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.path_contains in path


class FakeCompute(FakeApi):
    """The fake server: ``FakeState`` (resources, helpers) and ``FakeApi`` (routes)
    behind an HTTP listener on 127.0.0.1.

    Fault injection and observation live here:
      - ``make_unreachable(scope)``: a zone (``us-central1-b``) or region
        (``us-central1``, with all its zones) is reported with an
        ``UNREACHABLE`` warning in aggregated lists; direct calls still work;
      - ``fail_region(scope, status=503)``: every call scoped to that zone or
        region (get, delete, list, operations) answers ``status``, and
        aggregated lists report its scopes ``UNREACHABLE``;
      - ``add_fault(method=None, path_contains=None, status=503, delay=0, times=None, reason=None)``:
        the next ``times`` matching requests (all when ``None``) sleep ``delay``
        seconds and, when ``status`` is set, fail with it (e.g. 400 with reason
        ``resourceInUseByAnotherResource``, 429, 403);
      - ``on_operation(path_contains, action, method=None, times=1)``: something happens
        while an operation is in flight (``action()``, e.g. a name reused);
      - ``calls`` (list of ``Call``), ``count(method, path_contains)``, ``clear_calls()``.
    """

    def __init__(self, project: str = "test-project", *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._faults: list[_Fault] = []
        self._hooks: list[_Hook] = []
        self._before: list[_Hook] = []
        self._calls: list[Call] = []
        super().__init__(project)
        self._host, self._port = host, port
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("FakeCompute is not started")
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeCompute:
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        self._http = ThreadingHTTPServer((self._host, self._port), handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-compute", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeCompute:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget resources, operations, faults, hooks and calls; restore the defaults."""
        with self._lock:
            super().reset()
            self._faults.clear()
            self._hooks.clear()
            self._before.clear()
            self._calls.clear()

    # --- faults and observation ---------------------------------------------

    def add_fault(
        self,
        method: str | None = None,
        path_contains: str | None = None,
        status: int | None = 503,
        *,
        delay: float = 0.0,
        times: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Make matching requests sleep ``delay`` and, when ``status`` is set, fail
        with it (and the error ``reason``, default per status), ``times`` times
        (``None``: until ``reset()``/``clear_faults()``)."""
        with self._lock:
            self._faults.append(_Fault(method, path_contains, status, delay, times, reason))

    def on_operation(self, path_contains: str, action: Callable[[], None], *, method: str | None = None,
                     times: int | None = 1) -> None:
        """Run ``action()`` when a mutating request (``DELETE``, or a ``POST`` other than an
        operation's ``wait``) whose path contains ``path_contains`` has been accepted: after
        the fake applied it and made its operation, before the answer (operation ``RUNNING``)
        goes back, so before the client's first ``wait`` on it. The client therefore sees
        the world as ``action`` left it in every later call, while its own call is still in
        flight. ``times`` matching requests (``None``: all) fire it; it runs under the fake's
        lock (use the state helpers: ``remove``, ``add_disk``...). An action that raises
        makes the request answer 500 (``fake bug: ...``)."""
        with self._lock:
            self._hooks.append(_Hook(method, path_contains, action, times))

    def before_request(self, method: str, path_endswith: str, action: Callable[[], None], *,
                       times: int | None = 1) -> None:
        """Run ``action()`` before the fake answers a ``method`` request whose path ends with
        ``path_endswith`` (``times`` of them; ``None``: all): the world changes between the
        client's earlier calls and this one (a name reused right before a ``get``). It runs
        under the fake's lock; ``clear_faults`` forgets it."""
        with self._lock:
            self._before.append(_Hook(method, path_endswith, action, times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._before.clear()
            self._unreachable.clear()
            self._failing.clear()

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def count(self, method: str | None = None, path_contains: str | None = None) -> int:
        """How many requests matched ``method`` (``GET``, ``DELETE``, ``POST``) and
        contained ``path_contains`` in their path."""
        with self._lock:
            return sum(
                1 for c in self._calls
                if (method is None or c.method == method) and (path_contains is None or path_contains in c.path)
            )

    def clear_calls(self) -> None:
        with self._lock:
            self._calls.clear()

    # --- request handling ----------------------------------------------------

    def _fire(self, method: str, path: str) -> None:
        """The hooks of an accepted mutation (``on_operation``); the lock is held."""
        for hook in list(self._hooks):  # an action may add hooks: they fire from the next request
            if hook.matches(method, path) and hook.times != 0:
                if hook.times is not None:
                    hook.times -= 1
                hook.action()

    def handle(self, method: str, path: str, query: dict[str, str], body: bytes = b"") -> tuple[int, dict[str, Any]]:
        """Answer one request: ``(status, json body)``. Used by the HTTP handler."""
        delay, status, reason = 0.0, None, None
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path) and fault.times != 0:
                    if fault.times is not None:
                        fault.times -= 1
                    delay, status, reason = fault.delay, fault.status, fault.reason
                    break
        if delay:
            time.sleep(delay)
        try:
            if status is not None:
                raise WireError(status, f"Injected fault: {status}", reason)
            with self._lock:
                for hook in list(self._before):
                    if hook.method == method and path.endswith(hook.path_contains) and hook.times != 0:
                        if hook.times is not None:
                            hook.times -= 1
                        hook.action()
                code, answer = 200, self.dispatch(method, path, query, body)
                if method in ("DELETE", "POST") and "/operations/" not in path \
                        and answer.get("kind") == "compute#operation":
                    self._fire(method, path)
        except WireError as e:
            code, answer = e.status, error_body(e.status, str(e), e.reason)
        except Exception as e:  # a bug in the fake: answer 500 rather than drop the connection
            code, answer = 500, error_body(500, f"fake bug: {type(e).__name__}: {e}", "backendError")
        with self._lock:
            self._calls.append(Call(method, path, dict(query), code))
        return code, answer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: avoid 40 ms delayed-ACK stalls
    fake: FakeCompute

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        sent = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        status, body = self.fake.handle(self.command, unquote(url.path), query, sent)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (its timeout): nothing to answer

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


# --- pytest plugin ------------------------------------------------------------------


@pytest.fixture(scope="session")
def gcp_server() -> Iterator[FakeCompute]:
    """One fake Compute server per test session on 127.0.0.1 (free port)."""
    fake = FakeCompute().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def gcp(gcp_server: FakeCompute) -> FakeCompute:
    """The session's fake server, reset for this test."""
    gcp_server.reset()
    return gcp_server
