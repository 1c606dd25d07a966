"""The notification port: send one cycle's digest (the C6 document) to a channel.

Contract: ``send`` delivers the digest once or raises ``NotifyError`` (a channel that
refuses, times out or cannot be reached); it never raises anything else for a channel's
failure, and it returns within the adapter's timeout. The caller logs and counts a
failure; a notification never fails a cycle."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from orphan_cleanup.core.errors import OrphanCleanupError


class NotifyError(OrphanCleanupError):
    """A digest the channel did not take: why, in one line."""


class Notifier(ABC):
    #: The channel's name in logs and in ``notify_failed`` events (``sns``, ``pubsub``, ``slack``).
    channel: str = "?"

    @abstractmethod
    def send(self, digest: dict[str, Any]) -> None:
        """Deliver ``digest``; ``NotifyError`` when the channel did not take it."""
