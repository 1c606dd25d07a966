"""The docs and the help say what the code does, so that they cannot drift apart again:
`backend add --help`'s settings keys and the README's settings table against the model's
fields, the README's reason table (reason and verdict) against what `classify` gives, and
the exit codes of the README, the top-level help and `run --help` against `cli/exits.py`."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from orphan_cleanup.cli import exits
from orphan_cleanup.core import classify as classify_module
from orphan_cleanup.core.backends import BackendSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def help_of(*command: str) -> str:
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *command, "--help"], capture_output=True,
                          text=True, check=True).stdout


def verdicts_in_classify() -> dict[str, str]:
    """reason -> verdict, as ``classify.py`` gives them: ``_v(VerdictKind.X, "reason")``, and
    ``_orphan_unless_recent(..., "reason")`` (an orphan once STEP 5 lets it be one)."""
    tree = ast.parse(Path(classify_module.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "_v" and isinstance(node.args[0], ast.Attribute):
            verdict = node.args[0].attr.lower()
            reasons = node.args[1]
        elif node.func.id == "_orphan_unless_recent":
            verdict, reasons = "orphan", node.args[3]
        else:
            continue
        for value in ast.walk(reasons):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                assert found.setdefault(value.value, verdict) == verdict, value.value
    return found


def section(text: str, heading: str) -> str:
    """The lines of ``text`` from ``heading`` to the next blank line."""
    return text.split(heading, 1)[1].split("\n\n", 1)[0]


def test_the_docs_and_the_help_say_what_the_code_does():
    keys = list(BackendSettings.model_fields)

    # backend add --help names every settings key, in the model's order, and nothing else
    listed = " ".join(section(help_of("backend", "add"), "settings keys:").split("(any other key")[0].split())
    assert [k.strip() for k in listed.split(",")] == keys
    # and so does the README's per-backend settings table
    table = section(README, "Per-backend settings")
    assert re.findall(r"^\| `([a-z_]+)` \|", README.split("Per-backend settings", 1)[1].split("\n### ", 1)[0],
                      re.M) == keys, table

    # the README's reason table gives each reason the verdict the classifier gives it
    readme_reasons = dict(re.findall(r"^\| `([a-z_]+)` \| (tracked|orphan|skipped|ignored|protected) \|", README,
                                     re.M))
    assert readme_reasons == verdicts_in_classify()

    # the exit codes: exits.py, the README's table, the top-level help, run --help
    codes = {v for k, v in vars(exits).items() if k.startswith("EXIT_")}
    readme_codes = {int(c) for c in re.findall(r"^\| (\d+) \| ", README.split("Exit codes:", 1)[1], re.M)}
    top = {int(c) for c in re.findall(r"^  (\d+) ", section(help_of(), "exit codes:"), re.M)}
    run = {int(c) for c in re.findall(r"(?:^|, )(\d+) ", " ".join(section(help_of("run"), "exit codes:").split()))}
    assert readme_codes == top == run == codes == {0, 1, 2, 3, 130}


def _constants(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_status_keys_and_the_event_kinds_of_the_readme_are_the_codes():
    # `status --json`: the README's keys are DESIGN.md C3's and the extra ones the code adds,
    # exactly the keys `commands.status_rows` builds
    design = (ROOT / ".." / "shared" / "DESIGN.md").resolve()
    paragraph = README.split("`status --json` prints a list", 1)[1].split("\n\n", 1)[0]
    readme_keys = set(re.findall(r"`?\"([a-z_]+)\"", paragraph))
    tree = ast.parse((ROOT / "shared/orphan_cleanup/cli/commands.py").read_text(encoding="utf-8"))
    [status_rows] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "status_rows"]
    [row] = [n for n in ast.walk(status_rows) if isinstance(n, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "backend" for k in n.keys)]
    code_keys = {k.value for k in row.keys if isinstance(k, ast.Constant)}
    assert readme_keys - {"cycle_id", "started_at", "lease_expires_at", "provider_ref", "owner_id", "owner_name",
                          "created_at", "pending_seconds", "region", "primary_id"} == code_keys
    if design.exists():  # the design contract, beside the repository in the workspace
        c3 = design.read_text(encoding="utf-8").split("`status --json` prints a JSON list", 1)[1].split("`;", 1)[0]
        assert set(re.findall(r"\"([a-z_]+)\"", c3)) <= code_keys
    # the events table's kinds include every kind a statement of the code writes by name
    written = {m for path in (ROOT / "shared/orphan_cleanup").rglob("*.py") for text in _constants(path)
               if "INSERT INTO events" in text
               for m in re.findall(r"(?:VALUES \(|SELECT )[^']*?'([a-z_]+)'",
                                   text.split("INSERT INTO events", 1)[1])[:1]}
    kinds = set(re.findall(r"^\| `([a-z_]+)` \| ", README.split("| kind | written when |", 1)[1].split("\n\n", 1)[0],
                           re.M))
    assert "cycle_failed" in written and written <= kinds, written - kinds
