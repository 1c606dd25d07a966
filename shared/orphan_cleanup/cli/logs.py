"""The CLI's log lines: the message, then the structured fields the deployed functions log
as JSON (Powertools on Lambda), as ``key=value``: a stuck pending owner's line names its
ref, owner and instance on a terminal too."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

#: The ``extra`` keys the library logs its fields under (``cycle.reporting.Reporter``).
FIELDS = ("details", "orphan")


class FieldsFormatter(logging.Formatter):
    """``LEVEL message: key=value ...`` (values that are None left out)."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [f"{k}={_value(v)}" for name in FIELDS if isinstance(fields := getattr(record, name, None), dict)
                 for k, v in fields.items() if v is not None and v != []]
        return f"{line}: {' '.join(pairs)}" if pairs else line


def _value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    text = str(v)
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text


def configure() -> None:
    """Warnings and errors to stderr, with their fields."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FieldsFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
