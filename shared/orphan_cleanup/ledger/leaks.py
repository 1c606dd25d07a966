"""What leaks cost and how fast they were cleaned (C3 ``report``): the orphans whose life
reaches into a period, aggregated in the database, and their hours grouped by what prices
them. Reads only; the period ends at the database clock (SAFETY.md rule 13).

An orphan's life runs from when it became one (``orphan_since``; ``first_seen`` on rows older
than migration 0018) to its deletion (``deleted_at``; ``last_seen`` on older rows), to its last
listing when it went otherwise (``gone``: not listed again), or on while it is open
(``watch.OPEN_STATES``). Only rows whose verdict is ``orphan`` count: a protected group is
never deleted, so it is no leak this product cleans."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pg8000.native

from orphan_cleanup.ledger.watch import OPEN_STATES

_OPEN = ", ".join(f"'{s}'" for s in OPEN_STATES)

#: When an orphan's life ended (infinity while open): the expression migration 0018's
#: ``orphans_report_*_idx`` indexes, written the same way so the planner matches it.
REPORT_END = (f"(CASE WHEN o.state IN ({_OPEN}) THEN 'infinity'::timestamptz"
              " WHEN o.state = 'deleted' THEN coalesce(o.deleted_at, o.last_seen) ELSE o.last_seen END)")

# The orphans whose life [born, ended) meets the period [:since, :until], with their hours in
# it and the size facts that price them (an instance type, disk GB, addresses).
_LIVES = f"""
lives AS (
  SELECT o.backend_id, o.reason, o.first_seen, o.state IN ({_OPEN}) AS open, o.state = 'deleted' AS deleted,
         coalesce(o.orphan_since, o.first_seen) AS born, {REPORT_END} AS ended,
         CASE WHEN jsonb_typeof(o.size->'instance_type') = 'string' THEN o.size->>'instance_type' END AS itype,
         CASE WHEN jsonb_typeof(o.size->'disk_gb') = 'number' THEN (o.size->>'disk_gb')::numeric ELSE 0 END
             AS disk_gb,
         CASE WHEN jsonb_typeof(o.size->'addresses') = 'array' THEN jsonb_array_length(o.size->'addresses')
              ELSE 0 END AS addresses
    FROM orphans o
   WHERE o.verdict = 'orphan' AND {REPORT_END} >= CAST(:since AS timestamptz)
     AND coalesce(o.orphan_since, o.first_seen) <= CAST(:until AS timestamptz) {{backend}}),
x AS (
  SELECT l.*, greatest(0, extract(epoch FROM least(l.ended, CAST(:until AS timestamptz))
                                    - greatest(l.born, CAST(:since AS timestamptz)))) AS secs
    FROM lives l)"""

# One statement: the counts and percentiles, and the hours per backend x reason x instance type.
_FIGURES = f"""
WITH {_LIVES},
totals AS (
  SELECT count(*) AS orphans,
         count(*) FILTER (WHERE first_seen BETWEEN CAST(:since AS timestamptz) AND CAST(:until AS timestamptz))
             AS found,
         count(*) FILTER (WHERE deleted AND ended BETWEEN CAST(:since AS timestamptz) AND CAST(:until AS timestamptz))
             AS deleted,
         count(*) FILTER (WHERE open) AS open,
         percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY greatest(0, extract(epoch FROM first_seen - born)))
             FILTER (WHERE first_seen BETWEEN CAST(:since AS timestamptz) AND CAST(:until AS timestamptz)) AS detect,
         percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY greatest(0, extract(epoch FROM ended - born)))
             FILTER (WHERE deleted AND ended BETWEEN CAST(:since AS timestamptz) AND CAST(:until AS timestamptz))
             AS delete
    FROM x),
groups AS (
  SELECT backend_id, reason, itype, count(*) AS n, sum(secs) AS secs, sum(secs * disk_gb) AS disk_secs,
         sum(secs * addresses) AS address_secs
    FROM x GROUP BY backend_id, reason, itype)
SELECT json_build_object(
  'totals', (SELECT row_to_json(t) FROM totals t),
  'groups', (SELECT coalesce(json_agg(g ORDER BY g.backend_id, g.reason, g.itype), '[]') FROM groups g),
  'prices', (SELECT coalesce(json_object_agg(b.id, b.settings->'prices'), '{{}}') FROM coverages() b
              WHERE b.settings->'prices' IS NOT NULL
                AND b.id IN (SELECT DISTINCT backend_id FROM groups)))::text"""

# Per day (UTC) of the period: the same hours, cut at midnight, and the orphans alive that day.
_DAYS = f"""
WITH {_LIVES},
days AS (
  SELECT d AS day FROM generate_series(date_trunc('day', CAST(:since AS timestamptz), 'UTC'),
                                       CAST(:until AS timestamptz), interval '1 day') AS d)
