"""The lock files: one resolution, read by plain pip everywhere.

    python -m infra.lock              # after editing dependencies in pyproject.toml
    python -m infra.lock --upgrade    # move every pin to the newest version allowed

Writes, with uv (a dev dependency, so the resolver is pinned too):

  requirements/dev.txt     THE lock: core, every extra, the dev tools, the build
                           backend ([build-system] requires) and pip, for CPython
                           3.11 on every platform (``uv pip compile --universal``),
                           with the hashes of every wheel and sdist. CI and the
                           README install it with ``pip install --require-hashes``.
  requirements/lambda.txt  core + aws, sentry: what the Lambda zip ships. Resolved
                           under the pins of dev.txt (``-c``) for manylinux2014
                           aarch64 CPython 3.11 wheels only, so it has no markers
                           (pip evaluates markers for the host, not for
                           ``--platform``) and fails here, not at build time, when
                           a pin has no arm64 wheel.
  requirements/gcp.txt     core + gcp, sentry: the Cloud Functions
                           requirements.txt, under the pins of dev.txt, universal
                           (Cloud Build's pip evaluates the markers itself).
  requirements/install-{aws,gcp,all}.txt
                           a user's install of the CLI with the [aws], [gcp] or
                           [all] extra (README, "Install"): core + that extra, the
                           build backend and pip, under the pins of dev.txt,
                           universal, hashed: the tested pins, without the
                           contributors' tools.

Existing pins are kept where pyproject.toml still allows them (uv reads the
output file as preferences). Each file's first line records a digest of what it
was generated from (pyproject's dependency tables and the uv arguments);
tests/unit/test_lock.py fails when pyproject.toml changed and this was not run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from infra.package import DEV_LOCK, GCP_EXTRAS, GCP_LOCK, LAMBDA_EXTRAS, LAMBDA_LOCK, LAMBDA_PYTHON, REPO

PYTHON = ".".join(map(str, LAMBDA_PYTHON))
DIGEST_PREFIX = "# inputs sha256: "
REGENERATE = "python -m infra.lock"
# The build backend and pip itself are locked too: CI installs the project with
# --no-build-isolation, and infra/package.py runs this pip to fill the Lambda zip.
TOOLS = ("pip",)
#: A user's install (README, "Install"): one lock per extra, the same pins as dev.txt.
INSTALL_EXTRAS = ("aws", "gcp", "all")
INSTALL_LOCKS = {extra: DEV_LOCK.parent / f"install-{extra}.txt" for extra in INSTALL_EXTRAS}


@dataclass(frozen=True)
class Pin:
    """One requirement line of a lock: ``name==version ; marker --hash=...``."""

    name: str
    version: str
    marker: str | None
    hashes: frozenset[str]


def uv_args(lock: Path) -> list[str]:
    """The ``uv pip compile`` arguments that produce ``lock`` (relative paths,
    so they are the same on every machine and part of the digest)."""
    common = ["--generate-hashes", "--python-version", PYTHON, "--custom-compile-command", REGENERATE]
    if lock == DEV_LOCK:
        return ["pyproject.toml", "-", "--extra", "dev", "--universal", *common]
    constrained = ["-c", DEV_LOCK.relative_to(REPO).as_posix(), *common]
    if lock == LAMBDA_LOCK:
        return ["pyproject.toml", *_extras(LAMBDA_EXTRAS), *constrained,
                "--python-platform", "aarch64-manylinux2014", "--only-binary", ":all:"]
    if lock == GCP_LOCK:
        return ["pyproject.toml", *_extras(GCP_EXTRAS), *constrained, "--universal"]
    for extra, path in INSTALL_LOCKS.items():
        if lock == path:  # "-": the build backend and pip, as in dev.txt (--no-build-isolation)
            return ["pyproject.toml", "-", "--extra", extra, *constrained, "--universal"]
    raise ValueError(f"not a lock of this repository: {lock}")


def _extras(extras: tuple[str, ...]) -> list[str]:
    return [arg for e in extras for arg in ("--extra", e)]


def stdin_requirements(pyproject: Path = REPO / "pyproject.toml") -> str:
    """What dev.txt resolves besides the dev extra: the build backend and pip."""
    build = tomllib.loads(pyproject.read_text(encoding="utf-8"))["build-system"]["requires"]
    return "".join(f"{r}\n" for r in [*build, *TOOLS])


def input_digest(lock: Path, pyproject: Path = REPO / "pyproject.toml") -> str:
    """sha256 over everything ``lock`` is generated from: pyproject's
    requires-python, dependencies, optional-dependencies and build requires,
    the extra tools and the uv arguments. Formatting and comments of
    pyproject.toml do not count; any change to those tables does."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = data["project"]
    inputs = {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "build-system": data.get("build-system", {}).get("requires", []),
        "tools": TOOLS,
        "uv": uv_args(lock),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def recorded_digest(lock: Path) -> str | None:
    first = lock.read_text(encoding="utf-8").split("\n", 1)[0]
    return first[len(DIGEST_PREFIX):].split()[0] if first.startswith(DIGEST_PREFIX) else None


_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(?:;\s*(?P<marker>.+?))?\s*$")


def parse(text: str) -> list[Pin]:
    """The pins of a lock written by uv or pip-compile: comments dropped,
    continuation lines joined, every line ``name==version`` with its hashes.
    Anything else (a range, a URL, an option) is an error: pip's hash-checking
    mode would refuse it too."""
    pins = []
    for logical in re.sub(r"\\\n", " ", text).splitlines():
        line = logical.split(" #", 1)[0].strip() if not logical.lstrip().startswith("#") else ""
        if not line:
            continue
        req, *options = re.split(r"\s+(?=--)", line)
        m = _LINE.match(req)
        if not m:
            raise ValueError(f"not a pinned requirement: {req!r}")
        hashes = frozenset(o.split("=", 1)[1] for o in options if o.startswith("--hash="))
        if len(hashes) != len(options):
            raise ValueError(f"unexpected option in {line!r}")
        pins.append(Pin(canonical(m["name"]), m["version"], m["marker"], hashes))
    return pins


def read(lock: Path) -> list[Pin]:
    return parse(lock.read_text(encoding="utf-8"))


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _uv() -> str:
    try:
        import uv  # the pinned one from requirements/dev.txt
    except ModuleNotFoundError:
        found = shutil.which("uv")
        if found is None:
            raise SystemExit("uv is missing: pip install --require-hashes -r requirements/dev.txt") from None
        return found
    return uv.find_uv_bin()


def generate(lock: Path, *, upgrade: bool = False) -> None:
    cmd = [_uv(), "pip", "compile", "--quiet", *uv_args(lock), "-o", lock.relative_to(REPO).as_posix()]
    if upgrade:
        cmd.append("--upgrade")
    subprocess.run(cmd, cwd=REPO, input=stdin_requirements(), text=True, check=True)
    body = lock.read_text(encoding="utf-8")
    if body.startswith(DIGEST_PREFIX):
        body = body.split("\n", 1)[1]
    lock.write_text(f"{DIGEST_PREFIX}{input_digest(lock)} (regenerate: {REGENERATE})\n{body}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrade", action="store_true", help="newest versions pyproject.toml allows")
    args = parser.parse_args(argv)
    DEV_LOCK.parent.mkdir(parents=True, exist_ok=True)
    # dev.txt first: the bundle locks are constrained to its pins.
    for lock in (DEV_LOCK, LAMBDA_LOCK, GCP_LOCK, *INSTALL_LOCKS.values()):
        generate(lock, upgrade=args.upgrade and lock == DEV_LOCK)
        print(f"{lock.relative_to(REPO)}  {len(read(lock))} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
