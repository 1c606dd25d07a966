"""The deployed functions' warm pipeline is keyed on the whole ``Settings``: an
unchanged environment reuses it, and a change to any one setting builds a new
one that carries the new value."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap, common
from orphan_cleanup.queues.memory import InProcessQueue

BASE = {
    "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nowhere",
    "LISTING_QUEUE_URL": "http://127.0.0.1:9/123456789012/listing",
    "DELETE_QUEUE_URL": "http://127.0.0.1:9/123456789012/delete",
    "LISTING_TOPIC": "projects/p/topics/listing",
    "DELETE_TOPIC": "projects/p/topics/delete",
    "JOBS_QUEUE_URL": "http://sqs/q/jobs",
    "JOBS_TOPIC": "projects/p/topics/jobs",
}
# One changed value per setting (by environment variable): a new setting must be added here.
CHANGED = {
    "DATABASE_URL": "postgresql://somebody@127.0.0.1:9/elsewhere",
    "DATABASE_URL_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:ledger",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "ORPHAN_CLEANUP_MODE": "delete",
    "ORPHAN_CLEANUP_MARGIN_SECONDS": "7",
    "ORPHAN_CLEANUP_INTERVAL_SECONDS": "60",
    "ORPHAN_CLEANUP_MAX_DELETES": "3",
    "ORPHAN_CLEANUP_MAX_DELETE_SHARE": "0.25",
    "ORPHAN_CLEANUP_CONFIRM_SECONDS": "60",
    "ORPHAN_CLEANUP_GCP_ENDPOINT": "http://127.0.0.1:9",
    "SENTRY_DSN": "http://public@127.0.0.1:9/1",
    "ORPHAN_CLEANUP_DATA_DIR": "/nonexistent/orphan-cleanup",
    "LISTING_QUEUE_URL": "http://127.0.0.1:9/123456789012/listing-2",
    "DELETE_QUEUE_URL": "http://127.0.0.1:9/123456789012/delete-2",
    "LISTING_TOPIC": "projects/p/topics/listing-2",
    "DELETE_TOPIC": "projects/p/topics/delete-2",
    "JOBS_QUEUE_URL": "http://sqs/q/jobs-2",
    "JOBS_TOPIC": "projects/p/topics/jobs-2",
    "ORPHAN_CLEANUP_CONNECT_TIMEOUT": "1.5",
    "ORPHAN_CLEANUP_READ_TIMEOUT": "2.5",
    "ORPHAN_CLEANUP_CYCLE_DEADLINE_SECONDS": "600",
    "ORPHAN_CLEANUP_LEASE_SECONDS": "30",
    "ORPHAN_CLEANUP_STUCK_PENDING_SECONDS": "60",
    "ORPHAN_CLEANUP_MAX_BACKOFF_SECONDS": "120",
    "ORPHAN_CLEANUP_REGION_SHRINK_SHARE": "0.5",
    "ORPHAN_CLEANUP_REGION_SHRINK_MIN_GROUPS": "5",
    "ORPHAN_CLEANUP_DESCRIBE_RATE": "2.5",
    "ORPHAN_CLEANUP_DESCRIBE_BURST": "10",
    "ORPHAN_CLEANUP_MUTATE_RATE": "0.5",
    "ORPHAN_CLEANUP_MUTATE_BURST": "5",
    "ORPHAN_CLEANUP_TERMINATE_RATE": "0.5",
    "ORPHAN_CLEANUP_TERMINATE_BURST": "10",
    "DATABASE_USER": "someone-else",
    "DATABASE_IAM_AUTH": "true",
    "CLOUD_SQL_INSTANCE": "my-project:us-central1:ledger",
    "CLOUD_SQL_IAM_AUTH": "true",
    "CLOUD_SQL_IP_TYPE": "private",
    "NOTIFY_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:digests",
    "NOTIFY_TOPIC": "projects/p/topics/digests",
    "SLACK_WEBHOOK_URL": "http://127.0.0.1:9/hook",
    "SLACK_WEBHOOK_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:slack",
    "ORPHAN_CLEANUP_NOTIFY_TIMEOUT": "3",
    "ORPHAN_CLEANUP_MAX_MODE": "delete",
    "ORPHAN_CLEANUP_PROTECT_TAG_KEY": "stack-keep",
}
# A setting that means something only beside another: both pipelines get that one.
NEEDS = {"CLOUD_SQL_IAM_AUTH": {"CLOUD_SQL_INSTANCE": "my-project:us-central1:ledger"}}
FIELD_OF = {f.alias: name for name, f in Settings.model_fields.items()}


def in_process_queues(_settings: Settings) -> tuple[InProcessQueue, InProcessQueue, InProcessQueue]:
    return InProcessQueue(), InProcessQueue(), InProcessQueue()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch):
    for key in FIELD_OF:
        monkeypatch.delenv(key, raising=False)
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    yield monkeypatch
    _forget_sentry()


def _forget_sentry() -> None:
    # A SENTRY_DSN case initialises the SDK for the process: undo it for later tests.
    try:
        import sentry_sdk
    except ImportError:
        return
    sentry_sdk.get_client().close(timeout=0)
    sentry_sdk.get_global_scope().set_client(None)


def test_every_setting_has_a_changed_value_here():
    assert set(CHANGED) == set(FIELD_OF)


def test_an_unchanged_environment_reuses_the_warm_pipeline(env):
    first = common.pipeline(in_process_queues)

    assert common.pipeline(in_process_queues) is first
    assert first.settings == bootstrap.load_settings()


@pytest.mark.parametrize("variable", sorted(CHANGED))
def test_changing_any_setting_builds_a_new_pipeline_with_it(env, variable):
    for needed, value in NEEDS.get(variable, {}).items():
        env.setenv(needed, value)
    first = common.pipeline(in_process_queues)

    env.setenv(variable, CHANGED[variable])
    changed = common.pipeline(in_process_queues)

    assert changed is not first
    field = FIELD_OF[variable]
    assert getattr(changed.settings, field) != getattr(first.settings, field)
    assert changed.settings == bootstrap.load_settings()
    assert common.pipeline(in_process_queues) is changed


def test_settings_are_hashable_and_equal_by_value(env):
    assert bootstrap.load_settings() == bootstrap.load_settings()
    assert hash(bootstrap.load_settings()) == hash(bootstrap.load_settings())


def test_explicit_settings_ignore_the_environment(env):
    env.setenv("ORPHAN_CLEANUP_MARGIN_SECONDS", "not a number")
    env.setenv("ORPHAN_CLEANUP_MODE", "delete")

    settings = Settings.explicit(aws_endpoint_url="http://127.0.0.1:9")

    assert settings.margin_seconds == 300 and settings.mode == "report" and settings.database_url is None
    assert settings.aws_endpoint_url == "http://127.0.0.1:9"
    with pytest.raises(TypeError):
        Settings.explicit(no_such_setting=1)