SELECT coalesce(json_agg(g ORDER BY g.day, g.backend_id, g.reason, g.itype), '[]')::text FROM (
  SELECT d.day, x.backend_id, x.reason, x.itype, count(*) AS n,
         sum(s.secs) AS secs, sum(s.secs * x.disk_gb) AS disk_secs, sum(s.secs * x.addresses) AS address_secs
    FROM x JOIN days d ON d.day < least(x.ended, CAST(:until AS timestamptz))
                      AND d.day + interval '1 day' > greatest(x.born, CAST(:since AS timestamptz))
    CROSS JOIN LATERAL (SELECT extract(epoch FROM
        least(x.ended, CAST(:until AS timestamptz), d.day + interval '1 day')
        - greatest(x.born, CAST(:since AS timestamptz), d.day)) AS secs) s
   GROUP BY d.day, x.backend_id, x.reason, x.itype) g"""


@dataclass(frozen=True)
class Hours:
    """Orphan time of one backend x reason x instance type (None: no type listed), in seconds:
    of the orphans (``secs``), of their disk GB (``disk_secs``: GB x seconds), of their
    addresses (``address_secs``); ``day``: the UTC day they fall in (per-day rows only)."""

    backend: str
    reason: str
    instance_type: str | None
    orphans: int
    secs: float
    disk_secs: float
    address_secs: float
    day: datetime | None = None


@dataclass(frozen=True)
class LeakFigures:
    """The period's figures (C3 ``report``). Percentiles are None when nothing was found
    (detect) or deleted (delete) in the period; ``prices``: each counted backend's
    ``settings.prices`` as stored, for those that have one."""

    since: datetime
    until: datetime
    orphans: int
    found: int
    deleted: int
    open: int
    detect: tuple[float, float] | None
    delete: tuple[float, float] | None
    hours: tuple[Hours, ...]
    prices: dict[str, Any]


def _hours(r: dict[str, Any]) -> Hours:
    return Hours(backend=r["backend_id"], reason=r["reason"], instance_type=r["itype"], orphans=int(r["n"]),
                 secs=float(r["secs"] or 0), disk_secs=float(r["disk_secs"] or 0),
                 address_secs=float(r["address_secs"] or 0),
                 day=datetime.fromisoformat(r["day"]) if "day" in r else None)


def _params(since: datetime, until: datetime, backend_id: str | None) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"since": since, "until": until}
    if backend_id is not None:
        params["b"] = backend_id
    return ("AND o.backend_id = :b" if backend_id is not None else ""), params


def period(conn: pg8000.native.Connection, seconds: int) -> tuple[datetime, datetime]:
    """The ``seconds`` up to the database clock now."""
    until: datetime = conn.run("SELECT oc_clock()")[0][0].astimezone(UTC)
    return until - timedelta(seconds=seconds), until


def figures(conn: pg8000.native.Connection, since: datetime, until: datetime,
            backend_id: str | None = None) -> LeakFigures:
    """The period's figures, in one statement (the period read as parameters, so the
    ``orphans_report_*_idx`` index bounds the scan)."""
    where, params = _params(since, until, backend_id)
    doc = json.loads(conn.run(_FIGURES.replace("{backend}", where), **params)[0][0])
    t = doc["totals"]

    def pair(v: list[float] | None) -> tuple[float, float] | None:
        return None if v is None else (float(v[0]), float(v[1]))

    return LeakFigures(since=since, until=until, orphans=int(t["orphans"]), found=int(t["found"]),
                       deleted=int(t["deleted"]), open=int(t["open"]), detect=pair(t["detect"]),
                       delete=pair(t["delete"]), hours=tuple(_hours(r) for r in doc["groups"]),
                       prices=doc["prices"])


def days(conn: pg8000.native.Connection, since: datetime, until: datetime,
         backend_id: str | None = None) -> list[Hours]:
    """The same hours per UTC day of the period (``Hours.day``), one statement; ``orphans``
    is then the orphans alive that day."""
    where, params = _params(since, until, backend_id)
    return [_hours(r) for r in json.loads(conn.run(_DAYS.replace("{backend}", where), **params)[0][0])]


def explain(conn: pg8000.native.Connection, since: datetime, until: datetime, backend_id: str | None = None) -> str:
    """``EXPLAIN`` of the figures' statement (the benchmark prints it)."""
    where, params = _params(since, until, backend_id)
    return "\n".join(r[0] for r in conn.run("EXPLAIN " + _FIGURES.replace("{backend}", where), **params))
