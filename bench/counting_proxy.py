"""A counting HTTP proxy in front of a moto server, for benchmarks.

Every client (boto3 in this process, ``custodian`` in another) is pointed at the
proxy with ``AWS_ENDPOINT_URL``; the proxy forwards each request unchanged to
moto and counts it by API action (the ``Action=`` of the EC2/STS query protocol,
or the ``X-Amz-Target`` of JSON protocols) together with the reply bytes. The
count is taken on the wire, so it is the same for every lister whatever its
language or process.
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                         "upgrade", "content-length"})


class CountingProxy:
    """``url`` is where clients go; ``calls`` counts requests by action since ``reset``."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.reply_bytes = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="counting-proxy", daemon=True)

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.reply_bytes = 0

    def snapshot(self) -> tuple[Counter[str], int]:
        """The calls by action and the reply bytes since the last ``reset``."""
        with self._lock:
            return Counter(self.calls), self.reply_bytes

    def _record(self, action: str, size: int) -> None:
        with self._lock:
            self.calls[action] += 1
            self.reply_bytes += size

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        local = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                status, reply_headers, reply = _send(local, proxy._upstream, self.command, self.path, body, headers)
                proxy._record(_action(self.path, body, self.headers.get("X-Amz-Target")), len(reply))
                self.send_response(status)
                for k, v in reply_headers:
                    if k.lower() not in _HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler


def _send(local: threading.local, upstream: tuple[str, int], method: str, path: str, body: bytes,
          headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request to moto on this handler thread's kept-alive connection (reopened once if moto closed it)."""
    for attempt in (0, 1):
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(*upstream, timeout=300)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        except (http.client.HTTPException, ConnectionError):
            conn.close()
            local.conn = None
            if attempt:
                raise
    raise AssertionError("unreachable")


def _action(path: str, body: bytes, target: str | None) -> str:
    if target:
        return target.rpartition(".")[2]
    query = parse_qs(urlsplit(path).query)
    if "Action" in query:
        return query["Action"][0]
    try:
        form = parse_qs(body.decode("ascii"))
    except UnicodeDecodeError:
        form = {}
    return form.get("Action", [f"{path.split('?')[0]}"])[0]


@contextmanager
def counting_proxy(upstream: str) -> Iterator[CountingProxy]:
    proxy = CountingProxy(upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()
