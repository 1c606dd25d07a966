"""A failed cycle's reason, as `status`, `backend show` and the `cycle_failed` event show it
(README, "When one fires"): one line, its failed regions with theirs, and no secret
(SAFETY.md rule 22)."""

from __future__ import annotations

from orphan_cleanup.core.listing import RegionFailure
from orphan_cleanup.ledger.locked import reason_line


def test_the_reason_names_each_failed_region_once_on_one_line():
    failures = [RegionFailure(region="europe-west1", error="Forbidden:\n403 GET .../aggregated/instances")]
    assert reason_line("no region could be listed", failures) == (
        "no region could be listed: europe-west1: Forbidden: 403 GET .../aggregated/instances")
    # an error that already says it (the identity check: region "*") is not repeated
    said = "identity_check_failed: AccessDenied: projects.get p: access denied"
    assert reason_line(said, [RegionFailure(region="*", error=said)]) == said
    assert reason_line("no region could be listed: r1: boom", [RegionFailure(region="r1", error="boom")]) == (
        "no region could be listed: r1: boom")


def test_the_reason_carries_no_secret():
    reason = reason_line("listing failed: cannot reach postgresql://cleanup:hunter2secret@db.internal/platform",
                         [RegionFailure(region="us-east-1", error="token=abcdef0123456789 rejected")])
    assert "hunter2secret" not in reason and "abcdef0123456789" not in reason
    assert reason.startswith("listing failed: cannot reach postgresql://") and "us-east-1" in reason
    assert len(reason_line("x" * 10_000)) <= 2000
