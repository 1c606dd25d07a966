"""Which cycles deserve a digest, and its Slack text (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orphan_cleanup.core.costs import HOURS_PER_MONTH, Prices
from orphan_cleanup.core.digest import DigestFacts, DigestGroup, digest, slack_text, subject

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def group(n: int, *, kind: str = "instance") -> DigestGroup:
    return DigestGroup(provider_ref=f"ref{n:09d}", primary_id=f"i-{n:04x}", region="us-east-1",
                       reason="owner_terminated", first_seen=NOW - timedelta(hours=3),
                       resources=({"kind": kind, "id": f"i-{n:04x}",
                                   "created_at": (NOW - timedelta(hours=3)).isoformat(),
                                   "details": {"InstanceType": "p3.2xlarge"}},))


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
    assert text.count("• ") == 10
    assert "ref000000000 i-0000 us-east-1, owner unknown, 3h old, orphan for 3h, p3.2xlarge" in text.replace("`", "")
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


# ---- what each orphan item tells (DESIGN C6: owner_name, created_at, orphan_since, cost_per_hour) ----

CREATED = NOW - timedelta(days=120)
ENDED = NOW - timedelta(days=90)
PRICES = Prices(instance_hour={"p3.2xlarge": 3.06}, disk_gb_month=0.1, address_hour=0.005)


def leaked(**kw) -> DigestGroup:
    """A VM created 120 days ago whose owner ended 90 days ago, first seen now."""
    base = {"provider_ref": "k3j9x0q2m1ab", "primary_id": "i-0abc", "region": "us-east-1",
            "reason": "owner_terminated", "first_seen": NOW, "owner_name": "train-7", "owner_end": ENDED,
            "resources": ({"kind": "instance", "id": "i-0abc", "created_at": CREATED.isoformat(),
                           "details": {"InstanceType": "p3.2xlarge"}},
                          {"kind": "volume", "id": "vol-1", "created_at": (CREATED - timedelta(days=1)).isoformat(),
                           "details": {"Size": 100}})}
    return DigestGroup(**{**base, **kw})


def test_an_orphan_item_tells_its_owner_its_age_from_creation_how_long_orphaned_and_its_cost():
    doc = digest(facts(new_orphans=(leaked(),), prices=PRICES), interval_seconds=900)

    [item] = doc["new_orphans"]
    assert item["owner_name"] == "train-7"
    assert item["created_at"] == CREATED.isoformat()  # the primary's creation, not the older volume's
    assert item["orphan_since"] == ENDED.isoformat()  # its owner's end
    assert item["age_seconds"] == 120 * 86400 and item["orphan_seconds"] == 90 * 86400
    assert item["first_seen"] == NOW.isoformat()  # first seen now: a months-old leak is not "0s old"
    assert item["cost_per_hour"] == pytest.approx(3.06 + 100 * 0.1 / HOURS_PER_MONTH)


@pytest.mark.parametrize("kw, since", [
    ({"owner_end": None}, CREATED),  # a live owner (a lost attempt, a failover leftover): since its creation
    ({"owner_end": CREATED - timedelta(days=5)}, CREATED),  # created after its owner ended: from its creation
], ids=["owner not ended", "created after the owner's end"])
def test_an_orphan_is_one_since_its_creation_when_its_owner_did_not_end_before(kw, since):
    [item] = digest(facts(new_orphans=(leaked(**kw),)), interval_seconds=900)["new_orphans"]
    assert item["orphan_since"] == since.isoformat()


def test_what_is_not_known_is_null():
    """No price table, no creation time, no owner name: null, never a guess."""
    g = leaked(owner_name=None, owner_end=None, resources=({"kind": "instance", "id": "i-0abc",
                                                             "details": {"InstanceType": "p3.2xlarge"}},))
    [item] = digest(facts(new_orphans=(g,)), interval_seconds=900)["new_orphans"]
    assert (item["owner_name"], item["created_at"], item["orphan_since"], item["cost_per_hour"],
            item["age_seconds"], item["orphan_seconds"]) == (None, None, None, None, None, None)
    # a price table that prices nothing of the group does not make it free
    unpriced = Prices(instance_hour={"m5.large": 0.096})
    [item] = digest(facts(new_orphans=(g,), prices=unpriced), interval_seconds=900)["new_orphans"]
    assert item["cost_per_hour"] is None


def test_a_group_of_leftovers_is_as_old_as_its_oldest_resource():
    g = leaked(primary_id=None, owner_end=None,
               resources=({"kind": "volume", "id": "vol-2", "created_at": (NOW - timedelta(days=3)).isoformat()},
                          {"kind": "volume", "id": "vol-1", "created_at": (NOW - timedelta(days=7)).isoformat()},
                          {"kind": "volume", "id": "vol-3", "created_at": "not a time"}))
    [item] = digest(facts(new_orphans=(g,)), interval_seconds=900)["new_orphans"]
    assert item["created_at"] == item["orphan_since"] == (NOW - timedelta(days=7)).isoformat()


def test_the_slack_text_tells_owner_age_orphan_time_and_cost():
    text = slack_text(digest(facts(new_orphans=(leaked(),), prices=PRICES), interval_seconds=900))
    line = next(x for x in text.splitlines() if x.startswith("• "))
    assert "owner train-7" in line and "120d old" in line and "orphan for 90d" in line
    assert "est. 3.07/h" in line  # 3.06 + 100 GB at 0.1 a month
    assert "0s old" not in text
    # without a price table, no cost is shown; without a creation time, the age is unknown
    g = leaked(owner_end=None, resources=({"kind": "instance", "id": "i-0abc"},))
    line = next(x for x in slack_text(digest(facts(new_orphans=(g,)), interval_seconds=900)).splitlines()
                if x.startswith("• "))
    assert "/h" not in line and "age unknown" in line


def test_the_slack_text_escapes_the_owner_name():
    """SAFETY.md rule 22: every value is escaped, the ledger's owner name included."""
    forged = "<!channel> <https://evil.example|Approve> & co"
    text = slack_text(digest(facts(new_orphans=(leaked(owner_name=forged),)), interval_seconds=900))
    assert "<" not in text and ">" not in text
    assert "owner &lt;!channel&gt; &lt;https://evil.example|Approve&gt; &amp; co" in text


