"""Human output: plain tables when piped, with color on a terminal.

Color follows the usual conventions: only when the stream is a terminal, never
with ``NO_COLOR`` set (any value) or ``TERM=dumb``; ``FORCE_COLOR`` (non-empty)
turns it on even when piped. Streams default to the *current* ``sys.stdout``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from orphan_cleanup.core.listing import ResourceGroup
    from orphan_cleanup.cycle.plan import Plan, PlannedDelete

COLORS = {"orphan": "31", "protected": "33", "skipped": "35", "tracked": "32", "ignored": "90",
          "clean": "32", "unsettled": "33", "failed": "31"}
_ANSI = re.compile(r"\033\[[0-9;]*m")


def use_color(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def verdict_style(verdict: str, stream: TextIO | None = None) -> str:
    """A verdict or outcome word, colored when ``stream`` shows color."""
    if verdict in COLORS and use_color(stream):
        return f"\033[{COLORS[verdict]}m{verdict}\033[0m"
    return verdict


def write_json_document(head: Mapping[str, Any], key: str, items: Iterable[Any], stream: TextIO | None = None) -> None:
    """Print ``{**head, key: [*items]}`` exactly as ``print(json.dumps(doc, indent=2))``
    would, writing each item as it comes (``key`` is the document's last key): a
    document of any length in flat memory (``run --json``)."""
    stream = stream or sys.stdout
    opening = json.dumps({**head, key: []}, indent=2)
    assert opening.endswith("[]\n}"), "the streamed list must be the document's last key"
    stream.write(opening[:-len("[]\n}")])
    sep = "["
    for item in items:
        stream.write(sep + "\n    " + json.dumps(item, indent=2).replace("\n", "\n    "))
        sep = ","
    stream.write("\n  ]\n}\n" if sep == "," else "[]\n}\n")


def _visible_len(s: str) -> int:
    return len(_ANSI.sub("", s))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], stream: TextIO | None = None,
                indent: int = 0) -> None:
    """Left-aligned columns two spaces apart; a bold header on a terminal;
    ``(none)`` when there are no rows."""
    stream = stream or sys.stdout
    pad = " " * indent
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], _visible_len(str(cell)))

    def line(cells: Sequence[str]) -> str:
        padded = (str(c) + " " * (w - _visible_len(str(c))) for c, w in zip(cells, widths, strict=False))
        return (pad + "  ".join(padded)).rstrip()

    head = line(headers)
    print(f"{pad}\033[1m{head[indent:]}\033[0m" if use_color(stream) else head, file=stream)
    for row in rows:
        print(line(row), file=stream)
    if not rows:
        print(f"{pad}(none)", file=stream)


def print_fields(pairs: Sequence[tuple[str, str]], stream: TextIO | None = None, indent: int = 0) -> None:
    """``name  value`` lines, the values aligned (one record, as ``backend show`` prints it)."""
    stream = stream or sys.stdout
    width = max((len(name) for name, _ in pairs), default=0)
    for name, value in pairs:
        print(f"{' ' * indent}{name.ljust(width)}  {value}".rstrip(), file=stream)


def human_time(value: str | datetime | None, now: datetime | None = None, *, never: str = "never") -> str:
    """``2024-05-01 12:00:05Z (3m ago)`` / ``(in 14m)``: second precision and
    a relative hint; ``never`` for a missing value."""
    if value is None:
        return never
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    delta = round(((now or datetime.now(UTC)) - when).total_seconds())
    return f"{when:%Y-%m-%d %H:%M:%S}Z ({_span(delta)} ago)" if delta >= 0 else \
        f"{when:%Y-%m-%d %H:%M:%S}Z (in {_span(-delta)})"


def span(seconds: int) -> str:
    """``3d``, ``2h``, ``5m``, ``40s``: the largest whole unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


_span = span


def ago(when: datetime | None, now: datetime | None = None) -> str:
    """``3h ago`` (``in 2m`` for a time ahead), ``?`` when unknown."""
    if when is None:
        return "?"
    delta = round(((now or datetime.now(UTC)) - when.astimezone(UTC)).total_seconds())
    return f"{_span(delta)} ago" if delta >= 0 else f"in {_span(-delta)}"


def print_plan(plan: Plan, stream: TextIO | None = None) -> None:
    """A delete run's plan, before it is confirmed: each group with its resources,
    owner, reason and the age of the evidence (the owner's last change, the creation)."""
    stream = stream or sys.stdout
    n = len(plan.deletes)
    print(f"plan: delete {n} orphan group(s) of backend {plan.backend_id} (cycle {plan.cycle_id})", file=stream)

    def owner(d: PlannedDelete) -> str:
        if d.owner_id is None:
            return "-"
        return f"{d.owner_name} ({d.owner_id})" if d.owner_name else d.owner_id

    def age(d: PlannedDelete) -> str:
        return f"owner {d.owner_state} {ago(d.owner_since)}; created {ago(d.created_at)}"

    print_table(["ref", "region", "resources", "owner", "reason", "age"],
                [[d.group.provider_ref, d.group.region, _resources(d.group), owner(d), d.reason, age(d)]
                 for d in plan.deletes], stream=stream)
    if plan.marked:
        from orphan_cleanup.cycle.plan import marked_line  # the run's own line (cycle/runner.py)

        print(marked_line(len(plan.marked), min(m.delete_after for m in plan.marked)), file=stream)
        print_table(["ref", "region", "resources", "reason", "deleted after"],
                    [[m.group.provider_ref, m.group.region, _resources(m.group), m.reason, human_time(m.delete_after)]
                     for m in plan.marked], stream=stream)


def _resources(group: ResourceGroup) -> str:
    return ", ".join(f"{r.kind.value}:{r.id}" for r in group.resources)


# SQLSTATE classes a server answers while a connection is being set up: the role,
# its password, the database name, too many clients, a server starting up.
_CONNECT_STATES = ("08", "28", "3D", "53", "57P03")


def database_error_line(exc: BaseException, where: str | None = None) -> str:
    """One readable line for a database failure (a ``DatabaseError`` or a raw pg8000 error):
    a server's answer as ``SQLSTATE <code> <message>``; a connection that could not be
    made as refused / timed out / DNS failure; ``where`` names the database."""
    at = f" at {where}" if where else ""
    chain = list(_causes(exc))
    server = next((e for e in chain if e.args and isinstance(e.args[0], dict)), None)
    if server is not None:
        fields = server.args[0]
        code = str(fields.get("C", "?"))
        text = _one_line(f"SQLSTATE {code} {fields.get('M', '')}")
        return f"cannot connect to the database{at}: {text}" if code.startswith(_CONNECT_STATES) \
            else f"database error: {text}"
    for e in chain:
        if isinstance(e, ssl.SSLError):
            break  # the library's own message names the TLS problem
        if isinstance(e, ConnectionRefusedError):
            return f"cannot connect to the database{at}: connection refused (is Postgres listening there?)"
        if isinstance(e, socket.gaierror):
            return f"cannot connect to the database{at}: DNS failure (the host name does not resolve)"
        if isinstance(e, TimeoutError):
            return f"cannot connect to the database{at}: timed out (no answer from the server)"
        if isinstance(e, OSError):
            from orphan_cleanup.ledger.db import network_failure

            why = network_failure(e, connecting=True) or _one_line(e.strerror or str(e))
            return f"database connection failed{at}: {why}"
    return _one_line(str(exc))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _one_line(text: str) -> str:
    return " ".join(text.split())
