"""The one way a classification context is made (``policy.classify_context``): what the
classifier and the deleter's re-check judge a backend's groups with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.classify import Limits
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.policy import classify_context
from orphan_cleanup.core.settings import Settings

LISTED_AT = datetime(2030, 1, 1, tzinfo=UTC)
LIMITS = Limits(interval_seconds=900, margin_seconds=600, max_backoff_seconds=3600, cycle_deadline_seconds=900,
                max_deletes=50, max_delete_share=0.5)
BACKEND = Backend(id="aws-prod", provider="aws", account="123456789012", regions=("us-east-1",),
                  settings=BackendSettings(tag_key="platform_ref", protect_tag_key="keep",
                                           protect_tag_keys=("team-keep", "legal-hold")))


def test_a_context_says_the_backend_its_keys_the_margin_and_the_stuck_threshold():
    ctx = classify_context(Settings.explicit(stuck_pending_seconds=7200), BACKEND, LISTED_AT, LIMITS)

    assert (ctx.backend_id, ctx.scope, ctx.listed_at) == ("aws-prod", "aws:123456789012", LISTED_AT)
    assert (ctx.tag_key, ctx.protect_key) == ("platform_ref", "keep")
    # the backend's own key only once, and the stack's own (SAFETY.md rule 16: no row takes it away)
    assert ctx.more_protect_keys == {"team-keep", "legal-hold", "orphan-cleanup-protect"}
    assert ctx.protect_keys == {"keep", "team-keep", "legal-hold", "orphan-cleanup-protect"}
    assert (ctx.margin, ctx.stuck_after) == (timedelta(seconds=600), timedelta(hours=2))
    # nothing listed known, remembered protections trusted: unless the caller says so
    assert (ctx.listed, ctx.recheck_protections) == (None, False)


def test_the_listing_and_the_protections_recheck_are_the_callers():
    listed = ListedInstances(known=[("abcdefgh1234", "us-east-1", "i-1")])

    ctx = classify_context(Settings.explicit(), BACKEND, LISTED_AT, LIMITS, listed=listed, recheck_protections=True)

    assert ctx.listed is listed and ctx.recheck_protections
