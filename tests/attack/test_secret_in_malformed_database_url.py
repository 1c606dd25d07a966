"""SAFETY.md rule 22 (no secret leaves its box), attacked with malformed database URLs: an
unencoded '/' or '?' in a password ends the address early, and what follows would be shown as
the database or a parameter; a URL the settings refuse would be quoted by pydantic's error in
a GCP function's traceback. Each test failed, printing the canary, before the fix."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

CANARY = "pwCanary8x2k"


def cli(tmp_path: Path, url: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "DATABASE_URL": url, "NO_COLOR": "1", "ORPHAN_CLEANUP_DATA_DIR": str(tmp_path / "data")}
    for name in ("SENTRY_DSN", "SLACK_WEBHOOK_URL", "ORPHAN_CLEANUP_MODE"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


# A password whose text before its first '/' is empty or a number: urlsplit reads that as the
# (empty / numeric) port, the user as the host, and the rest of the password as the database
# path. The error line then names the database: "at cleanup:5432/<password>@host/db".
@pytest.mark.parametrize("password", [f"/{CANARY}", f"5432/{CANARY}"])
@pytest.mark.parametrize("command", ["status", "migrate"])
def test_an_unencoded_password_with_a_slash_is_printed_as_the_database(tmp_path, password, command):
    url = f"postgresql://cleanup:{password}@127.0.0.1:1/ledger"
    code, output = cli(tmp_path, url, command)
    assert code == 2, output
    assert CANARY not in output, output  # e.g. "cannot connect to the database at cleanup:5432/pwCanary8x2k@..."


# A password with '?' after an empty or numeric "port": the password's tail is read as the
# URL's query, and the parameter error quotes it (the sslmode value, or a parameter name).
@pytest.mark.parametrize("password", [f"?sslmode={CANARY}", f"12?{CANARY}=1"])
def test_an_unencoded_password_with_a_question_mark_is_quoted_as_a_parameter(tmp_path, password):
    url = f"postgresql://cleanup:{password}@127.0.0.1:1/ledger"
    code, output = cli(tmp_path, url, "status")
    assert code == 2, output
    assert CANARY not in output, output  # "DATABASE_URL sslmode 'pwCanary8x2k@127.0.0.1:1/ledger' ..."


def test_a_gcp_function_logs_a_malformed_database_url_through_pydantics_input_value(monkeypatch):
    """A DATABASE_URL that Settings refuses (here a typo: one slash after the scheme) makes
    ``load_settings`` raise ``ConfigError(...) from ValidationError``; the Cloud Function's
    uncaught error is logged by Flask with its whole chain, and pydantic's text quotes the
    value (``input_value='postgresql:/app:pwCanary8x2k@db/app'``; a value over ~50 characters
    is shortened to its first and last ~24, which still shows a fragment)."""
    from functions_framework import create_app

    from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
    from orphan_cleanup.core.messages import DeleteRequest
    from tests.e2e.test_gcp_functions_e2e import SOURCE
    from tests.support.pubsub_harness import pubsub_cloudevent

    monkeypatch.setenv("DATABASE_URL", f"postgresql:/app:{CANARY}@db/app")
    for name in ("SENTRY_DSN", "SLACK_WEBHOOK_URL", "ORPHAN_CLEANUP_MODE"):
        monkeypatch.delenv(name, raising=False)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        deleter = create_app(target="deleter", source=SOURCE, signature_type="cloudevent").test_client()
        group = ResourceGroup(provider_ref="abcdefgh1234", region="us-central1-a", primary_id="vm-1", resources=(
            Resource(kind=ResourceKind.INSTANCE, id="vm-1", region="us-central1-a", tags={}),))
        message = DeleteRequest(cycle_id="c1", backend="gcp-main", group=group).model_dump_json().encode()
        response = deleter.post("/", **pubsub_cloudevent(message, subscription="s"))
    finally:
        root.removeHandler(handler)
    logged = buffer.getvalue()
    assert response.status_code == 500
    assert "bad setting DATABASE_URL" in logged, logged  # the function's error line was searched
    assert CANARY not in logged, logged
