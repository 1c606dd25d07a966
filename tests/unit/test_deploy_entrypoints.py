"""The entry points the IaC names exist in functions/ (checked by AST, so no
SDK is imported): SAM Handler, Terraform handler and entry_point."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from infra import checks


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture()
def fake_repo(tmp_path: Path) -> Path:
    _write(tmp_path, "functions/aws/lister.py", "def handler(event, context):\n    return {}\n")
    _write(tmp_path, "functions/aws/classifier.py", "handler = lambda event, context: {}\n")
    _write(tmp_path, "functions/aws/deleter.py", "def other():\n    pass\n")
    _write(tmp_path, "functions/gcp/main.py",
           "import functions_framework\n\n@functions_framework.http\ndef lister(request):\n    pass\n\n"
           "def classifier(cloud_event):\n    pass\n")
    return tmp_path


def test_checker_passes_present_handlers_and_fails_missing_ones(fake_repo):
    assert checks.lambda_handler_problems(fake_repo, ["functions.aws.lister.handler",
                                                      "functions.aws.classifier.handler"]) == []
    assert checks.lambda_handler_problems(fake_repo, ["functions.aws.deleter.handler"]) == [
        "functions.aws.deleter.handler: no top-level handler in functions/aws/deleter.py"]
    assert checks.lambda_handler_problems(fake_repo, ["functions.aws.nope.handler"]) == [
        "functions.aws.nope.handler: functions/aws/nope.py does not exist"]


def test_checker_for_gcp_entry_points(fake_repo, tmp_path_factory):
    assert checks.gcp_entry_point_problems(fake_repo, ["lister", "classifier"]) == []
    assert checks.gcp_entry_point_problems(fake_repo, checks.GCP_ENTRY_POINTS) == [
        "no top-level deleter in functions/gcp/main.py"]
    empty = tmp_path_factory.mktemp("empty")
    assert checks.gcp_entry_point_problems(empty, ["lister"]) == ["functions/gcp/main.py does not exist"]


def test_a_wrong_handler_path_in_the_template_is_caught(fake_repo):
    sam = checks.load_template(checks.TEMPLATE)
    broken = copy.deepcopy(sam)
    broken["Resources"]["ListerFunction"]["Properties"]["Handler"] = "functions.aws.listr.handler"
    assert checks.lambda_handler_problems(fake_repo, checks.sam_handlers(broken)) == [
        "functions.aws.listr.handler: functions/aws/listr.py does not exist",
        "functions.aws.deleter.handler: no top-level handler in functions/aws/deleter.py",
    ]


def test_iac_names_the_designed_entry_points():
    sam = checks.load_template(checks.TEMPLATE)
    assert sorted(checks.sam_handlers(sam)) == sorted(checks.AWS_HANDLERS.values())
    aws = checks.Module.load(checks.REPO / "infra" / "aws")
    gcp = checks.Module.load(checks.REPO / "infra" / "gcp")
    assert sorted(checks.terraform_literals(aws, "handler")) == sorted(checks.AWS_HANDLERS.values())
    assert sorted(checks.terraform_literals(gcp, "entry_point")) == sorted(checks.GCP_ENTRY_POINTS)


def test_the_repository_has_every_entry_point_the_iac_names():
    assert checks.lambda_handler_problems(checks.REPO, checks.AWS_HANDLERS.values()) == []
    assert checks.gcp_entry_point_problems(checks.REPO, checks.GCP_ENTRY_POINTS) == []
