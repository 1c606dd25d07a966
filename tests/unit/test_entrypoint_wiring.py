"""A warm function reuses its pipeline (database, queue clients, provider
adapters) across invocations; a changed environment builds a new one."""

from __future__ import annotations

import pytest

from orphan_cleanup.entrypoints import aws, gcp


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key, value in {
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nowhere",
        "LISTING_QUEUE_URL": "http://127.0.0.1:9/123456789012/listing",
        "DELETE_QUEUE_URL": "http://127.0.0.1:9/123456789012/delete",
        "LISTING_TOPIC": "projects/p/topics/listing", "DELETE_TOPIC": "projects/p/topics/delete",
        "PUBSUB_EMULATOR_HOST": "127.0.0.1:9",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SENTRY_DSN", raising=False)
    return monkeypatch


@pytest.mark.parametrize("entry", [aws, gcp], ids=["aws", "gcp"])
def test_invocations_share_one_pipeline_until_the_environment_changes(env, entry):
    first = entry.pipeline()

    assert entry.pipeline() is first
    env.setenv("ORPHAN_CLEANUP_MARGIN_SECONDS", "7")
    changed = entry.pipeline()
    assert changed is not first and changed.settings.margin_seconds == 7
