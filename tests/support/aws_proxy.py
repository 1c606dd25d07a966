"""A pass-through HTTP proxy in front of the moto server, for tests and benchmarks.

Point a client at ``url`` (``AWS_ENDPOINT_URL``, or an adapter's ``endpoint_url``) and
the proxy forwards each request unchanged to moto, recording what it saw on the wire:
the API action (the query protocol's ``Action=``, a JSON protocol's ``X-Amz-Target``),
the service and region of the SigV4 credential scope, and the reply's size. Counted on
the wire, a call is counted the same way whatever sent it (this process or another,
``custodian`` included).

It can also refuse a share of the requests with EC2's real throttling reply: HTTP 503
with ``<Response><Errors><Error><Code>RequestLimitExceeded`` (the query protocol's error
body, which botocore parses as that code). The refusals are deterministic: request ``n``
(counted from 0 across threads, among those signed for ``regions`` when it is set) is
refused when ``floor((n + 1) * share) > floor(n * share)``, so exactly ``share`` of any
run of requests is refused, spread evenly (at 0.5 every other one, at 1.0 all).

    with AwsProxy(moto_url, share=0.3) as proxy:
        provider = build_aws_provider(backend, ..., endpoint_url=proxy.url)
        ...
        proxy.refused, proxy.actions(), proxy.service_counts(), proxy.reply_bytes

A test may also add a ``Rule`` for one action: hold its requests until released (a call
in flight, to act while it is), answer them itself instead of forwarding (a failure
moto would not give), or rewrite moto's reply body (a field moto leaves out):

    hold = proxy.add_rule(Rule("TerminateInstances", hold=True))
    hold.arrived.wait(30); ...; hold.release()
"""

from __future__ import annotations

import http.client
import math
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

THROTTLED_BODY = (
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>"
    "<Message>Request limit exceeded.</Message></Error></Errors><RequestID>{rid}</RequestID></Response>"
)
_HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                          "upgrade", "content-length"})


@dataclass(frozen=True)
class Request:
    """One request the proxy received."""

    action: str
    service: str  # of the SigV4 scope; "unsigned" without one
    region: str
    refused: bool  # throttled, or answered by a ``Rule``'s ``reply`` instead of moto
    reply_bytes: int


@dataclass
class Rule:
    """What the proxy does with the requests of ``action`` whose body ``match`` accepts,
    ``times`` times (None: every one): with ``hold``, each waits until ``release()`` (at
    most ``hold_timeout`` seconds) before it is forwarded; with ``reply`` (status, headers,
    body) it is answered with that instead of being forwarded; ``rewrite`` is applied to
    moto's reply body. ``arrived`` is set when a matching request came in."""

    action: str
    match: Callable[[bytes], bool] | None = None
    times: int | None = None
    hold: bool = False
    hold_timeout: float = 120.0
    reply: tuple[int, list[tuple[str, str]], bytes] | None = None
    rewrite: Callable[[bytes], bytes] | None = None
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    seen: int = 0

    def release(self) -> None:
        self.released.set()


class AwsProxy:
    """The proxy on 127.0.0.1 (a free port) forwarding to ``upstream`` (``http://host:port``).
    ``with`` starts and stops it."""

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
        self._rules: list[Rule] = []
        self._local = threading.local()
        handler = type("_BoundHandler", (_Handler,), {"proxy": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="aws-proxy", daemon=True)
        host, port = self._http.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def __enter__(self) -> AwsProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            for rule in self._rules:
                rule.release()  # a held request goes on rather than keep shutdown waiting
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    # --- what it saw (since the last ``reset``) --------------------------------------

    @property
    def log(self) -> list[Request]:
        with self._lock:
            return list(self._log)

    @property
    def refused(self) -> int:
        return sum(r.refused for r in self.log)

    @property
    def reply_bytes(self) -> int:
        return sum(r.reply_bytes for r in self.log)

    def actions(self, *, refused: bool | None = None) -> list[str]:
        return [r.action for r in self.log if refused is None or r.refused == refused]

    def action_counts(self) -> Counter[str]:
        return Counter(r.action for r in self.log)

    def service_counts(self) -> Counter[str]:
        return Counter(r.service for r in self.log)

    def reset(self) -> None:
        with self._lock:
            self._log.clear()

    # --- rules (a test's knobs) -------------------------------------------------------

    def add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def rule_for(self, action: str, body: bytes) -> Rule | None:
        """The first rule that takes this request (counting it), or None."""
        with self._lock:
            for rule in self._rules:
                if rule.action == action and rule.times != 0 and (rule.match is None or rule.match(body)):
                    if rule.times is not None:
                        rule.times -= 1
                    rule.seen += 1
                    return rule
        return None

    # --- handling --------------------------------------------------------------------

    def refuse(self, region: str) -> bool:
        """Whether the next request, signed for ``region``, is to be refused."""
        with self._lock:
            if self.regions is not None and region not in self.regions:
                return False
            n = self._matched
            self._matched += 1
            return math.floor((n + 1) * self.share) > math.floor(n * self.share)

    def record(self, request: Request) -> None:
        with self._lock:
            self._log.append(request)

    def forward(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """One request to moto on this handler thread's kept-alive connection (reopened once if moto closed it)."""
        for attempt in (0, 1):
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(*self._upstream, timeout=300)
            try:
                conn.request(method, path, body=body, headers=headers)
                reply = conn.getresponse()
                return reply.status, reply.getheaders(), reply.read()
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def _action(path: str, body: bytes, target: str | None) -> str:
    if target:
        return target.rpartition(".")[2]
    query = parse_qs(urlsplit(path).query)
    if "Action" in query:
        return query["Action"][0]
    form = parse_qs(body.decode("utf-8", "replace"))
    return form.get("Action", [path.split("?")[0]])[0]


def _scope(authorization: str) -> tuple[str, str]:
    """(service, region) of a SigV4 ``Authorization`` (``Credential=KEY/DATE/REGION/SERVICE/aws4_request``)."""
    _, _, credential = authorization.partition("Credential=")
    parts = credential.split(",", 1)[0].split("/")
    return (parts[3], parts[2]) if len(parts) >= 4 else ("unsigned", "")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    proxy: AwsProxy

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        action = _action(self.path, body, self.headers.get("X-Amz-Target"))
        service, region = _scope(self.headers.get("Authorization", ""))
        rule = self.proxy.rule_for(action, body)
        if rule is not None:
            rule.arrived.set()
            if rule.hold:
                rule.released.wait(rule.hold_timeout)
        reply = rule.reply if rule is not None else None
        refused = reply is not None or self.proxy.refuse(region)
        if reply is not None:
            status, reply_headers, data = reply
        elif refused:
            status, reply_headers = 503, [("Content-Type", "text/xml;charset=UTF-8")]
            data = THROTTLED_BODY.format(rid=uuid.uuid4()).encode()
        else:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            status, reply_headers, data = self.proxy.forward(self.command, self.path, headers, body)
            if rule is not None and rule.rewrite is not None:
                data = rule.rewrite(data)
        self.proxy.record(Request(action, service, region, refused, len(data)))
        self.send_response(status)
        for key, value in reply_headers:
            if key.lower() not in _HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass
