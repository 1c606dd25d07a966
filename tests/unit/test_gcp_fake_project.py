"""The fake Compute server's ``projects.get`` (routing and wire format, no sockets)."""

from __future__ import annotations

import json

from google.cloud import compute_v1

from tests.support.gcp_fake import FakeCompute
from tests.support.gcp_fake_wire import project_body, project_number


def test_project_body_is_a_valid_compute_project() -> None:
    body = project_body("my-project-42", project_number("my-project-42"))
    project = compute_v1.Project.from_json(json.dumps(body))  # strict: an unknown field would raise
    assert (project.kind, project.name) == ("compute#project", "my-project-42")
    assert str(project.id) == body["id"] and len(body["id"]) == 12
    assert project.self_link == "https://www.googleapis.com/compute/v1/projects/my-project-42"


def test_known_project_is_found_by_id_and_by_number() -> None:
    fake = FakeCompute("p-one")
    number = fake.number_of("p-one")
    assert fake.handle("GET", "/compute/v1/projects/p-one", {}) == (200, project_body("p-one", number))
    assert fake.handle("GET", f"/compute/v1/projects/{number}", {})[1]["name"] == "p-one"


def test_projects_of_added_resources_are_known() -> None:
    fake = FakeCompute("p-one")
    fake.add_disk("d", project="p-two")
    assert fake.handle("GET", "/compute/v1/projects/p-two", {})[0] == 200


def test_unknown_project_is_404_and_denied_project_403_in_google_format() -> None:
    fake = FakeCompute("p-one")
    fake.deny_project("p-one")
    status, body = fake.handle("GET", "/compute/v1/projects/nope", {})
    assert status == 404
    assert body["error"]["code"] == 404 and body["error"]["errors"][0]["reason"] == "notFound"
    assert body["error"]["message"] == "The resource 'projects/nope' was not found"
    status, body = fake.handle("GET", "/compute/v1/projects/p-one", {})
    assert (status, body["error"]["errors"][0]["reason"]) == (403, "forbidden")


def test_reset_forgets_added_and_denied_projects() -> None:
    fake = FakeCompute("p-one")
    fake.add_project("p-two")
    fake.deny_project("p-one")
    fake.reset()
    assert fake.handle("GET", "/compute/v1/projects/p-two", {})[0] == 404
    assert fake.handle("GET", "/compute/v1/projects/p-one", {})[0] == 200
