"""Terraform modules read with python-hcl2: references, descriptions, IAM documents."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from infra.checks._common import as_list, unquote
from infra.checks.iam import DELETE_ACTIONS, ec2_write_grants, instance_attribute_problems, snapshot_create_problems

_REF_PATTERNS = {
    "var": re.compile(r"(?<![\w.])var\.([A-Za-z_][\w-]*)"),
    "local": re.compile(r"(?<![\w.])local\.([A-Za-z_][\w-]*)"),
    "module": re.compile(r"(?<![\w.])module\.([A-Za-z_][\w-]*)"),
    "data": re.compile(r"(?<![\w.])data\.([a-z][a-z0-9_]*)\.([A-Za-z_][\w-]*)"),
}
_RESOURCE_REF = re.compile(r"(?<![\w.\"/:-])([a-z][a-z0-9]*)_([a-z0-9_]+)\.([A-Za-z_][\w-]*)")


def code_text(value: str) -> str:
    """The expression text of an hcl2 value with string-literal text blanked,
    keeping the ``${...}`` interpolations inside strings."""
    out: list[str] = []
    stack = ["code"]
    i = 0
    while i < len(value):
        c = value[i]
        if stack[-1] == "str":
            if c == "\\":
                i += 2
                continue
            if value.startswith("${", i):
                stack.append("interp")
                out.append(" ")
                i += 2
                continue
            if c == '"':
                stack.pop()
            out.append(" ")
            i += 1
            continue
        if c == '"':
            stack.append("str")
            out.append(" ")
        elif value.startswith("${", i):
            stack.append("interp")
            out.append("  ")
            i += 2
            continue
        elif c == "{":
            stack.append("brace")
            out.append(c)
        elif c == "}" and len(stack) > 1:
            stack.pop()
            out.append(" ")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _walk_values(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "__is_block__":
                continue
            if isinstance(k, str) and k.startswith("${"):
                yield k
            yield from _walk_values(v)
    elif isinstance(node, list):
        for x in node:
            yield from _walk_values(x)
    elif isinstance(node, str):
        yield node


@lru_cache(maxsize=64)
def _parsed_tf(path: Path, mtime_ns: int) -> str:
    import hcl2

    with path.open(encoding="utf-8") as fh:
        return json.dumps(hcl2.load(fh))


@dataclass
class Module:
    """What one Terraform directory declares and references."""

    path: Path
    files: dict[str, dict]

    @classmethod
    def load(cls, path: Path) -> Module:
        files = {tf.name: json.loads(_parsed_tf(tf, tf.stat().st_mtime_ns)) for tf in sorted(path.glob("*.tf"))}
        return cls(path, files)

    @classmethod
    def from_text(cls, files: dict[str, str]) -> Module:
        import hcl2

        return cls(Path("<memory>"), {name: hcl2.loads(text) for name, text in files.items()})

    def blocks(self, kind: str) -> Iterator[tuple[str, dict]]:
        for parsed in self.files.values():
            for entry in parsed.get(kind, []):
                for name, body in entry.items():
                    yield unquote(name), body

    def labelled(self, kind: str) -> Iterator[tuple[str, str, dict]]:
        for type_, by_name in self.blocks(kind):
            for name, body in by_name.items():
                yield type_, unquote(name), body

    @property
    def providers(self) -> set[str]:
        names = {"terraform"}
        for parsed in self.files.values():
            for tf in parsed.get("terraform", []):
                for rp in tf.get("required_providers", []):
                    names |= {k for k in rp if k != "__is_block__"}
        return names

    def declared(self) -> dict[str, set]:
        locals_: set[str] = set()
        for parsed in self.files.values():
            for block in parsed.get("locals", []):
                locals_ |= {k for k in block if k != "__is_block__"}
        return {
            "var": {n for n, _ in self.blocks("variable")},
            "local": locals_,
            "module": {n for n, _ in self.blocks("module")},
            "data": {(t, n) for t, n, _ in self.labelled("data")},
            "resource": {(t, n) for t, n, _ in self.labelled("resource")},
        }

    def references(self) -> dict[str, set]:
        refs: dict[str, set] = {"var": set(), "local": set(), "module": set(), "data": set(),
                                "resource": set()}
        providers = self.providers
        for parsed in self.files.values():
            # A moved/removed block names an address that is gone on purpose.
            kept = {k: v for k, v in parsed.items() if k not in ("moved", "removed")}
            for raw in _walk_values(kept):
                text = code_text(raw)
                for kind in ("var", "local", "module"):
                    refs[kind] |= set(_REF_PATTERNS[kind].findall(text))
                refs["data"] |= set(_REF_PATTERNS["data"].findall(text))
                for prefix, rest, name in _RESOURCE_REF.findall(text):
                    if prefix in providers:
                        refs["resource"].add((f"{prefix}_{rest}", name))
        return refs


def terraform_reference_problems(module: Module) -> list[str]:
    """Every var./local./module./data./resource reference is declared in the
    module, and every declared variable is used."""
    declared, refs = module.declared(), module.references()
    problems = []
    for kind in ("var", "local", "module"):
        problems += [f"{module.path.name}: undeclared {kind}.{n}" for n in sorted(refs[kind] - declared[kind])]
    problems += [f"{module.path.name}: undeclared data.{t}.{n}" for t, n in sorted(refs["data"] - declared["data"])]
    problems += [f"{module.path.name}: undeclared resource {t}.{n}"
                 for t, n in sorted(refs["resource"] - declared["resource"])]
    problems += [f"{module.path.name}: variable {n} is never used" for n in sorted(declared["var"] - refs["var"])]
    return problems


def terraform_description_problems(module: Module) -> list[str]:
    problems = []
    for kind in ("variable", "output"):
        for name, body in module.blocks(kind):
            if not unquote(str(body.get("description", ""))).strip():
                problems.append(f"{module.path.name}: {kind} {name} has no description")
    return problems


def terraform_literals(module: Module, key: str) -> list[str]:
    """Literal string values of ``key`` anywhere in the module's resources and
    locals (entry points live in a ``local.functions`` map)."""
    found = []
    for parsed in module.files.values():
        for kind in ("resource", "locals"):
            for block in parsed.get(kind, []):
                found += [unquote(v) for v in _find_key(block, key) if not v.startswith("${")]
    return found


def _find_key(node: Any, key: str) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from _find_key(v, key)
    elif isinstance(node, list):
        for x in node:
            yield from _find_key(x, key)


def terraform_policy_documents(module: Module) -> dict[str, list[dict]]:
    """Every ``data "aws_iam_policy_document"`` as IAM-shaped statements.
    ``local.X`` action lists are resolved; any other expression counts as ``*``.
    A ``dynamic "statement"`` that denies is read like a static one (with a
    ``ForEach`` entry, its variable left as ``${statement.value}``): a Deny only
    narrows. Any other dynamic statement cannot be read statically: it becomes
    a pseudo statement that allows ``*``, so the checks reject it."""
    local_lists = _terraform_local_lists(module)
    documents: dict[str, list[dict]] = {}
    for t, n, body in module.labelled("data"):
        if t != "aws_iam_policy_document":
            continue
        statements = [_statement(st, local_lists) for st in body.get("statement", [])]
        for dyn in body.get("dynamic", []):
            for label, block in dyn.items():
                if unquote(label) != "statement":
                    continue
                content = (block.get("content") or [{}])[0]
                if unquote(content.get("effect", '"Allow"')) == "Deny":
                    statements.append({**_statement(content, local_lists), "ForEach": block.get("for_each")})
                else:
                    statements.append({"Sid": "dynamic statement", "Effect": "Allow", "Action": "*"})
        documents[n] = statements
    return documents


def _statement(st: dict, local_lists: dict[str, list[str]]) -> dict:
    cond: dict[str, dict] = {}
    for c in st.get("condition", []):
        test, variable = unquote(c["test"]), unquote(c["variable"])
        values = [unquote(v) for v in as_list(c["values"])]
        cond.setdefault(test, {})[variable] = values
    actions = st.get("actions", [])
    actions = [unquote(a) for a in as_list(actions)] if isinstance(actions, list) else [unquote(actions)]
    resolved: list[str] = []
    for a in actions:
        resolved += local_lists.get(a, ["*"] if a.startswith("${") else [a])
    statement: dict[str, Any] = {"Sid": unquote(st.get("sid", "?")), "Effect": unquote(st.get("effect", '"Allow"')),
                                 "Action": resolved, "Condition": cond,
                                 "Resource": [unquote(r) for r in as_list(st.get("resources", []))]}
    if "not_actions" in st:
        statement["NotAction"] = st["not_actions"]
    return statement


def terraform_iam_problems(module: Module, tag_key: str = "${var.tag_key}") -> list[str]:
    """infra/aws: EC2 writes appear only in the ``deleter`` document, each under
    the ref-tag condition, covering every delete action; Lambda's own VPC
    interface management is the one other exception; no managed policies."""
    problems: list[str] = []
    for name, statements in terraform_policy_documents(module).items():
        grants = ec2_write_grants(statements, tag_key)
        for g in grants:
            if g.guard is None:
                problems.append(f"aws_iam_policy_document.{name}: {g.action} (statement {g.sid}) is not "
                                f"limited to resources tagged {tag_key}")
            elif g.guard in ("tag", "snapshot-create") and name != "deleter":
                problems.append(f"aws_iam_policy_document.{name}: grants {g.action}; only the deleter deletes")
        if name == "deleter":
            tagged = {g.action for g in grants if g.guard == "tag"}
            problems += [f"aws_iam_policy_document.deleter: lacks {a} under the tag condition"
                         for a in sorted(DELETE_ACTIONS - tagged)]
            problems += snapshot_create_problems(grants, "aws_iam_policy_document.deleter")
            problems += instance_attribute_problems(statements, "aws_iam_policy_document.deleter")
    for t, n, body in module.labelled("resource"):
        if t in ("aws_iam_role_policy_attachment", "aws_iam_policy_attachment") or \
                (t == "aws_iam_role" and "managed_policy_arns" in body):
            problems.append(f"{t}.{n}: managed policies are not allowed on the function roles")
    return problems


def _terraform_local_lists(module: Module) -> dict[str, list[str]]:
    """``${local.X}`` -> the literal list it names, for action lists kept in locals."""
    out: dict[str, list[str]] = {}
    for parsed in module.files.values():
        for block in parsed.get("locals", []):
            for k, v in block.items():
                if isinstance(v, list) and all(isinstance(x, str) for x in v):
                    out[f"${{local.{k}}}"] = [unquote(x) for x in v]
    return out
