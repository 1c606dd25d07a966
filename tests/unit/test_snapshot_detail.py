"""The snapshots a deletion kept (issue #15 item 4), named in a group's detail and in
``explain``'s delete line; a recorded result of another shape names nothing (fail closed)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from orphan_cleanup.cli import explain
from orphan_cleanup.core import evidence
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.ledger.explain import DeleteRow, ExplainedGroup

REF = "abcdefabcdef"


def explained(result: dict[str, Any]) -> ExplainedGroup:
    group = ResourceGroup.model_validate({"provider_ref": REF, "region": "us-east-1", "primary_id": None,
                                          "resources": [{"kind": "volume", "id": "vol-1", "region": "us-east-1",
                                                         "state": "available", "tags": {"provider_ref": REF}}]})
    return ExplainedGroup(cycle_id="c", listed_at=datetime(2026, 12, 1, tzinfo=UTC), mode="delete", manual=True,
                          outcome="clean", blocked_reason=None, group=group, verdict="orphan",
                          reason="owner_deleted", action="deleted", error=None, evidence=None,
                          delete=DeleteRow(state="done", attempts=1, updated_at=None,
                                           result={"result": result, "error": None, "skipped": None}))


def test_the_note_names_taken_and_pending_snapshots() -> None:
    assert evidence.snapshot_note([("vol-1", "snap-0abc")]) == "snapshot snap-0abc of vol-1"
    assert evidence.snapshot_note([], [("123", "oc-x-123")]) == "snapshot oc-x-123 of 123 (still being taken: 123 kept)"
    assert evidence.snapshot_note([], []) is None


def test_explains_delete_line_names_the_kept_snapshot() -> None:
    g = explained({"status": "deleted", "deleted": ["vol-1"], "snapshots": [["vol-1", "snap-0abc"]]})
    [line] = [x for x in explain.block(g) if x.lstrip().startswith("delete ")]
    assert "deleted vol-1" in line and "kept snapshot snap-0abc of vol-1" in line


@pytest.mark.parametrize("shape", ["snap-0abc", {"vol-1": "snap-0abc"}, [["vol-1"]], [["vol-1", 7]],
                                   [["vol-1", ""]], [None], 7],
                         ids=["str", "dict", "short", "int", "empty", "null-entry", "int-field"])
def test_a_recorded_snapshot_field_of_another_shape_names_nothing(shape: Any) -> None:
    assert evidence.snapshot_pairs(shape) is None
    g = explained({"status": "deleted", "deleted": ["vol-1"], "snapshots": shape})
    assert g.delete is not None
    found = explain.reread(g, g.delete)
    assert "snapshots: the record cannot be read" in found and "kept snapshot" not in found


def test_a_result_without_snapshots_names_none() -> None:
    g = explained({"status": "deleted", "deleted": ["vol-1"]})
    assert g.delete is not None and "snapshot" not in explain.reread(g, g.delete)
    assert evidence.snapshot_pairs(None) == []
