"""Pub/Sub for tests: a fake Publisher service the real client publishes to,
and the CloudEvents that Eventarc delivers to a Cloud Function.

``FakePubSub`` is a gRPC server implementing ``google.pubsub.v1.Publisher/Publish``
with the real request/response types of ``google-cloud-pubsub``. Setting
``PUBSUB_EMULATOR_HOST`` to its address makes the real
``google.cloud.pubsub_v1.PublisherClient`` talk to it, exactly as it talks to
the Pub/Sub emulator, so the code under test publishes through its real queue
adapter. Published messages are kept per topic, with the ids the server gave.

``pubsub_cloudevent`` turns one of them into the HTTP request Eventarc sends
to a 2nd-gen function subscribed to the topic (binary or structured content
mode), ready for a functions-framework test client.

Pytest::

    from tests.support.pubsub_harness import pubsub  # noqa: F401  (fixture)

    def test_x(pubsub):          # PUBSUB_EMULATOR_HOST set, messages cleared
        ...
        [msg] = pubsub.take("projects/p/topics/listing")
        client.post("/", **pubsub_cloudevent(msg, subscription="projects/p/subscriptions/s"))
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import grpc
import pytest
from google.pubsub_v1.types import PublishRequest, PublishResponse

TOPIC_EVENT = "google.cloud.pubsub.topic.v1.messagePublished"


@dataclass(frozen=True)
class Published:
    topic: str
    message_id: str
    data: bytes
    attributes: dict[str, str]
    publish_time: datetime

    def json(self) -> Any:
        return json.loads(self.data)


class FakePubSub:
    """The ``Publisher.Publish`` RPC over real gRPC on 127.0.0.1."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[Published] = []
        self._ids = itertools.count(1)
        self.requests = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", {
            "Publish": grpc.unary_unary_rpc_method_handler(
                self._publish, request_deserializer=PublishRequest.deserialize,
                response_serializer=PublishResponse.serialize),
        })
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def host(self) -> str:
        """The value for ``PUBSUB_EMULATOR_HOST``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakePubSub:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def _publish(self, request: PublishRequest, context: grpc.ServicerContext) -> PublishResponse:
        now = datetime.now(timezone.utc)
        with self._lock:
            self.requests += 1
            got = [Published(request.topic, str(next(self._ids)), bytes(m.data), dict(m.attributes), now)
                   for m in request.messages]
            self._messages.extend(got)
        return PublishResponse(message_ids=[m.message_id for m in got])

    def messages(self, topic: str | None = None) -> list[Published]:
        with self._lock:
            return [m for m in self._messages if topic is None or m.topic == topic]

    def take(self, topic: str) -> list[Published]:
        """Remove and return the messages published to ``topic`` (a subscription's pull)."""
        with self._lock:
            taken = [m for m in self._messages if m.topic == topic]
            self._messages = [m for m in self._messages if m.topic != topic]
            return taken

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()
            self.requests = 0


def pubsub_cloudevent(message: Published | bytes, *, subscription: str, binary: bool = True,
                      event_id: str | None = None, source: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``test_client.post("/", **...)``: the CloudEvent
    Eventarc delivers for one Pub/Sub message (``data.message.data`` base64)."""
    if isinstance(message, Published):
        data, message_id, topic, when = message.data, message.message_id, message.topic, message.publish_time
    else:
        data, message_id, topic, when = message, str(uuid.uuid4().int % 10**16), "projects/p/topics/t", \
            datetime.now(timezone.utc)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    payload = {
        "message": {"data": base64.b64encode(data).decode(), "messageId": message_id,
                    "message_id": message_id, "publishTime": stamp, "publish_time": stamp},
        "subscription": subscription,
    }
    attrs = {
        "id": event_id or message_id,
        "source": source or f"//pubsub.googleapis.com/{topic}",
        "type": TOPIC_EVENT,
        "specversion": "1.0",
        "time": stamp,
    }
    if binary:
        headers = {f"ce-{k}": v for k, v in attrs.items()}
        return {"headers": headers, "data": json.dumps(payload), "content_type": "application/json"}
    return {"data": json.dumps({**attrs, "datacontenttype": "application/json", "data": payload}),
            "content_type": "application/cloudevents+json"}


@pytest.fixture(scope="session")
def pubsub_server() -> Iterator[FakePubSub]:
    fake = FakePubSub().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def pubsub(pubsub_server: FakePubSub, monkeypatch: pytest.MonkeyPatch) -> FakePubSub:
    """The session's fake Publisher, emptied, with ``PUBSUB_EMULATOR_HOST`` pointing at it."""
    pubsub_server.clear()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server.host)
    return pubsub_server
