"""Every AWS API call an adapter's session makes, recorded (fixtures ``calls`` and
``session``: a boto3 session whose clients log to ``calls``)."""

from __future__ import annotations

import threading
from typing import Any

import boto3
import pytest


class CallLog:
    """Every API call a session's clients make: (service, operation, params)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def attach(self, session: boto3.Session) -> None:
        session.events.register("before-parameter-build", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        with self._lock:
            self.calls.append((model.service_model.service_name, model.name, dict(params)))

    def ops(self) -> list[str]:
        return [op for _, op, _ in self.calls]

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()


@pytest.fixture
def calls() -> CallLog:
    return CallLog()


@pytest.fixture
def session(calls: CallLog) -> boto3.Session:
    s = boto3.Session()
    calls.attach(s)
    return s
