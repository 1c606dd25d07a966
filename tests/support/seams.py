"""Helpers of the seams tests (``tests/e2e/test_seams_*.py``, ``tests/integration/test_seams_ledger.py``):
the CLI as a user runs it, and what a cycle recorded, read back with SQL.

Nothing here stands in for our own code: the CLI is a subprocess, every read goes to the
real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from orphan_cleanup.ledger.db import Database

GONE = ("shutting-down", "terminated")


def cli_env(db: Database, **env: str) -> dict[str, str]:
    """The environment of ``python -m orphan_cleanup``: this database, margin 0 (moto and the
    fake Compute server stamp creation times now; owners are backdated), no global mode."""
    environ = {**os.environ, "DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_MARGIN_SECONDS": "0", "NO_COLOR": "1"}
    environ.pop("ORPHAN_CLEANUP_MODE", None)
    environ.update(env)
    return environ


def cli(db: Database, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m orphan_cleanup ARGS`` to completion."""
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=cli_env(db, **env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def start_cli(db: Database, *args: str, **env: str) -> subprocess.Popen[str]:
    """``python -m orphan_cleanup ARGS`` in the background."""
    return subprocess.Popen([sys.executable, "-m", "orphan_cleanup", *args], env=cli_env(db, **env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_json(db: Database, backend: str, *extra: str, **env: str) -> tuple[int, dict[str, Any], str]:
    """``run --backend B --json EXTRA``: (exit code, the C3 document, stderr)."""
    proc = cli(db, "run", "--backend", backend, "--json", *extra, **env)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == backend
    return proc.returncode, doc, proc.stderr


def verdicts(doc: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """primary id (the ref for a primary-less group) -> (verdict, reason, action)."""
    return {g["primary_id"] or g["provider_ref"]: (g["verdict"], g["reason"], g["action"]) for g in doc["groups"]}


def query(db: Database, sql: str, **params: Any) -> list[list[Any]]:
    with db.connection() as conn:
        return conn.run(sql, **params)


def delete_results(db: Database, cycle_id: str) -> list[dict[str, Any]]:
    """Each delete request of a cycle as recorded: its ``state`` and ``result`` document
    (``{"result": DeleteResult | None, "error", "skipped"}``)."""
    rows = query(db, "SELECT group_key, state, result::text FROM delete_requests WHERE cycle_id = :c", c=cycle_id)
    return [{"group_key": k, "state": s, **(json.loads(r) if r else {})} for k, s, r in rows]


def skip_reasons(recorded: dict[str, Any]) -> dict[str, str]:
    """resource id -> the reason the deleter left it (``result.skipped``); ``*`` -> the
    request's own skip reason, when it has one."""
    result = recorded.get("result") or {}
    reasons = {s["id"]: s["reason"] for s in result.get("skipped") or []}
    if recorded.get("skipped"):
        reasons["*"] = recorded["skipped"]
    return reasons
