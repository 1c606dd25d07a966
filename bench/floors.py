"""Shapes of the STEP 3 join, to show what lowers the floor itself.

Each variant fetches the ledger records of a batch's refs with pg8000 on an
open connection (``fetch``) and turns the reply into ``{ref: LedgerRecord}``
(``records``). All must return equal records (the benchmark checks it).
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter

from bench import legacy
from bench.common import median
from bench.ledger_data import BACKEND, make_groups
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.core.owners import LedgerRecord
from orphan_cleanup.ledger import queries

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RECORDS = TypeAdapter(list[LedgerRecord])


@dataclass(frozen=True)
class Variant:
    fetch: Callable[[Any, list[ResourceGroup]], Any]
    records: Callable[[Any], dict[str, LedgerRecord]]


def _arrays(groups: list[ResourceGroup]) -> tuple[list[str], list[str]]:
    return (sorted({g.provider_ref for g in groups}),
            sorted({g.provider_ref for g in groups if g.primary_id is None}))


def _texts(groups: list[ResourceGroup]) -> tuple[str, str]:
    refs, left = _arrays(groups)
    return ",".join(refs), ",".join(left)


# The v0 select with ANY on both sides of the LEFT JOIN: the same rows, read
# through both ref indexes (merge join) instead of a sequential scan of instances.
V0_BOTH_SIDES = legacy.JOIN_SQL.replace(
    "LEFT JOIN instances i ON i.provider_ref = r.provider_ref",
    "LEFT JOIN instances i ON i.provider_ref = r.provider_ref AND i.provider_ref = ANY(CAST(:refs AS text[]))")

# Rows, but every timestamp as epoch seconds (float8 keeps microseconds for
# these dates) and the refs as one comma-joined text.
EPOCH_ROWS = """
SELECT r.provider_ref, r.owner_type, r.owner_id, r.owner_name, extract(epoch FROM r.issued_at)::float8,
       i.id IS NOT NULL, i.status, i.backend_id, i.primary_id, i.region,
       extract(epoch FROM i.created_at)::float8, extract(epoch FROM i.provisioned_at)::float8,
       extract(epoch FROM i.terminated_at)::float8, extract(epoch FROM i.deleted_at)::float8,
       CASE WHEN r.provider_ref = ANY(string_to_array(:leftover, ',')) THEN
           (SELECT array_agg(o.resource_id) FROM orphan_resources o
             WHERE o.backend_id = :backend AND o.provider_ref = r.provider_ref)
       END
  FROM provider_refs r
  LEFT JOIN instances i
         ON i.provider_ref = r.provider_ref AND i.provider_ref = ANY(string_to_array(:refs, ','))
 WHERE r.provider_ref = ANY(string_to_array(:refs, ','))
"""


def _ts(x: float | None) -> datetime | None:
    return None if x is None else _EPOCH + timedelta(seconds=x)


def _epoch_records(rows: list[list[Any]]) -> dict[str, LedgerRecord]:
    out = {}
    for row in rows:
        for i in (4, 10, 11, 12, 13):
            row[i] = _ts(row[i])
        out[row[0]] = legacy.record_from_row(row)
    return out


def _fetch_v0(sql: str) -> Callable[[Any, list[ResourceGroup]], Any]:
    def fetch(conn: Any, groups: list[ResourceGroup]) -> Any:
        refs, left = _arrays(groups)
        return conn.run(sql, refs=refs, leftover=left, backend=BACKEND)
    return fetch


def _fetch_text(sql: str) -> Callable[[Any, list[ResourceGroup]], Any]:
    def fetch(conn: Any, groups: list[ResourceGroup]) -> Any:
        refs, left = _texts(groups)
        return conn.run(sql, refs=refs, leftover=left, backend=BACKEND)
    return fetch


def _v0_records(rows: list[list[Any]]) -> dict[str, LedgerRecord]:
    return {row[0]: legacy.record_from_row(row) for row in rows}


def _json_records(rows: list[list[Any]]) -> dict[str, LedgerRecord]:
    return {r.provider_ref: r for r in _RECORDS.validate_json(rows[0][0])}


def fields(record: Any) -> dict[str, Any]:
    """A record's fields (a ``LedgerRecord`` or the ``LedgerRow`` msgspec decodes)."""
    return {name: getattr(record, name) for name in LedgerRecord.model_fields}


def _types(record: Any) -> dict[str, type]:
    return {k: type(v) for k, v in fields(record).items()}


def _msgspec_records(rows: list[list[Any]]) -> dict[str, Any]:
    return {r.provider_ref: r for r in queries.records_from_json(rows[0][0])}


VARIANTS: dict[str, Variant] = {
    "v0 rows, timestamptz": Variant(_fetch_v0(legacy.JOIN_SQL), _v0_records),
    "v0 + ANY on both sides": Variant(_fetch_v0(V0_BOTH_SIDES), _v0_records),
    "rows, epoch float8": Variant(_fetch_text(EPOCH_ROWS), _epoch_records),
    "one JSON document, pydantic records": Variant(_fetch_text(queries.JOIN_SQL), _json_records),
    "shipped: JSON document, msgspec rows": Variant(_fetch_text(queries.JOIN_SQL), _msgspec_records),
}


def measure(conn: Any, n_refs: int, size: int, reps: int, rng: random.Random) -> dict[str, dict[str, float]]:
    """Median fetch and fetch+records time of every variant, interleaved, on
    batches of ``size`` groups drawn from a ledger of ``n_refs``."""
    res: dict[str, dict[str, list[float]]] = {name: {"fetch": [], "records": []} for name in VARIANTS}
    for _ in range(reps):
        groups = make_groups(n_refs, size, rng)
        expected = None
        for name, variant in VARIANTS.items():
            gc.collect()
            start = time.perf_counter()
            rows = variant.fetch(conn, groups)
            mid = time.perf_counter()
            records = variant.records(rows)
            end = time.perf_counter()
            res[name]["fetch"].append(mid - start)
            res[name]["records"].append(end - start)
            # The shipped join also names each owner's account (rule 10), which the older shapes predate.
            same = {ref: {**fields(r), "owner_backend_scope": None} for ref, r in records.items()}
            expected = expected or same
            assert same == expected, f"floor variant {name} disagrees"
            if name.startswith("shipped"):  # and the shipped decoder is the pydantic one, field for field
                reference = _json_records(rows)
                assert records.keys() == reference.keys() and all(
                    fields(r) == fields(reference[ref]) and _types(r) == _types(reference[ref])
                    for ref, r in records.items())
    return {name: {k: median(v) for k, v in r.items()} for name, r in res.items()}
