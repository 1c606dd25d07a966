"""Build the deploy artifacts of orphan-cleanup.

    python infra/package.py [--out build/] [--target aws|gcp|all] [--no-deps] [--ca-bundle FILE ...]

Writes
  <out>/aws/lambda.zip          functions/aws/*.py, the orphan_cleanup package
                                and its runtime dependencies as manylinux2014
                                aarch64 wheels for CPython 3.11 (Lambda arm64),
                                every module with its .pyc; template.yaml
                                (CodeUri) and infra/aws use it.
  <out>/gcp/function-source.zip main.py (from functions/gcp/main.py) at the root,
                                the orphan_cleanup package beside it and a
                                requirements.txt that Cloud Build installs;
                                infra/gcp uploads it.

``--ca-bundle FILE`` (repeatable) puts each PEM file, byte for byte, at
``certs/<its name>`` in both archives: /var/task/certs/NAME on Lambda,
/workspace/certs/NAME on Cloud Functions, for the URL's ``sslrootcert`` (the
RDS bundle, a Cloud SQL server CA; docs/DATABASE.md). A file that holds no PEM
certificate is refused: a wrong file would fail every connection, closed but down.

What ships is what was tested: the dependencies come from the lock files
(``python -m infra.lock``), pinned identically to requirements/dev.txt, which CI
installs. The Lambda zip gets requirements/lambda.txt through pip with
``--require-hashes``; the Cloud Functions requirements.txt *is*
requirements/gcp.txt (hashes included, so Cloud Build's pip checks them too).
No tests, caches or dev tools. boto3/botocore are packed although the Lambda
runtime has its own: the SDK is the one the tests ran with, consistent with the
other pins.

The Lambda runtime cannot write to /var/task, so a zip without bytecode
compiles every module it imports on each cold start: the zip carries a .pyc
beside each module, hash-based and unchecked (no mtimes involved; the runtime
does not even read the source), compiled by this interpreter, which must be the
runtime's version. Archives are reproducible: same sources and lock, same bytes
(sorted entries, fixed timestamps and modes, pyc compiled with a fixed hash seed
and /var/task as their path). Wheels come from PyPI through pip; --no-deps skips
them (layout checks, offline). The end of the output is each archive's size and
its largest packages.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAMBDA_ZIP = Path("aws") / "lambda.zip"
GCP_ZIP = Path("gcp") / "function-source.zip"
LAMBDA_EXTRAS = ("aws", "sentry")
GCP_EXTRAS = ("gcp", "sentry")
DEV_LOCK = REPO / "requirements" / "dev.txt"
LAMBDA_LOCK = REPO / "requirements" / "lambda.txt"
GCP_LOCK = REPO / "requirements" / "gcp.txt"
LAMBDA_PLATFORM = "manylinux2014_aarch64"
LAMBDA_PYTHON = (3, 11)
LAMBDA_TASK_ROOT = "/var/task"
EXCLUDED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", "tests", "test"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
CERTS_DIR = "certs"
PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
TOP = 10


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


def pip_install(lock: Path, target: Path) -> None:
    """Install ``lock`` (every line pinned and hashed) as Lambda arm64 wheels.

    pip refuses a file whose hash is not in the lock, and a dependency the lock
    does not pin. --no-warn-conflicts: pip would compare the target with this
    interpreter's own packages, which have nothing to do with the artifact."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-warn-conflicts", "--no-compile", "--require-hashes", "--only-binary=:all:",
           "--platform", LAMBDA_PLATFORM, "--implementation", "cp",
           "--python-version", ".".join(map(str, LAMBDA_PYTHON)), "--target", str(target), "-r", str(lock)]
    subprocess.run(cmd, check=True)


def prune(stage: Path) -> None:
    """Drop what a function never runs: console scripts (pip writes them with a
    host shebang), caches, test suites, bytecode the wheels brought along."""
    shutil.rmtree(stage / "bin", ignore_errors=True)
    for path in sorted(stage.rglob("*"), reverse=True):
        if path.is_dir() and path.name in EXCLUDED_DIRS:
            shutil.rmtree(path)
        elif path.is_file() and path.name.endswith(EXCLUDED_SUFFIXES):
            path.unlink()


def compile_pyc(stage: Path, root: str = LAMBDA_TASK_ROOT) -> None:
    """Write ``__pycache__/*.cpython-3XX.pyc`` for every module under ``stage``.

    Hash-based and unchecked: the pyc does not depend on mtimes and the runtime
    uses it without reading the source. The recorded path is ``root`` (where
    Lambda unpacks the zip, so tracebacks name real files) and the hash seed is
    fixed (set and frozenset constants are marshalled in iteration order):
    the bytes depend on the source and the interpreter's version only."""
    if sys.version_info[:2] != LAMBDA_PYTHON:
        want = ".".join(map(str, LAMBDA_PYTHON))
        raise SystemExit(f"the Lambda zip carries bytecode for its runtime, CPython {want}, and only CPython {want} "
                         f"can compile it; this is {sys.version.split()[0]}: run `python{want} infra/package.py`")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "compileall", "-q", "-d", root, "--invalidation-mode", "unchecked-hash", str(stage)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"compileall failed:\n{result.stdout}{result.stderr}")


