"""A reader that goes away is not an error: ``orphan-cleanup explain ... | head -5``.

While a command runs, stdout and stderr are wrapped so that a write to a closed pipe
(``BrokenPipeError``) drops that stream's output quietly instead of raising out of the
command: the command finishes what it was doing (a run's cycle and its ledger records
are the same whether anyone reads the table) and exits with its own code. The broken
file descriptor is pointed at ``/dev/null`` so that the interpreter's final flush does
not complain either.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class PipeSafe:
    """A text stream that turns a closed pipe into silence (see the module docstring)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing to flush
            pass

    def isatty(self) -> bool:
        return not self.broken and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, buffer ...: the real stream's
        return getattr(self._stream, name)


@contextmanager
def closed_pipes_are_quiet() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` wrapped in ``PipeSafe`` for the duration."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PipeSafe(sys.stdout), PipeSafe(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what is still buffered meets a closed pipe here, not at interpreter exit
        sys.stdout, sys.stderr = saved
