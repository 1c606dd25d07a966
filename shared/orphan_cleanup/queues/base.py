"""The queue port: publish a message; delivery is at least once, in any order."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import BaseModel

# SQS's limit is 256 KiB per message; leave room for attributes and envelope.
MAX_MESSAGE_BYTES = 200 * 1024


class Queue(ABC):
    max_message_bytes: int = MAX_MESSAGE_BYTES

    @abstractmethod
    def publish(self, message: BaseModel) -> None:
        """Send one message. Raises on failure (the caller decides what fails)."""
