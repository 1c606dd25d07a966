"""The evidence of a verdict (``evidence.record_of``) and its words: facts only,
compact, one sentence per rule, and every reason ``classify`` can give named in
README's reason table."""

from __future__ import annotations

import ast
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orphan_cleanup.core import classify as classify_module
from orphan_cleanup.core import evidence
from orphan_cleanup.core.classify import ClassifyContext, classify
from tests.support.ledger_helpers import group, leftovers, resource
from tests.unit.test_classify import (
    BACKEND,
    CTX,
    G1,
    G2,
    LEFT,
    LISTED,
    MARGIN,
    MARGIN_EDGES,
    OLD,
    OTHER_ACCOUNT,
    PROTECT,
    REF,
    RULES,
    SCOPE,
    live,
    terminated,
)

ROOT = Path(__file__).resolve().parents[2]
MALFORMED = ("a dependent without the ref tag", group(REF, "i-1", created_at=OLD, extra=[
    resource("vol-1", kind="volume", created_at=OLD)]), terminated(), "malformed_group")
CASES = [(r[0], r[1], r[2], r[4]) for r in RULES] + [(r[0], r[1], r[2], r[4]) for r in MARGIN_EDGES] + [MALFORMED]


def reasons_in_classify() -> set[str]:
    """Every reason literal ``classify.py`` passes to ``_v`` or ``_orphan_unless_recent``."""
    tree = ast.parse(Path(classify_module.__file__).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        arg = {"_v": 1, "_orphan_unless_recent": 3}.get(node.func.id)
        if arg is None or len(node.args) <= arg:
            continue
        for value in ast.walk(node.args[arg]):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(value.value)
    return found


def readme_reasons() -> set[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([a-z_]+)` \| (?:tracked|orphan|skipped|ignored|protected) \|", text, re.M))


def no_empty_values(value: Any) -> bool:
    if isinstance(value, dict):
        return all(v not in (None, "", [], {}) and no_empty_values(v) for v in value.values())
    if isinstance(value, list):
        return all(no_empty_values(v) for v in value)
    return True


def test_every_reason_classify_gives_has_a_rule_and_a_readme_row():
    reasons = reasons_in_classify()
    assert {"owner_terminated", "primary_mismatch", "backend_mismatch", "malformed_group"} <= reasons
    assert reasons == set(evidence.RULES)
    assert reasons == readme_reasons()
    assert evidence.STEP5 <= reasons


@pytest.mark.parametrize("grp, record, reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_record_of_every_rule_is_compact_and_has_only_values(grp, record, reason):
    # given a classified group
    verdict = classify(grp, record, CTX)
    assert verdict.reason == reason
    # when its evidence and detail are stated
    ev = evidence.record_of(grp, record, CTX, verdict)
    line = evidence.detail(reason, ev, grp, LISTED)
    # then the record is small, JSON, without empty keys; the verdict is untouched
    assert no_empty_values(ev), ev
    assert len(json.dumps({**ev, "d": line})) < 600
    assert classify(grp, record, CTX) == verdict
    assert (line is None) is (reason == "tracked"), line
    expanded = evidence.expand(reason, ev, grp, LISTED)
    assert expanded is not None and expanded["rule"] == evidence.RULES[reason]
    assert expanded["margin_applied"] is (reason in evidence.STEP5)
    assert (expanded["owner"] is None) is (record is None)


def test_the_record_holds_the_facts_read():
    ctx = ClassifyContext(backend_id=BACKEND, scope=SCOPE, listed_at=LISTED, margin=MARGIN, protect_key="keep",
                          tag_key="ref")
    record = live(backend_id="aws-dr", owner_backend_scope=OTHER_ACCOUNT, deleted_at=OLD + timedelta(hours=2))
    grp = group(REF, "i-2", created_at=LISTED - timedelta(seconds=10), tags={"keep": "1"})

    ev = evidence.record_of(grp, record, ctx, classify(grp, record, ctx))

    assert ev == {"m": 300, "tk": "ref", "pk": "keep", "o": "inst-1", "on": "train-1", "st": "idle", "ob": "aws-dr",
                  "os": OTHER_ACCOUNT, "sc": SCOPE, "pid": "i-1",
                  "t": {"is": 86400.0, "cr": 86400.0, "pr": 86400.0, "de": 79200.0},
                  "pt": ["i-2"], "rr": ["i-2"]}


def test_leftovers_count_the_resources_seen_in_earlier_orphan_groups():
    record = live(known_orphan_resource_ids=frozenset({"vol-1"}))
    verdict = classify(LEFT, record, CTX)
    ev = evidence.record_of(LEFT, record, CTX, verdict)
    assert (verdict.reason, ev["ko"]) == ("unattached_of_live_owner", 1)
    assert evidence.detail(verdict.reason, ev, LEFT, LISTED) == (
        "owner inst-1 is idle; 1 of 2 resource(s) were in an earlier orphan group")


@pytest.mark.parametrize("grp, record, expected", [
    (G1, terminated(), "owner inst-1 terminated 23h before listing (margin 5m)"),
    (G1, terminated(terminated_at=LISTED - timedelta(seconds=30)),
     "owner inst-1 terminated_at 30s before listing, within the 5m margin"),
    (G2, live(), "owner inst-1 records i-1; this VM was created at the time of the owner's provisioning"
                 " (margin 5m): a lost attempt"),
    (group(REF, "i-2", created_at=OLD + timedelta(hours=2)), live(),
     "owner inst-1 records i-1; this VM was created 2h after the owner's provisioning (margin 5m): a copy"),
    (group(REF, "i-2", created_at=OLD - timedelta(minutes=2)), live(backend_id="aws-dr",
                                                                      owner_backend_scope=OTHER_ACCOUNT),
     f"owner inst-1 records i-1 on backend aws-dr ({OTHER_ACCOUNT}); this VM was created 2m before the owner's"
     " provisioning (margin 5m): a lost attempt"),
    (group(REF, "i-1", created_at=OLD, tags={PROTECT: "yes"}), terminated(), f"i-1 carries {PROTECT}"),
    (leftovers(REF, "vol-1", created_at=LISTED - timedelta(seconds=5)), terminated(),
     "vol-1 created within the 5m margin of listing"),
    (G1, live(backend_id="aws"), "live owner inst-1 names backend 'aws', which is no backends row"),
])
def test_the_detail_line_states_the_deciding_fact(grp, record, expected):
    ev = evidence.record_of(grp, record, CTX, verdict := classify(grp, record, CTX))
    assert evidence.detail(verdict.reason, ev, grp, LISTED) == expected


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (0.2, "under 1s"), (45, "45s"), (300, "5m"), (312, "5m12s"),
                                           (11520, "3h12m"), (3600, "1h"), (2 * 86400 + 3 * 3600, "2d3h"),
                                           (-90, "1m30s")])
def test_spans_read_as_two_units(seconds, text):
    assert evidence.span(seconds) == text
