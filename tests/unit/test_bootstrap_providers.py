"""The composition root keeps one provider adapter per backend configuration."""

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap


def aws_backend(regions=("us-east-1",), **settings) -> Backend:
    return Backend(id="aws-prod", provider="aws", account="123456789012", regions=regions,
                   settings=BackendSettings(**settings))


def test_the_same_backend_reuses_its_adapter_and_a_changed_row_gets_a_new_one():
    build = bootstrap.provider_factory(Settings())

    first = build(aws_backend())
    again = build(aws_backend())
    other_regions = build(aws_backend(("us-east-1", "eu-west-1")))
    other_settings = build(aws_backend(max_concurrency=2))

    assert again is first
    assert other_regions is not first and other_regions.backend.regions == ("us-east-1", "eu-west-1")
    assert other_settings is not first and other_settings is not other_regions


def test_the_cache_is_bounded():
    build = bootstrap.provider_factory(Settings(), max_cached=2)

    first = build(aws_backend())
    build(aws_backend(max_concurrency=2))
    build(aws_backend(max_concurrency=3))

    assert build(aws_backend()) is not first
