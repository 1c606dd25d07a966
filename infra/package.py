"""Build the deploy artifacts of orphan-cleanup.

    python infra/package.py [--out build/] [--target aws|gcp|all] [--no-deps]

Writes
  <out>/aws/lambda.zip          functions/aws/*.py, the orphan_cleanup package
                                and its runtime dependencies as manylinux2014
                                aarch64 wheels for CPython 3.12 (Lambda arm64);
                                template.yaml (CodeUri) and infra/aws use it.
  <out>/gcp/function-source.zip main.py (from functions/gcp/main.py) at the root,
                                the orphan_cleanup package beside it and a
                                requirements.txt that Cloud Build installs;
                                infra/gcp uploads it.

Only the runtime dependencies declared in pyproject.toml are packed (core +
extras aws, sentry for Lambda; core + gcp, sentry for Cloud Functions); no
tests, caches or dev tools. boto3/botocore are packed too although the Lambda
runtime has its own: resolved together, every pin is consistent (the runtime's
botocore next to a newer python-dateutil from the zip would not be), and the
SDK is the one the tests ran with. Archives are reproducible (sorted entries,
fixed timestamps), so an unchanged build does not redeploy. Wheels come from
PyPI through pip; --no-deps skips them (layout checks, offline).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAMBDA_ZIP = Path("aws") / "lambda.zip"
GCP_ZIP = Path("gcp") / "function-source.zip"
LAMBDA_EXTRAS = ("aws", "sentry")
GCP_EXTRAS = ("gcp", "sentry")
LAMBDA_PLATFORM = ("manylinux2014_aarch64", "3.12")
EXCLUDED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", "tests", "test"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def requirements(extras: tuple[str, ...], pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The core dependencies plus those of ``extras``, with self-references
    (``orphan-cleanup[x]``) expanded, in declaration order without repeats."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    name = _canonical(project["name"])
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    pending = list(project.get("dependencies", [])) + [f"{name}[{e}]" for e in extras]
    seen_extras: set[str] = set()
    while pending:
        req = pending.pop(0)
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", req)
        if m and _canonical(m.group(1)) == name:
            for extra in (m.group(2) or "").split(","):
                extra = extra.strip()
                if extra and extra not in seen_extras:
                    seen_extras.add(extra)
                    pending += optional[extra]
        elif req not in out:
            out.append(req)
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _included(path: Path) -> bool:
    return not (set(path.parts) & EXCLUDED_DIRS) and not path.name.endswith(EXCLUDED_SUFFIXES)


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a source package without caches or tests."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_file() and _included(rel):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)


def pip_install(reqs: list[str], target: Path, platform: tuple[str, str] | None) -> None:
    # --no-warn-conflicts: pip would compare the target with this interpreter's
    # own packages, which have nothing to do with the artifact.
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-warn-conflicts", "--no-compile", "--target", str(target), "--upgrade"]
    if platform:
        plat, py = platform
        cmd += ["--platform", plat, "--implementation", "cp", "--python-version", py,
                "--only-binary=:all:"]
    subprocess.run(cmd + reqs, check=True)
    # Console scripts are useless in a function and pip writes them with a host shebang.
    shutil.rmtree(target / "bin", ignore_errors=True)


def write_zip(src: Path, archive: Path) -> None:
    """A reproducible zip of ``src``: sorted entries, fixed times, fixed modes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src)
            if not path.is_file() or not _included(rel):
                continue
            info = zipfile.ZipInfo(rel.as_posix(), date_time=FIXED_TIME)
            info.external_attr = (0o100755 if path.stat().st_mode & 0o111 else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes(), compresslevel=9)
    tmp.replace(archive)


def build_lambda(out: Path, *, deps: bool = True) -> Path:
    with tempfile.TemporaryDirectory(prefix="oc-lambda-") as tmp:
        stage = Path(tmp)
        if deps:
            pip_install(requirements(LAMBDA_EXTRAS), stage, LAMBDA_PLATFORM)
        copy_tree(REPO / "shared" / "orphan_cleanup", stage / "orphan_cleanup")
        functions = stage / "functions"
        functions.mkdir()
        # Handlers are functions.aws.<step>.handler: keep the repository layout.
        if (REPO / "functions" / "__init__.py").is_file():
            shutil.copy2(REPO / "functions" / "__init__.py", functions / "__init__.py")
        copy_tree(REPO / "functions" / "aws", functions / "aws")
        archive = out / LAMBDA_ZIP
        write_zip(stage, archive)
    return archive


def build_gcp(out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="oc-gcp-") as tmp:
        stage = Path(tmp)
        for module in sorted((REPO / "functions" / "gcp").glob("*.py")):
            if module.name != "__init__.py":
                shutil.copy2(module, stage / module.name)
        if not (stage / "main.py").is_file():
            raise SystemExit("functions/gcp/main.py is missing")
        copy_tree(REPO / "shared" / "orphan_cleanup", stage / "orphan_cleanup")
        (stage / "requirements.txt").write_text(
            "# Runtime dependencies of orphan-cleanup (pyproject.toml: core + gcp, sentry).\n"
            + "\n".join(requirements(GCP_EXTRAS)) + "\n", encoding="utf-8")
        archive = out / GCP_ZIP
        write_zip(stage, archive)
    return archive


def _size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1_048_576:.1f} MiB" if n >= 1_048_576 else f"{n / 1024:.1f} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "build", help="output directory (default: build/)")
    parser.add_argument("--target", choices=("aws", "gcp", "all"), default="all")
    parser.add_argument("--no-deps", action="store_true",
                        help="do not install third-party wheels into the Lambda zip (layout checks only)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    built = []
    if args.target in ("aws", "all"):
        built.append(build_lambda(out, deps=not args.no_deps))
    if args.target in ("gcp", "all"):
        built.append(build_gcp(out))
    for archive in built:
        with zipfile.ZipFile(archive) as zf:
            files = len(zf.namelist())
        print(f"{archive}  {_size(archive)}  ({files} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
