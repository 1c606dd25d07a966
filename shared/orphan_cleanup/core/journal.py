"""The journal port (SAFETY.md rule 19): where a provider adapter records each mutating
call it makes, one row before the call and one after it. The ledger implements it
(``ledger.journal.LedgerJournal``); adapters receive it with each deletion.

Contract:

- ``intent`` is written before the call, with what the provider deletes along with the
  target (``blast``); if it cannot be written it raises, and the call is not made: no
  provider mutation without a record;
- ``result`` is written after the call: ``ok``, ``gone`` (the target was already gone),
  ``refused`` (the provider refused it, e.g. a protection) or ``error`` with the error's
  line; a result that cannot be written is logged, never raised (the call happened, and
  its intent row says so);
- both are written outside any cycle's fence: a cycle that lost its lease, a run that was
  interrupted, a backend removed with ``--force``, all still leave their rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

Outcome = Literal["ok", "gone", "refused", "error"]


class Journal(Protocol):
    def intent(self, call: str, target: str, *, region: str | None, blast: Sequence[str] = ()) -> object:
        """Record that ``call`` is about to act on ``target``; returns the row's handle."""

    def result(self, intent: object, outcome: Outcome, error: str | None = None) -> None:
        """Record how the call of ``intent`` ended."""


class NoJournal:
    """Records nothing: for callers with no ledger (an adapter's unit tests)."""

    def intent(self, call: str, target: str, *, region: str | None, blast: Sequence[str] = ()) -> object:
        return None

    def result(self, intent: object, outcome: Outcome, error: str | None = None) -> None:
        return None


NO_JOURNAL = NoJournal()


@dataclass
class Entry:
    """One journaled call in flight: the caller sets ``outcome`` when the call answered
    "already gone", or "refused" (then raising: the refusal is recorded, not ``error``)."""

    outcome: Outcome = "ok"


@contextmanager
def journaled(journal: Journal, call: str, target: str, *, region: str | None,
              blast: Sequence[str] = ()) -> Iterator[Entry]:
    """Write the intent, run the block (the provider call), write its result; an
    exception is recorded as ``error`` and re-raised."""
    handle = journal.intent(call, target, region=region, blast=blast)
    entry = Entry()
    try:
        yield entry
    except BaseException as exc:
        outcome: Outcome = "refused" if entry.outcome == "refused" else "error"
        journal.result(handle, outcome, f"{type(exc).__name__}: {exc}"[:500])
        raise
    journal.result(handle, entry.outcome)
