"""The Compute Engine permissions each GCP function needs, derived from the code by AST
(as the AWS checks hold the IAM statements to the boto3 calls), and compared with the
custom roles of infra/gcp.

``providers/gcp/calls.py``: each ``GcpCalls`` method and the SDK calls it makes
(``self._clients[...].<method>``, the operation ``wait`` of ``_wait``). The provider's
modules: which ``GcpCalls`` methods each function's code calls (``self.calls.<method>``),
and on which kind (a kind constant such as ``INSTANCE``, or any kind for a variable).
A permission is ``compute.<collection>.<verb>`` as Compute Engine's IAM documentation
names them; a method this file does not know is a problem, never a silent pass."""

from __future__ import annotations

import ast
from pathlib import Path

from infra.checks._common import REPO, unquote
from infra.checks.terraform import Module

GCP = REPO / "shared" / "orphan_cleanup" / "providers" / "gcp"
# kind constant (providers/gcp/kinds.py) -> (collection, operation scope)
KINDS = {"INSTANCE": ("instances", "zone"), "DISK": ("disks", "zone"), "ADDRESS": ("addresses", "region"),
         "SNAPSHOT": ("snapshots", "global"), "FORWARDING_RULE": ("forwardingRules", "region"),
         "IMAGE": ("images", "global")}
# SDK client method -> the permissions it needs, on the kind's collection ("{c}")
SDK = {
    "aggregated_list": ("compute.{c}.list",),
    "list": ("compute.{c}.list",),
    "get": ("compute.{c}.get",),
    "delete_unary": ("compute.{c}.delete",),
    # disks.createSnapshot makes a labelled snapshot: both collections' permissions
    "create_snapshot_unary": ("compute.{c}.createSnapshot", "compute.snapshots.create", "compute.snapshots.setLabels"),
}
OPERATIONS = {"zone": "compute.zoneOperations.get", "region": "compute.regionOperations.get",
              "global": "compute.globalOperations.get"}
# Which code each function runs: whole modules, and the GcpProvider methods it calls
# (the lister lists; the deleter reads, deletes, snapshots and checks a retry leak's VM).
FUNCTION_CODE = {
    "lister": {"listing.py": None, "provider.py": {"reached_account", "iter_listing"}},
    "deleter": {"operations.py": None, "snapshots.py": None,
                "provider.py": {"reached_account", "group_operations", "holds_instance", "instance_created_at"}},
}
TF_PERMISSIONS = {"lister": "lister_permissions", "deleter": "deleter_permissions"}


def _attr_chain(node: ast.AST) -> list[str]:
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def calls_methods(path: Path = GCP / "calls.py") -> tuple[dict[str, set[str]], list[str]]:
    """GcpCalls method -> permission templates (``{c}`` the collection, ``{op}`` the
    operation of the kind's scope, or a literal), and the SDK calls this file cannot map."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GcpCalls"]
    out: dict[str, set[str]] = {}
    unknown: list[str] = []
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        perms: set[str] = set()
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            target, method = node.func.value, node.func.attr
            if isinstance(target, ast.Subscript) and _attr_chain(target.value) == ["self", "_clients"]:
                key = target.slice
                if isinstance(key, ast.Constant) and key.value == "projects":
                    if method != "get":
                        unknown.append(f"calls.py {fn.name}: projects.{method}")
                    perms.add("compute.projects.get")
                elif method in SDK:
                    perms |= set(SDK[method])
                else:
                    unknown.append(f"calls.py {fn.name}: client method {method}")
            elif _attr_chain(node.func) == ["self", "_wait"] or (method == "wait" and fn.name == "_wait"):
                perms.add("{op}")
        out[fn.name] = perms
    # a method calling another of the class (delete -> _wait) needs what that one needs
    for _ in range(3):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and _attr_chain(node.func)[:1] == ["self"] and \
                            len(_attr_chain(node.func)) == 2 and _attr_chain(node.func)[1] in out:
                        out[fn.name] |= out[_attr_chain(node.func)[1]]
    return out, unknown


def function_permissions(gcp: Path = GCP) -> tuple[dict[str, set[str]], list[str]]:
    """Each function -> the Compute permissions its code's GcpCalls calls need."""
    methods, problems = calls_methods(gcp / "calls.py")
    out: dict[str, set[str]] = {}
    for function, files in FUNCTION_CODE.items():
        perms: set[str] = set()
        for name, only in files.items():
            tree = ast.parse((gcp / name).read_text(encoding="utf-8"))
            scopes = [tree] if only is None else [
                f for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                for f in n.body if isinstance(f, ast.FunctionDef) and f.name in only]
            for scope in scopes:
                for node in ast.walk(scope):
                    if not isinstance(node, ast.Call):
                        continue
                    chain = _attr_chain(node.func)
                    if len(chain) != 3 or chain[:2] != ["self", "calls"]:
                        continue
                    if chain[2] not in methods:
                        problems.append(f"{name}: self.calls.{chain[2]} is not a GcpCalls method")
                        continue
                    first = node.args[0] if node.args else None
                    kinds = [first.id] if isinstance(first, ast.Name) and first.id in KINDS else list(KINDS)
                    for template in methods[chain[2]]:
                        for kind in kinds:
                            collection, scope_name = KINDS[kind]
                            perms.add(OPERATIONS[scope_name] if template == "{op}" else template.format(c=collection))
        out[function] = perms
    return out, problems


def _role_permissions(module: Module) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for parsed in module.files.values():
        for block in parsed.get("locals", []):
            for function, key in TF_PERMISSIONS.items():
                if key in block:
                    out[function] = {unquote(p) for p in block[key]}
    return out


def gcp_permission_problems(module: Module, gcp: Path = GCP) -> list[str]:
    """The lister's and the deleter's custom roles hold exactly what their code calls."""
    needed, problems = function_permissions(gcp)
    granted = _role_permissions(module)
    for function, perms in needed.items():
        have = granted.get(function)
        if have is None:
            problems.append(f"gcp: no local.{TF_PERMISSIONS[function]}")
            continue
        problems += [f"gcp: the {function} role lacks {p}, which its code calls" for p in sorted(perms - have)]
        problems += [f"gcp: the {function} role grants {p}, which its code never calls" for p in sorted(have - perms)]
    return problems
