"""In-process queue for a manual single-backend run and for tests."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pydantic import BaseModel

from orphan_cleanup.queues.base import Queue


class InProcessQueue(Queue):
    """Holds serialized messages, exactly as a real queue would carry them."""

    def __init__(self) -> None:
        self.items: deque[str] = deque()
        # When set, a published message is handed to it at once instead of queued,
        # so a long listing is classified as it streams (memory stays flat).
        self.consumer: Callable[[str], None] | None = None

    def publish(self, message: BaseModel) -> None:
        body = message.model_dump_json()
        if len(body.encode()) > self.max_message_bytes:
            raise ValueError(f"message of {len(body)} bytes exceeds {self.max_message_bytes}")
        if self.consumer is not None:
            self.consumer(body)
        else:
            self.items.append(body)

    def requeue(self, body: str) -> None:
        """Put a message back at the end (a delivery to try again later)."""
        self.items.append(body)

    def pop(self) -> str | None:
        return self.items.popleft() if self.items else None

    def __len__(self) -> int:
        return len(self.items)
