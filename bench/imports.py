"""Benchmark: cold import time of each handler, one fresh interpreter per run.

    python -m bench --only imports                 # the repo, and build/aws/lambda.zip if it was built
    python -m bench.imports [--repo DIR] [--bundle ZIP] [--runs 5]

Each run is ``python -X importtime -c "import <handler module>"``; the figure is
the cumulative time of that import (median of the runs, after one warm-up run),
next to the whole process's wall time, and the modules and distributions the
time goes to. Two places:

- ``repo``: ``PYTHONPATH=shared:.`` from a checkout, this environment's
  packages, bytecode caches as a developer has them (the warm-up writes them);
- ``bundle``: the extracted Lambda zip with ``-B``, like /var/task, which is
  read-only: a module without a shipped .pyc is compiled on every cold start.
  Wheels built for another platform (the zip's aarch64 ``pydantic_core`` on an
  x86_64 machine) cannot load here: they are measured from this environment
  instead when it has the same version, else from the same version for this
  host fetched with pip; the table names them.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.tags import parse_tag, sys_tags

from bench.common import Table

REPO = Path(__file__).resolve().parent.parent
AWS_HANDLERS = ("functions.aws.lister", "functions.aws.classifier", "functions.aws.deleter")
GCP_HANDLERS = ("functions.gcp.main",)
DEFAULT_BUNDLE = REPO / "build" / "aws" / "lambda.zip"
TOP = 5
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)$")


@dataclass(frozen=True)
class Imported:
    module: str
    self_us: int
    cumulative_us: int
    depth: int


def parse_importtime(stderr: str) -> list[Imported]:
    """The rows of ``-X importtime`` (nesting from the indentation)."""
    rows = []
    for line in stderr.splitlines():
        m = _LINE.match(line)
        if m:
            rows.append(Imported(m[4], int(m[1]), int(m[2]), len(m[3]) // 2))
    return rows


@dataclass
class Measured:
    handler: str
    where: str
    import_ms: float
    process_ms: float
    cpu_ms: float
    top_modules: list[tuple[str, float]]
    top_packages: list[tuple[str, float]]


def measure(handler: str, root: Path, pythonpath: list[Path], *, runs: int, write_bytecode: bool,
            where: str) -> Measured:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_URL", "PYTHON"))}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    cmd = [sys.executable, *([] if write_bytecode else ["-B"]), "-X", "importtime", "-c", f"import {handler}"]
    samples = []
    for i in range(runs + 1):
        t0, cpu0 = time.perf_counter(), _children_cpu()
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if done.returncode != 0:
            raise RuntimeError(f"import {handler} failed in {root}:\n{done.stderr[-2000:]}")
        if i:  # the first run warms the page cache (and, in the repo, writes __pycache__)
            samples.append((wall, cpu, parse_importtime(done.stderr)))
    totals = [rows[_end(rows, handler)].cumulative_us for _, _, rows in samples]
    # The breakdown is of the run whose total is the median one.
    rows = samples[totals.index(sorted(totals)[len(totals) // 2])][2]
    chain = {handler.rsplit(".", i)[0] for i in range(handler.count(".") + 1)}
    start = _start(rows, handler)
    mine = rows[start:]
    modules = sorted((r for r in mine if r.module not in chain), key=lambda r: -r.cumulative_us)[:TOP]
    packages: Counter[str] = Counter()
    for r in mine:
        packages[r.module.split(".")[0]] += r.self_us
    wall_ms = statistics.median(w for w, _, _ in samples) * 1000
    cpu_ms = statistics.median(c for _, c, _ in samples) * 1000
    return Measured(handler, where, statistics.median(totals) / 1000, wall_ms, cpu_ms,
                    [(r.module, r.cumulative_us / 1000) for r in modules],
                    [(p, us / 1000) for p, us in packages.most_common(TOP)])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _end(rows: list[Imported], handler: str) -> int:
    """Index of the handler's own row: the last top-level one (rows are
    printed when an import finishes, so what it imported comes before it)."""
    return max(i for i, r in enumerate(rows) if r.depth == 0 and r.module == handler)


def _start(rows: list[Imported], handler: str) -> int:
    """Index of the first row the handler's import caused."""
    start = _end(rows, handler)
    while start > 0 and rows[start - 1].depth > 0:
        start -= 1
    return start