def write_zip(src: Path, archive: Path) -> None:
    """A reproducible zip of every file under ``src``: sorted entries, fixed
    times, fixed modes."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path in sorted(src.rglob("*")):
            if not path.is_file():
                continue
            info = zipfile.ZipInfo(path.relative_to(src).as_posix(), date_time=FIXED_TIME)
            info.external_attr = (0o100755 if path.stat().st_mode & 0o111 else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes(), compresslevel=9)
    tmp.replace(archive)


def check_ca_bundles(bundles: list[Path]) -> list[Path]:
    """The CA files as given, each a readable PEM with a certificate, names distinct."""
    names: set[str] = set()
    for bundle in bundles:
        try:
            data = bundle.read_bytes()
        except OSError as e:
            raise SystemExit(f"--ca-bundle {bundle}: cannot be read: {e.strerror or e}") from e
        if PEM_BEGIN not in data:
            raise SystemExit(f"--ca-bundle {bundle}: holds no PEM certificate ({PEM_BEGIN.decode()})")
        if bundle.name in names:
            raise SystemExit(f"--ca-bundle {bundle}: a second file named {bundle.name} (both go to certs/)")
        names.add(bundle.name)
    return bundles


def copy_ca_bundles(bundles: list[Path], stage: Path) -> None:
    for bundle in bundles:
        (stage / CERTS_DIR).mkdir(exist_ok=True)
        (stage / CERTS_DIR / bundle.name).write_bytes(bundle.read_bytes())


def build_lambda(out: Path, *, deps: bool = True, lock: Path = LAMBDA_LOCK, ca_bundles: list[Path] = ()) -> Path:
    with tempfile.TemporaryDirectory(prefix="oc-lambda-") as tmp:
        stage = Path(tmp)
        if deps:
            pip_install(lock, stage)
            prune(stage)
        copy_tree(REPO / "shared" / "orphan_cleanup", stage / "orphan_cleanup")
        functions = stage / "functions"
        functions.mkdir()
        # Handlers are functions.aws.<step>.handler: keep the repository layout.
        if (REPO / "functions" / "__init__.py").is_file():
            shutil.copy2(REPO / "functions" / "__init__.py", functions / "__init__.py")
        copy_tree(REPO / "functions" / "aws", functions / "aws")
        copy_ca_bundles(list(ca_bundles), stage)
        compile_pyc(stage)
        archive = out / LAMBDA_ZIP
        write_zip(stage, archive)
    return archive


def build_gcp(out: Path, *, lock: Path = GCP_LOCK, ca_bundles: list[Path] = ()) -> Path:
    with tempfile.TemporaryDirectory(prefix="oc-gcp-") as tmp:
        stage = Path(tmp)
        for module in sorted((REPO / "functions" / "gcp").glob("*.py")):
            if module.name != "__init__.py":
                shutil.copy2(module, stage / module.name)
        if not (stage / "main.py").is_file():
            raise SystemExit("functions/gcp/main.py is missing")
        copy_tree(REPO / "shared" / "orphan_cleanup", stage / "orphan_cleanup")
        shutil.copyfile(lock, stage / "requirements.txt")
        copy_ca_bundles(list(ca_bundles), stage)
        archive = out / GCP_ZIP
        write_zip(stage, archive)
    return archive


def package_sizes(archive: Path) -> list[tuple[str, int, int]]:
    """(package, unpacked bytes, files) of ``archive``, largest first. A file
    belongs to the distribution whose RECORD lists it (its .pyc to the owner of
    its source); anything else to its top-level directory or module."""
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        owner: dict[str, str] = {}
        for info in infos:
            if info.filename.endswith(".dist-info/RECORD"):
                dist = info.filename.split("/")[0].removesuffix(".dist-info").replace("-", " ", 1)
                for row in csv.reader(io.StringIO(zf.read(info).decode())):
                    if row:
                        owner[row[0]] = dist
    size: Counter[str] = Counter()
    files: Counter[str] = Counter()
    for info in infos:
        name = info.filename
        m = re.fullmatch(r"(.*?)__pycache__/([^/.]+)\.[^/]*\.pyc", name)
        source = f"{m[1]}{m[2]}.py" if m else name
        pkg = owner.get(source) or owner.get(name) or name.split("/")[0]
        size[pkg] += info.file_size
        files[pkg] += 1
    return [(pkg, n, files[pkg]) for pkg, n in size.most_common()]


def _size(n: int) -> str:
    return f"{n / 1_048_576:.1f} MiB" if n >= 1_048_576 else f"{n / 1024:.1f} KiB"


def report(archive: Path, top: int = TOP) -> str:
    sizes = package_sizes(archive)
    unpacked = sum(n for _, n, _ in sizes)
    files = sum(f for _, _, f in sizes)
    lines = [f"{archive}  {_size(archive.stat().st_size)}  ({files} files, {_size(unpacked)} unpacked)"]
    width = max(len(pkg) for pkg, _, _ in sizes[:top])
    for pkg, n, f in sizes[:top]:
        lines.append(f"    {pkg.ljust(width)}  {_size(n):>10}  {n / unpacked:4.0%}  {f:>5} files")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "build", help="output directory (default: build/)")
    parser.add_argument("--target", choices=("aws", "gcp", "all"), default="all")
    parser.add_argument("--no-deps", action="store_true",
                        help="do not install third-party wheels into the Lambda zip (layout checks only)")
    parser.add_argument("--ca-bundle", type=Path, action="append", default=[], metavar="FILE",
                        help="a PEM CA bundle to ship as certs/NAME (repeatable), e.g. RDS's global-bundle.pem")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    bundles = check_ca_bundles(args.ca_bundle)
    built = []
    if args.target in ("aws", "all"):
        built.append(build_lambda(out, deps=not args.no_deps, ca_bundles=bundles))
    if args.target in ("gcp", "all"):
        built.append(build_gcp(out, ca_bundles=bundles))
    for archive in built:
        print(report(archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
