"""Which cycles deserve a digest, and its Slack text (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.digest import DigestFacts, DigestGroup, digest, slack_text, subject

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def group(n: int, *, kind: str = "instance") -> DigestGroup:
    return DigestGroup(provider_ref=f"ref{n:09d}", primary_id=f"i-{n:04x}", region="us-east-1",
                       reason="owner_terminated", first_seen=NOW - timedelta(hours=3),
                       resources=({"kind": kind, "id": f"i-{n:04x}", "details": {"InstanceType": "p3.2xlarge"}},))


def facts(**kw) -> DigestFacts:
    base = {"backend": "aws-prod", "provider": "aws", "account": "123456789012", "cycle_id": "c1", "mode": "report",
            "outcome": "clean", "failures": (), "error": None, "now": NOW, "since_clean_seconds": 400,
            "open_orphans": 0}
    return DigestFacts(**{**base, **kw})


@pytest.mark.parametrize("kw, sent", [
    ({}, False),
    ({"outcome": "unsettled"}, False),
    ({"since_clean_seconds": 6 * 900}, False),
    ({"since_clean_seconds": 6 * 900 + 1, "outcome": "unsettled"}, True),
    ({"outcome": "failed"}, True),
    ({"new_orphans": (group(1),)}, True),
    ({"deleted": (group(1),)}, True),
    ({"delete_failed": (group(1),)}, True),
], ids=["unchanged", "unsettled", "not yet stale", "stale", "failed", "new", "deleted", "delete failed"])
def test_only_an_eventful_cycle_gets_a_digest(kw, sent):
    assert (digest(facts(**kw), interval_seconds=900) is not None) == sent


def test_the_slack_text_names_ten_orphans_the_explain_command_and_how_many_more():
    doc = digest(facts(new_orphans=tuple(group(n) for n in range(12)), open_orphans=12,
                       counts={"new_orphans": 70}), interval_seconds=900)
    assert doc is not None and len(doc["new_orphans"]) == 12 and doc["counts"]["new_orphans"] == 70
    text = slack_text(doc)
    assert "aws-prod" in text and "70 new orphan(s), 0 deleted, 0 failed to delete, 12 open" in text
    assert text.count("• ") == 10 and "ref000000000 i-0000 us-east-1, 3h old, p3.2xlarge" in text.replace("`", "")
    assert "…and 60 more" in text  # 2 listed but not shown, 58 the digest left out
    assert "orphan-cleanup explain --backend aws-prod ref000000000" in text
    assert len(subject(doc)) <= 100


def test_the_slack_text_escapes_every_value_from_a_listing():
    """SAFETY.md rule 22: text from a listing is escaped for Slack (``&``, ``<``, ``>``)."""
    forged = "<!channel> <https://evil.example/approve|Approve deletion> & more"
    g = DigestGroup(provider_ref="ref<!here>1", primary_id=forged, region="us-<b>east", reason="owner_terminated",
                    first_seen=NOW - timedelta(hours=3),
                    resources=({"kind": "instance", "id": forged, "details": {"InstanceType": forged}},))
    doc = digest(facts(new_orphans=(g,), backend="aws<@U123>", outcome="failed",
                       failures=({"region": "us-east-1", "error": forged},)), interval_seconds=900)

    text = slack_text(doc)

    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt; &lt;https://evil.example/approve|Approve deletion&gt; &amp; more" in text
    assert "ref&lt;!here&gt;1" in text and "aws&lt;@U123&gt;" in text
