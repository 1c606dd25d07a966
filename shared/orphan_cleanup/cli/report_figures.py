"""The figures of ``orphan-cleanup report`` (C3), priced, and how they read: the JSON
document, money, hours and durations as text, the reason legend. Shared by the table
(``cli/report.py``) and the page (``cli/report_html.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from orphan_cleanup.cli.output import span
from orphan_cleanup.core.costs import Prices, cost_of_hours
from orphan_cleanup.ledger.leaks import Hours, LeakFigures

#: The cause each orphan reason stands for (README, the reason table), for the legend.
REASON_CAUSES = {
    "owner_deleted": "the owner row was hard-deleted: a failed placeholder, a crash before the commit",
    "owner_soft_deleted": "the owner was soft-deleted (deleted_at) while its resources lived on",
    "owner_terminated": "the owner is terminated: a termination that gave up, or a VM that came back",
    "primary_mismatch": "a lost attempt: a retry's first VM, beside the one the owner records",
    "backend_mismatch": "a failover leftover: the owner moved to a backend of another account or provider",
    "leftover_of_orphan": "volumes or interfaces left behind by an orphan VM",
}

#: Decimals of the figures: hours to well under a second, money well under a cent.
_PLACES = 6


@dataclass(frozen=True)
class Priced:
    """The price tables of the counted backends (valid ones only) and how to price hours."""

    tables: dict[str, Prices]

    def cost(self, rows: Iterable[Hours]) -> float | None:
        """What ``rows`` cost at their backends' prices; None when none of their backends has
        a price table (an unpriced orphan is not a free one)."""
        costs = [cost_of_hours(p, instance_type=h.instance_type, hours=h.secs / 3600,
                               disk_gb_hours=h.disk_secs / 3600, address_hours=h.address_secs / 3600)
                 for h in rows if (p := self.tables.get(h.backend)) is not None]
        return sum(costs) if costs else None


def price_tables(stored: dict[str, Any], *, warn: bool = True) -> Priced:
    """Each backend's ``settings.prices``; one that is not valid prices nothing (a warning
    on stderr, as ``orphans`` gives)."""
    tables: dict[str, Prices] = {}
    for backend, value in sorted(stored.items()):
        try:
            tables[backend] = Prices.model_validate(value)
        except ValidationError as e:
            if warn:
                print(f"orphan-cleanup: warning: backend {backend}: settings.prices ignored:"
                      f" {e.errors()[0]['msg']}", file=sys.stderr)
    return Priced(tables)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, _PLACES)


def _percentiles(pair: tuple[float, float] | None) -> dict[str, float | None]:
    return {"p50": None, "p90": None} if pair is None else {"p50": round(pair[0], 3), "p90": round(pair[1], 3)}


def _breakdown(key: str, rows: Iterable[Hours], priced: Priced) -> list[dict[str, Any]]:
    by: dict[str, list[Hours]] = {}
    for h in rows:
        by.setdefault(h.backend if key == "backend" else h.reason, []).append(h)
    out = []
    for name, hs in by.items():
        out.append({key: name, "count": sum(h.orphans for h in hs),
                    "orphan_hours": round(sum(h.secs for h in hs) / 3600, _PLACES), "cost": _round(priced.cost(hs))})
    return sorted(out, key=lambda d: (-d["orphan_hours"], d[key]))


def report_doc(f: LeakFigures, priced: Priced) -> dict[str, Any]:
    """The ``report --json`` document (C3)."""
    return {"since": f.since.isoformat(), "until": f.until.isoformat(), "orphans_found": f.found,
            "orphans_deleted": f.deleted, "orphans_open": f.open,
            "orphan_hours": round(sum(h.secs for h in f.hours) / 3600, _PLACES), "cost": _round(priced.cost(f.hours)),
            "by_reason": _breakdown("reason", f.hours, priced),
            "by_backend": _breakdown("backend", f.hours, priced),
            "time_to_detect_seconds": _percentiles(f.detect), "time_to_delete_seconds": _percentiles(f.delete)}


def money(value: float | None) -> str:
    """As ``orphans`` and the digest show a cost: two decimals from 1 up, four below."""
    return "-" if value is None else f"{value:,.2f}" if value >= 1 else f"{value:.4f}"


def hours_text(value: float) -> str:
    """Hours: one decimal from 1 up, three below (a few minutes are not "0.0")."""
    return f"{value:,.1f}" if value >= 1 else f"{value:.3f}"


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else span(int(seconds))


def legend(reasons: Iterable[str]) -> list[tuple[str, str]]:
    """(reason, its cause) for each reason shown, in that order."""
    return [(r, REASON_CAUSES.get(r, "see the README's reason table")) for r in reasons]
