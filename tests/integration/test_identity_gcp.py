"""The GCP adapter's identity check (SAFETY.md rule 11): the real google-cloud-compute
client reads the project (``projects.get``) from the fake Compute server."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.backends import Backend, BackendSettings
from orphan_cleanup.core.errors import AccessDenied, IdentityMismatch, ProviderError, ProviderTimeout, ResourceNotFound
from orphan_cleanup.providers.gcp.provider import GcpProvider, build_gcp_provider
from tests.support.gcp_fake import FakeCompute


def provider(gcp: FakeCompute, account: str | None = None, *, timeout: float = 5.0, **settings: str) -> GcpProvider:
    backend = Backend(id="gcp-id", provider="gcp", account=account or gcp.project, regions=("us-central1",),
                      settings=BackendSettings(**settings))
    return build_gcp_provider(backend, endpoint=gcp.url, timeout=timeout)


def project_reads(gcp: FakeCompute, project: str) -> int:
    return sum(1 for c in gcp.calls if c.method == "GET" and c.path == f"/compute/v1/projects/{project}")


def test_matching_project_passes(gcp: FakeCompute) -> None:
    p = provider(gcp)

    p.verify_identity()

    assert p.reached_account() == gcp.project
    assert project_reads(gcp, gcp.project) == 2
    assert [c.path for c in gcp.calls] == [f"/compute/v1/projects/{gcp.project}"] * 2  # nothing listed


def test_settings_project_overrides_the_account(gcp: FakeCompute) -> None:
    p = provider(gcp, "some-other-project", project=gcp.project)

    p.verify_identity()

    assert project_reads(gcp, gcp.project) == 1 and project_reads(gcp, "some-other-project") == 0


def test_unknown_project_is_a_failure_not_a_mismatch(gcp: FakeCompute) -> None:
    p = provider(gcp, "no-such-project")

    with pytest.raises(ProviderError) as err:
        p.verify_identity()

    assert type(err.value) is ProviderError  # neither IdentityMismatch nor ResourceNotFound ("done")
    assert not isinstance(err.value, (IdentityMismatch, ResourceNotFound))
    message = str(err.value)
    assert "\n" not in message and message.startswith("projects.get no-such-project: project not found")
    assert project_reads(gcp, "no-such-project") == 1


def test_forbidden_project_is_access_denied(gcp: FakeCompute) -> None:
    # Given: credentials that may list the project but not read it
    gcp.deny_project(gcp.project)
    p = provider(gcp)

    with pytest.raises(AccessDenied) as err:
        p.verify_identity()

    assert not isinstance(err.value, IdentityMismatch)
    assert "\n" not in str(err.value) and "compute.projects.get" in str(err.value)


def test_project_answering_under_another_name_is_a_mismatch(gcp: FakeCompute) -> None:
    # Given: the backend names the project by its number; the API answers with the project id
    number = gcp.number_of(gcp.project)
    p = provider(gcp, project=number)

    with pytest.raises(IdentityMismatch) as err:
        p.verify_identity()

    assert str(err.value) == f"account_mismatch: credentials reach {gcp.project}, backend gcp-id says {number}"


def test_a_success_is_cached_and_a_failure_asked_again(gcp: FakeCompute) -> None:
    # Given: the first read fails
    gcp.add_fault("GET", f"/compute/v1/projects/{gcp.project}", status=503, times=1)
    p = provider(gcp)

    # When / then: it is asked again, and once it passed, not any more
    with pytest.raises(ProviderError):
        p.verify_identity()
    p.verify_identity()
    p.verify_identity()
    assert project_reads(gcp, gcp.project) == 2


def test_project_read_keeps_the_timeout(gcp: FakeCompute) -> None:
    gcp.add_fault("GET", f"/compute/v1/projects/{gcp.project}", status=None, delay=1.0)

    with pytest.raises(ProviderTimeout):
        provider(gcp, timeout=0.3).verify_identity()
