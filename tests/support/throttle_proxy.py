"""A throttling HTTP proxy for tests: in front of the moto server, it refuses a given
share of requests with EC2's real throttling reply and forwards the rest.

The refusals are deterministic: request ``n`` (counted from 0 across all threads) is
refused when ``floor((n + 1) * share) > floor(n * share)``, so exactly ``share`` of
any run of requests is refused, spread evenly (at 0.5 every other one, at 1.0 all).
EC2's reply is HTTP 503 with ``<Response><Errors><Error><Code>RequestLimitExceeded``
(the query protocol's error body), which botocore parses as that error code.

    with ThrottleProxy(moto_url, share=0.3) as proxy:
        provider = build_aws_provider(backend, ..., endpoint_url=proxy.url)
        ...
        proxy.refused, proxy.forwarded, proxy.actions()
"""

from __future__ import annotations

import http.client
import math
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

THROTTLED_BODY = (
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>"
    "<Message>Request limit exceeded.</Message></Error></Errors><RequestID>{rid}</RequestID></Response>"
)
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


@dataclass(frozen=True)
class Request:
    """One request the proxy received: its query-protocol ``Action``, the region it was
    signed for, and whether it was refused."""

    action: str
    region: str
    refused: bool


class ThrottleProxy:
    """The proxy on 127.0.0.1 (free port) forwarding to ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str, *, share: float = 0.0, regions: set[str] | None = None) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self._upstream = (parts.hostname, parts.port)
        self.share = share
        self.regions = frozenset(regions) if regions is not None else None
        self._matched = 0
        self._lock = threading.Lock()
        self._log: list[Request] = []
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    # --- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("ThrottleProxy is not started")
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ThrottleProxy:
        handler = type("_BoundHandler", (_Handler,), {"proxy": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="throttle-proxy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- observation -----------------------------------------------------------------

    @property
    def log(self) -> list[Request]:
        with self._lock:
            return list(self._log)

    @property
    def refused(self) -> int:
        return sum(r.refused for r in self.log)

    @property
    def forwarded(self) -> int:
        return sum(not r.refused for r in self.log)

    def actions(self, *, refused: bool | None = None) -> list[str]:
        return [r.action for r in self.log if refused is None or r.refused == refused]

    def clear(self) -> None:
        with self._lock:
            self._log.clear()

    # --- handling --------------------------------------------------------------------

    def decide(self, action: str, region: str) -> bool:
        """Record one request; True when it is to be refused (only requests signed for
        one of ``regions`` are counted and refused, when ``regions`` is set)."""
        with self._lock:
            refuse = False
            if self.regions is None or region in self.regions:
                n = self._matched
                self._matched += 1
                refuse = math.floor((n + 1) * self.share) > math.floor(n * self.share)
            self._log.append(Request(action, region, refuse))
            return refuse

    def forward(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        for attempt in (0, 1):  # a kept-alive upstream connection may have been closed
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(*self._upstream, timeout=60)
            try:
                conn.request(method, path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                return reply.status, reply.getheaders(), data
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                conn = self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _action(body: bytes, query: str) -> str:
    fields = parse_qs(body.decode("utf-8", "replace")) or parse_qs(query)
    return fields.get("Action", ["?"])[0]


def _signed_region(authorization: str) -> str:
    """The region of a SigV4 ``Authorization`` header (``Credential=KEY/DATE/REGION/SERVICE/...``)."""
    _, _, credential = authorization.partition("Credential=")
    parts = credential.split("/")
    return parts[2] if len(parts) > 2 else ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    proxy: ThrottleProxy

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        action = _action(body, urlsplit(self.path).query)
        if self.proxy.decide(action, _signed_region(self.headers.get("Authorization", ""))):
            data = THROTTLED_BODY.format(rid=uuid.uuid4()).encode()
            self.send_response(503)
            self.send_header("Content-Type", "text/xml;charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        status, reply_headers, data = self.proxy.forward(self.command, self.path, headers, body)
        self.send_response(status)
        for key, value in reply_headers:
            if key.lower() not in _HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass
