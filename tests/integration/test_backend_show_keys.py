"""`backend show` lists the settings of the backend's provider only (README.md, "Configuration",
"Per-backend settings": a key whose meaning starts with "AWS:" is AWS's, "GCP" GCP's): an AWS
backend shows no GCP-only key and a GCP backend no AWS-only key, in the table and in --json.
The CLI runs as a user runs it, against the tests' real Postgres."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orphan_cleanup.core.backends import BackendSettings
from orphan_cleanup.ledger.db import Database
from tests.support.ledger_helpers import add_backend

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


def only_for() -> dict[str, set[str]]:
    """The README table's provider-only keys."""
    table = README.split("Per-backend settings", 1)[1].split("\n\n| key |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, set[str]] = {"aws": set(), "gcp": set()}
    for m in re.finditer(r"^\| `(\w+)` \| [^|]* \| (.*)\|$", table, re.M):
        key, meaning = m[1], m[2].strip()
        if meaning.startswith("AWS:") and "GCP" not in meaning:
            out["aws"].add(key)
        elif meaning.startswith("GCP") and "AWS:" not in meaning:
            out["gcp"].add(key)
    return out


def show(db: Database, backend: str, *json_: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORPHAN_CLEANUP_")}
    env.update(DATABASE_URL=db.info.url(), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", "backend", "show", backend, *json_], env=env,
                          capture_output=True, text=True, timeout=60)


def listed_keys(stdout: str) -> set[str]:
    section = stdout.split("settings:\n", 1)[1].split("\nstatus:", 1)[0]
    return {m[1] for m in re.finditer(r"^  (\w+)\s", section, re.M)}


@pytest.mark.parametrize(("provider", "account", "region", "other"), [
    ("aws", "123456789012", "us-east-1", "gcp"), ("gcp", "my-project", "us-central1", "aws")])
def test_backend_show_lists_only_the_keys_of_its_provider(db, provider, account, region, other):
    keys = only_for()
    assert keys["aws"] >= {"role_arn", "external_id"} and keys["gcp"] >= {"project", "credentials_file"}, keys
    add_backend(db, f"{provider}-one", provider=provider, account=account, regions=(region,))

    table = show(db, f"{provider}-one")
    doc = json.loads(show(db, f"{provider}-one", "--json").stdout)

    assert table.returncode == 0, table.stderr
    expected = set(BackendSettings.model_fields) - keys[other]
    assert listed_keys(table.stdout) == expected, table.stdout
    assert set(doc["effective_settings"]) == expected and set(doc["setting_sources"]) == expected
