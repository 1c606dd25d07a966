"""Pub/Sub adapter (a google.cloud.pubsub_v1.PublisherClient injected)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from orphan_cleanup.queues.base import Queue


class PubSubQueue(Queue):
    max_message_bytes = 9 * 1024 * 1024  # Pub/Sub allows 10 MB

    def __init__(self, publisher: Any, topic: str, timeout: float = 30.0) -> None:
        self.publisher = publisher
        self.topic = topic
        self.timeout = timeout

    def publish(self, message: BaseModel) -> None:
        self.publisher.publish(self.topic, message.model_dump_json().encode()).result(timeout=self.timeout)
