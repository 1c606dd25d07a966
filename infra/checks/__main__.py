"""``python -m infra.checks [--write-transformed PATH]`` (see the package docstring)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from infra.checks import all_problems, load_template, sam_transform


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write-transformed":
        # The SAM-transformed template (sample parameters), e.g. for checkov.
        out = Path(argv[1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(sam_transform(load_template()), indent=1))
        print(out)
        return 0
    found = all_problems()
    for problem in found:
        print(problem)
    print(f"{len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
