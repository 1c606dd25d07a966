"""The README's `LedgerClient` example (README.md, "The protocol") runs as written, as a
platform author pastes it: in a fresh directory, with no DATABASE_URL (the quick start's
embedded Postgres) and with one, on moto. Whatever it wrote is what the CLI then sees
(`orphan-cleanup psql`, from the same directory), so the client and the CLI share one
ledger."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orphan_cleanup.ledger.db import Database

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")

pytestmark = pytest.mark.usefixtures("moto_reset")


def snippet(after_text: str = "With the Python client") -> str:
    after = README.split(after_text, 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S)[1]


VOLUME_SNIPPET = "A volume owner (`owner_type` `volume`)"


def environment(**extra: str) -> dict[str, str]:
    # moto_server set AWS_ENDPOINT_URL and fake credentials in this process's environment
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("ORPHAN_CLEANUP_")}
    env.update(NO_COLOR="1", **extra)
    return env


def run_snippet(cwd: Path, env: dict[str, str], code: str | None = None) -> subprocess.CompletedProcess[str]:
    (cwd / "provision.py").write_text(code or snippet())
    return subprocess.run([sys.executable, "provision.py"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=240)


def test_the_readme_example_runs_as_written_on_the_clis_embedded_postgres(tmp_path):
    env = environment()
    proc = run_snippet(tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    seen = subprocess.run([sys.executable, "-m", "orphan_cleanup", "psql", "--", "-Atc",
                           "SELECT i.status, i.backend_id, i.primary_id LIKE 'i-%', r.owner_name FROM instances i"
                           " JOIN provider_refs r USING (provider_ref) WHERE i.id = 'inst-42'"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == "terminated|aws-prod|t|train-7", seen.stdout + seen.stderr
    assert (tmp_path / ".orphan-cleanup").is_dir()  # the CLI's data dir, in the directory it ran from


def test_the_readme_example_runs_as_written_with_database_url(db: Database, tmp_path):
    proc = run_snippet(tmp_path, environment(DATABASE_URL=db.info.url()))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    with db.connection() as conn:
        assert conn.run("SELECT status FROM instances WHERE id = 'inst-42'") == [["terminated"]]
    assert not (tmp_path / ".orphan-cleanup").exists()


def test_the_readme_volume_example_runs_as_written_with_database_url(db: Database, tmp_path):
    # the volume owner's protocol (README, "The protocol"): a volumes row, a real create_volume on moto
    proc = run_snippet(tmp_path, environment(DATABASE_URL=db.info.url()), snippet(VOLUME_SNIPPET))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    with db.connection() as conn:
        assert conn.run("SELECT v.status, v.deleted_at IS NOT NULL, v.backend_id, v.primary_id LIKE 'vol-%',"
                        " r.owner_type, r.owner_name FROM volumes v JOIN provider_refs r USING (provider_ref)"
                        " WHERE v.id = 'data-7'") == [["deleted", True, "aws-prod", True, "volume", "dataset-7"]]
