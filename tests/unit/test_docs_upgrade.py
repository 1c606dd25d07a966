"""docs/DEPLOY.md's "Upgrade" and docs/DATABASE.md's "Upgrades: `migrate` grants the roles"
say what `migrate` does: the flags they name are `migrate --help`'s, every role flag is
named, the command they give when migrate cannot grant is the one migrate's refusal names,
and no upgrade step asks for roles.sql after `migrate` any more."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from orphan_cleanup.ledger.grants import ROLES_SQL_COMMAND, RoleNames, refusal

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = (ROOT / "docs" / "DEPLOY.md").read_text(encoding="utf-8")
DATABASE = (ROOT / "docs" / "DATABASE.md").read_text(encoding="utf-8")


def _flags(text: str) -> set[str]:
    return set(re.findall(r"--[a-z]+(?:-[a-z]+)*", text))


def test_the_upgrade_docs_say_what_migrate_does():
    help_text = subprocess.run([sys.executable, "-m", "orphan_cleanup", "migrate", "--help"], capture_output=True,
                               text=True, check=True).stdout
    role_flags = {f"--{name}-role" for name in RoleNames.__dataclass_fields__}
    assert role_flags | {"--skip-grants"} <= _flags(help_text)

    upgrades = DATABASE.split("### Upgrades: `migrate` grants the roles", 1)[1].split("\n### ", 1)[0]
    assert role_flags | {"--skip-grants"} == _flags(upgrades) - {"--help"}
    assert ROLES_SQL_COMMAND in upgrades.replace("\n", " ")

    upgrade = " ".join(DEPLOY.split("- **Upgrade.**", 1)[1].split("\n- **", 1)[0].split())
    assert "orphan-cleanup migrate" in upgrade and ROLES_SQL_COMMAND in upgrade
    assert _flags(upgrade) <= _flags(help_text)
    assert "runs again after" not in upgrade

    # the refusal's one line names the same flags and command
    line = str(refusal(1, "why"))
    assert "\n" not in line and ROLES_SQL_COMMAND in line
    assert role_flags | {"--skip-grants"} <= _flags(line)