def test_the_readme_shows_the_digest_and_its_slack_line_as_the_code_makes_them():
    """README, "Digests": its C6 example has the document's keys and each group's, and its
    Slack example is the line ``slack_text`` writes for that group."""
    import json
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Digests"):readme.index("### Alarms")]
    example = json.loads(re.sub(r'"(vol-0123|c-5f0e)\.\.\."', r'"\1"',
                                section[section.index('{"type": "orphan-cleanup.cycle"'):].split("```")[0]))
    [shown] = example["new_orphans"]
    made = digest(facts(new_orphans=(leaked(),), prices=PRICES), interval_seconds=900)
    assert set(example) == set(made)
    assert set(shown) == set(made["new_orphans"][0])
    # the README's group, rendered by the code, is the README's Slack line
    created, since = datetime.fromisoformat(shown["created_at"]), datetime.fromisoformat(shown["orphan_since"])
    at = datetime.fromisoformat(example["at"])
    g = DigestGroup(provider_ref=shown["provider_ref"], primary_id=shown["primary_id"], region=shown["region"],
                    reason=shown["reason"], first_seen=datetime.fromisoformat(shown["first_seen"]),
                    owner_name=shown["owner_name"], owner_end=since,
                    resources=({"kind": "instance", "id": shown["primary_id"], "created_at": created.isoformat(),
                                "details": {"InstanceType": "p3.2xlarge"}},
                               {"kind": "volume", "id": "vol-0123", "details": {"Size": 108}}))
    doc = digest(facts(new_orphans=(g,), now=at, prices=PRICES), interval_seconds=900)
    [item] = doc["new_orphans"]
    assert {k: item[k] for k in ("age_seconds", "orphan_seconds", "cost_per_hour", "size")} == {
        k: shown[k] for k in ("age_seconds", "orphan_seconds", "cost_per_hour", "size")}
    [line] = [x for x in slack_text(doc).splitlines() if x.startswith("• ")]
    assert line in section
