"""The pure rules of the one snapshot module (``providers.snapshots``), table-driven, for both
clouds' naming: which snapshots the deleter took itself (``taken_by_us``, SAFETY.md rule 15),
when one is past its retention (``expired``), why a group's snapshot is kept
(``snapshot_kept``) and which ones a listing shows (``listable``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from orphan_cleanup.core.backends import SNAPSHOT_SOURCE_KEY
from orphan_cleanup.providers.aws.snapshots import name_for as aws_name_for
from orphan_cleanup.providers.gcp.snapshots import snapshot_name as gcp_name_for
from orphan_cleanup.providers.snapshots import SnapshotFacts, expired, listable, snapshot_kept, taken_by_us

KEY = "provider_ref"
REF = "abcdefabcdef"
OTHER = "bbbbbbbbbbbb"
NOW = datetime(2026, 12, 1, tzinfo=UTC)
DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)
VOL = "vol-0123456789abcdef0"
DISK = "1234567890123"

#: One of ours on AWS (EC2 names it), one of ours on GCP (named by the deleter), both old.
AWS_OURS = SnapshotFacts(id="snap-0123456789abcdef0", tags={KEY: REF, SNAPSHOT_SOURCE_KEY: VOL}, source_id=VOL,
                         name=None, created_at=NOW - 30 * DAY, progress="ready", state="completed")
GCP_OURS = SnapshotFacts(id="555", tags={KEY: REF, SNAPSHOT_SOURCE_KEY: DISK}, source_id=DISK,
                         name=f"oc-{REF}-{DISK}", created_at=NOW - 30 * DAY, progress="ready", state="READY")
CLOUDS = [pytest.param(AWS_OURS, aws_name_for, id="aws"), pytest.param(GCP_OURS, gcp_name_for, id="gcp")]


def with_tags(facts: SnapshotFacts, **changes: str | None) -> SnapshotFacts:
    """``facts`` with tags changed: a value sets the tag, None removes it."""
    tags = dict(facts.tags)
    for k, v in changes.items():
        key = SNAPSHOT_SOURCE_KEY if k == "source" else k
        if v is None:
            tags.pop(key, None)
        else:
            tags[key] = v
    return replace(facts, tags=tags)


# ---- taken_by_us -------------------------------------------------------------------------------


@pytest.mark.parametrize(("ours", "name_for"), CLOUDS)
@pytest.mark.parametrize(("change", "ref", "taken"), [
    (lambda f: f, REF, True),
    (lambda f: f, None, True),  # a listing: whatever ref it carries
    (lambda f: with_tags(f, provider_ref=OTHER), REF, False),  # another group's
    (lambda f: with_tags(f, provider_ref=None), REF, False),  # no ref: a backup that dropped it
    (lambda f: with_tags(f, provider_ref=None), None, False),
    (lambda f: with_tags(f, provider_ref=""), None, False),  # the key with an empty value
    (lambda f: with_tags(f, source=None), REF, False),  # AWS Backup, DLM, a schedule: no source tag
    (lambda f: with_tags(f, source="vol-0ffffffffffffffff"), REF, False),  # a copy names another volume
    (lambda f: with_tags(f, source=""), REF, False),
    (lambda f: replace(f, source_id=None), REF, False),  # a source no read names
    (lambda f: replace(f, source_id="vol-0ffffffffffffffff"), REF, False),  # taken of another volume
    (lambda f: replace(f, source_id=""), REF, False),
    (lambda f: with_tags(replace(f, source_id=""), source=""), REF, False),  # empty matches empty: still not
], ids=["ours", "ours-any-ref", "other-ref", "no-ref", "no-ref-any-ref", "empty-ref",
        "no-source-tag", "source-tag-other-volume", "empty-source-tag", "no-source", "other-source",
        "empty-source", "both-empty"])
def test_taken_by_us(ours: SnapshotFacts, name_for, change, ref: str | None, taken: bool) -> None:
    assert taken_by_us(change(ours), tag_key=KEY, ref=ref, name_for=name_for) is taken


def test_without_a_ref_any_ref_it_carries_is_taken_with_the_name_for_that_ref() -> None:
    # a listing knows no group: another ref's snapshot is ours under that ref; on GCP only
    # with the name the deleter gives for that ref
    assert taken_by_us(with_tags(AWS_OURS, provider_ref=OTHER), tag_key=KEY, ref=None, name_for=aws_name_for)
    other = with_tags(GCP_OURS, provider_ref=OTHER)
    assert not taken_by_us(other, tag_key=KEY, ref=None, name_for=gcp_name_for)  # named for REF
    assert taken_by_us(replace(other, name=f"oc-{OTHER}-{DISK}"), tag_key=KEY, ref=None, name_for=gcp_name_for)


@pytest.mark.parametrize(("name", "taken"), [
    (f"oc-{REF}-{DISK}", True),
    (None, False),  # GCP names every snapshot: one without a readable name is not ours
    (f"oc-{OTHER}-{DISK}", False),
    (f"oc-{REF}-9999", False),
    (f"OC-{REF}-{DISK}", False),
    ("my-own-backup", False),
], ids=["our-name", "no-name", "other-ref-name", "other-disk-name", "case", "foreign-name"])
def test_taken_by_us_on_gcp_needs_the_name_the_deleter_gives(name: str | None, taken: bool) -> None:
    assert taken_by_us(replace(GCP_OURS, name=name), tag_key=KEY, ref=REF, name_for=gcp_name_for) is taken


def test_taken_by_us_on_aws_ignores_the_name() -> None:
    assert taken_by_us(replace(AWS_OURS, name="anything"), tag_key=KEY, ref=REF, name_for=aws_name_for)


def test_a_ref_that_names_no_snapshot_is_not_ours() -> None:
    # the GCP name cannot be formed (not a resource name): ProviderError, read as "not ours"
    odd = "Ref With Spaces"
    facts = replace(with_tags(GCP_OURS, provider_ref=odd), name=f"oc-{odd}-{DISK}")
    assert taken_by_us(facts, tag_key=KEY, ref=None, name_for=gcp_name_for) is False


# ---- expired -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("created", "days", "is_expired"), [
    (NOW - 7 * DAY, 7, True),
    (NOW - 7 * DAY - SECOND, 7, True),
    (NOW - 7 * DAY + SECOND, 7, False),
    (NOW - 400 * DAY, 7, True),
    (NOW, 7, False),
    (NOW + DAY, 7, False),  # a clock ahead: not old
    (NOW - DAY, 1, True),
    (NOW - DAY + SECOND, 1, False),
    ((NOW - 7 * DAY).astimezone(timezone(timedelta(hours=5, minutes=30))), 7, True),  # aware, any zone
    ((NOW - 7 * DAY + SECOND).astimezone(timezone(timedelta(hours=-8))), 7, False),
    (None, 7, False),  # no readable time: kept
    ((NOW - 400 * DAY).replace(tzinfo=None), 7, False),  # naive: kept
], ids=["at-retention", "just-past", "just-younger", "long-past", "new", "future", "one-day", "one-day-younger",
        "other-zone-at-retention", "other-zone-younger", "no-time", "naive"])
def test_expired(created: datetime | None, days: int, is_expired: bool) -> None:
    assert expired(created, retain_days=days, now=NOW) is is_expired


# ---- snapshot_kept -----------------------------------------------------------------------------


@pytest.mark.parametrize(("ours", "name_for"), CLOUDS)
@pytest.mark.parametrize(("change", "retain_days", "kept"), [
    (lambda f: f, 7, None),  # ours and past its retention: it may go
    (lambda f: f, None, "snapshot_retained"),  # retention unset: kept forever
    (lambda f: f, 31, "snapshot_retained"),  # younger than the retention
    (lambda f: f, 30, None),  # exactly at it
    (lambda f: replace(f, created_at=None), 7, "snapshot_retained"),  # no readable age
    (lambda f: replace(f, created_at=NOW.replace(tzinfo=None) - 400 * DAY), 7, "snapshot_retained"),  # naive
    (lambda f: with_tags(f, provider_ref=OTHER), 7, "not_our_snapshot"),  # another group's, old
    (lambda f: with_tags(f, source=None), 7, "not_our_snapshot"),  # a backup that copied the ref
    (lambda f: with_tags(f, source=None), None, "not_our_snapshot"),  # not ours comes first
    (lambda f: replace(f, source_id="other"), 7, "not_our_snapshot"),
], ids=["expired", "retention-unset", "young", "at-retention", "no-time", "naive-time", "other-ref", "no-source",
        "no-source-retention-unset", "other-source"])
def test_snapshot_kept(ours: SnapshotFacts, name_for, change, retain_days: int | None, kept: str | None) -> None:
    assert snapshot_kept(change(ours), tag_key=KEY, ref=REF, retain_days=retain_days, now=NOW,
                         name_for=name_for) == kept


def test_snapshot_kept_on_gcp_needs_the_name() -> None:
    assert snapshot_kept(replace(GCP_OURS, name="my-own-backup"), tag_key=KEY, ref=REF, retain_days=7, now=NOW,
                         name_for=gcp_name_for) == "not_our_snapshot"


# ---- listable ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("ours", "name_for"), CLOUDS)
@pytest.mark.parametrize(("change", "retain_days", "listed"), [
    (lambda f: f, 7, True),
    (lambda f: f, 31, False),  # retained: never listed, never holding a cycle unsettled
    (lambda f: f, 30, True),
    (lambda f: replace(f, created_at=None), 7, False),
    (lambda f: replace(f, created_at=NOW.replace(tzinfo=None) - 400 * DAY), 7, False),
    (lambda f: with_tags(f, source=None), 7, False),
    (lambda f: with_tags(f, provider_ref=None), 7, False),
    (lambda f: replace(f, source_id=None), 7, False),
], ids=["expired", "young", "at-retention", "no-time", "naive-time", "no-source-tag", "no-ref", "no-source"])
def test_listable(ours: SnapshotFacts, name_for, change, retain_days: int, listed: bool) -> None:
    assert listable(change(ours), tag_key=KEY, retain_days=retain_days, now=NOW, name_for=name_for) is listed


def test_listable_takes_any_ref_the_snapshot_carries() -> None:
    # a listing knows no group yet: another ref's own snapshot is listed under that ref
    aws = with_tags(AWS_OURS, provider_ref=OTHER)
    gcp = replace(with_tags(GCP_OURS, provider_ref=OTHER), name=f"oc-{OTHER}-{DISK}")
    assert listable(aws, tag_key=KEY, retain_days=7, now=NOW, name_for=aws_name_for)
    assert listable(gcp, tag_key=KEY, retain_days=7, now=NOW, name_for=gcp_name_for)
    assert not listable(replace(gcp, name=f"oc-{REF}-{DISK}"), tag_key=KEY, retain_days=7, now=NOW,
                        name_for=gcp_name_for)
