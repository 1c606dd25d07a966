"""Entry points named by the IaC exist in functions/ (read with ast, not imported)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path


def defined_names(path: Path) -> set[str]:
    """Top-level functions (and assigned names) of a Python file, by AST."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def lambda_handler_problems(root: Path, handlers: Iterable[str]) -> list[str]:
    """Each ``pkg.module.func`` handler resolves to ``root/pkg/module.py`` with a
    top-level ``func``."""
    problems = []
    for handler in handlers:
        module, _, func = handler.replace("/", ".").rpartition(".")
        path = root / (module.replace(".", "/") + ".py")
        if not path.is_file():
            problems.append(f"{handler}: {path.relative_to(root)} does not exist")
        elif func not in defined_names(path):
            problems.append(f"{handler}: no top-level {func} in {path.relative_to(root)}")
    return problems


def gcp_entry_point_problems(root: Path, entry_points: Iterable[str]) -> list[str]:
    path = root / "functions" / "gcp" / "main.py"
    if not path.is_file():
        return [f"{path.relative_to(root)} does not exist"]
    names = defined_names(path)
    return [f"no top-level {e} in functions/gcp/main.py" for e in entry_points if e not in names]