def unpack_bundle(archive: Path, dest: Path) -> tuple[list[Path], list[str]]:
    """Extract ``archive`` into ``dest``/task and make it importable here: the
    path to put on PYTHONPATH, and a note per distribution taken from elsewhere."""
    task = dest / "task"
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(task)
    host = set(sys_tags())
    side = dest / "host-wheels"
    notes, fetched = [], []
    for wheel_file in sorted(task.glob("*.dist-info/WHEEL")):
        tags = {t for line in wheel_file.read_text().splitlines() if line.startswith("Tag:")
                for t in parse_tag(line.split(":", 1)[1].strip())}
        if tags & host:
            continue
        info = wheel_file.parent
        name, dist_version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        for line in (info / "RECORD").read_text().splitlines():
            path = task / line.split(",")[0]
            pyc = path.parent / "__pycache__" / f"{path.stem}.{sys.implementation.cache_tag}.pyc"
            for p in (path, pyc):
                p.unlink(missing_ok=True)
        try:
            same = version(name) == dist_version
        except PackageNotFoundError:
            same = False
        if same:
            notes.append(f"{name} {dist_version} ({'/'.join(sorted({t.platform for t in tags}))}): from this venv")
        else:
            fetched.append(f"{name}=={dist_version}")
            notes.append(f"{name} {dist_version}: this venv has another version; the host's wheel via pip")
    if fetched:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--target", str(side), *fetched], check=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(side)], check=True)
    return [task, *([side] if fetched else [])], notes


def run(*, repo: Path = REPO, bundle: Path | None = None, runs: int = 5) -> list[Table]:
    """Measure every handler from ``repo``, and the AWS ones from ``bundle``
    (default: build/aws/lambda.zip when it exists)."""
    if bundle is None and DEFAULT_BUNDLE.is_file():
        bundle = DEFAULT_BUNDLE
    results = [measure(h, repo, [repo / "shared", repo], runs=runs, write_bytecode=True, where="repo")
               for h in (*AWS_HANDLERS, *GCP_HANDLERS)]
    notes = [f"{runs} fresh processes per row after a warm-up; import = the handler import's cumulative "
             "-X importtime; process = wall time of the whole interpreter, "
             "cpu = its user+sys time (less sensitive to a busy machine)",
             f"repo: PYTHONPATH=shared:. in {repo}, bytecode caches written"]
    if bundle is not None:
        with tempfile.TemporaryDirectory(prefix="oc-bench-imports-") as tmp:
            path, bundle_notes = unpack_bundle(bundle, Path(tmp))
            results += [measure(h, path[0], path, runs=runs, write_bytecode=False, where="bundle")
                        for h in AWS_HANDLERS]
        notes.append(f"bundle: {bundle} extracted, python -B (read-only like /var/task)")
        notes += [f"bundle: {n}" for n in bundle_notes]
    else:
        notes.append("bundle: not measured (no build/aws/lambda.zip: python infra/package.py)")
    top = f"top {TOP} modules by cumulative ms"
    main = Table("Cold import of each handler, ms (median)",
                 ["handler", "where", "import ms", "process ms", "cpu ms", top], notes=notes)
    parts = Table(f"Where the import time goes: top {TOP} top-level packages by self time, ms (median run)",
                  ["handler", "where", "packages"])
    for m in results:
        main.add(handler=m.handler, where=m.where, **{
            "import ms": m.import_ms, "process ms": m.process_ms, "cpu ms": m.cpu_ms,
            top: ", ".join(f"{n} {ms:.0f}" for n, ms in m.top_modules)})
        parts.add(handler=m.handler, where=m.where, packages=", ".join(f"{n} {ms:.0f}" for n, ms in m.top_packages))
    return [main, parts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.imports", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=REPO, help="checkout to import from (default: this one)")
    p.add_argument("--bundle", type=Path, help=f"Lambda zip to import from (default: {DEFAULT_BUNDLE} if built)")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    for table in run(repo=args.repo.resolve(), bundle=args.bundle, runs=args.runs):
        print(table.render())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
