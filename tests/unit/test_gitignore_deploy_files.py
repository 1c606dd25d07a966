"""What the commands of docs/DEPLOY.md and docs/DATABASE.md write into the checkout is ignored
by git, so a deploy from a clone leaves it clean: the files they name as written (`-out`,
`--output-template-file`, `> FILE`, `curl -o`), in the folder the docs run them from, and the
tools' own (sam's, Terraform's: state, plugins, the plan)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = "\n".join((ROOT / "docs" / name).read_text(encoding="utf-8") for name in ("DEPLOY.md", "DATABASE.md"))

# Written by the tools themselves, wherever the docs run them.
TOOLS = ["build/aws/lambda.zip", ".aws-sam/build/template.yaml", "samconfig.toml",
         "infra/aws/.terraform/providers/x", "infra/aws/terraform.tfstate", "infra/aws/terraform.tfstate.backup",
         "infra/aws/.terraform.tfstate.lock.info", "infra/aws/terraform.tfvars", "infra/gcp/.terraform/x",
         "infra/gcp/terraform.tfstate"]


def written_by_the_docs() -> list[str]:
    file = r"([\w-]+(?:\.[\w-]+)+)"
    named = {n for pattern in (r"(?<!-)-out ", r"--output-template-file ", r"> ", r"curl -\w*o ")
             for n in re.findall(pattern + file, DOCS)}
    assert {"tf.plan", "packaged.yaml", "global-bundle.pem", "server-ca.pem"} <= named, named
    # terraform runs in infra/aws and infra/gcp; the others at the root
    return [f"infra/{stack}/{n}" if n.endswith(".plan") else n for n in named for stack in ("aws", "gcp")]


def test_every_file_the_deploy_docs_write_is_ignored():
    paths = sorted(set(written_by_the_docs()) | set(TOOLS))
    done = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *paths], cwd=ROOT,
                          capture_output=True, text=True)
    not_ignored = [line.split("\t", 1)[1] for line in done.stdout.splitlines() if line.startswith("::")]
    assert not_ignored == [], done.stdout + done.stderr
