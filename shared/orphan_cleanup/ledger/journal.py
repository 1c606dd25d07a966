"""The journal of provider mutations in the ledger (``provider_journal``, migration 0011):
the ``core.journal.Journal`` port for one group's deletion (SAFETY.md rule 19).

Each row is its own statement on a connection without a transaction, never inside a
cycle's fenced unit: a cycle that lost its lease still writes them. An intent that
cannot be written raises ``DatabaseError`` (the caller then makes no call); a result
that cannot be written is logged."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from orphan_cleanup.core.errors import DatabaseError
from orphan_cleanup.core.journal import Outcome
from orphan_cleanup.ledger.db import PG_FAILURES, Database, describe

_log = logging.getLogger(__name__)

_INTENT = ("INSERT INTO provider_journal (backend_id, cycle_id, scope, region, provider_ref, group_key, phase,"
           " call, target, blast) VALUES (:b, :c, :s, :r, :ref, :k, 'intent', :call, :t, CAST(:blast AS jsonb))"
           " RETURNING id")
_RESULT = ("INSERT INTO provider_journal (backend_id, cycle_id, scope, region, provider_ref, group_key, phase,"
           " intent_id, call, target, outcome, error)"
           " SELECT backend_id, cycle_id, scope, region, provider_ref, group_key, 'result', id, call, target, :o, :e"
           " FROM provider_journal WHERE id = :i")


@dataclass(frozen=True)
class LedgerJournal:
    """The journal of the deletion of one group (``group_key``) of one cycle."""

    db: Database
    backend_id: str
    cycle_id: str | None
    scope: str
    provider_ref: str | None
    group_key: str | None

    def intent(self, call: str, target: str, *, region: str | None, blast: Sequence[str] = ()) -> object:
        try:
            with self.db.connection() as conn:
                rows = conn.run(_INTENT, b=self.backend_id, c=self.cycle_id, s=self.scope, r=region,
                                ref=self.provider_ref, k=self.group_key, call=call, t=target,
                                blast=json.dumps(list(blast)))
        except (*PG_FAILURES, DatabaseError) as exc:
            raise DatabaseError(f"journal: the intent of {call} {target} was not written: {describe(exc)}") from exc
        return rows[0][0]

    def result(self, intent: object, outcome: Outcome, error: str | None = None) -> None:
        try:
            with self.db.connection() as conn:
                conn.run(_RESULT, o=outcome, e=error[:2000] if error else None, i=intent)
        except (*PG_FAILURES, DatabaseError) as exc:  # the call happened; the intent says so
            _log.error("journal: the result of %s (%s) was not written: %s", intent, outcome, exc)
