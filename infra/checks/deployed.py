"""template.yaml as CloudFormation deploys it for given parameters: Rules, Conditions,
``Fn::If``, ``Fn::Select`` / ``Fn::Split`` evaluated, each function's environment (Globals
merged) and its role's statements. The checks then ask what a deployment gets, not how the
template spells it: each function's database secret and user (docs/DATABASE.md, "One role
per function"), the refusal of a target role ARN with ``*`` for the account and no
organisation or accounts, the stack's ceilings (ORPHAN_CLEANUP_MAX_MODE and the protect key
the deleter's IAM Deny covers)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from infra.checks._common import as_list
from infra.checks.intrinsics import PSEUDO, Unresolved, parameter_values

_SUB = re.compile(r"\$\{(!?)([^}]*)\}")

FUNCTIONS = {"lister": ("ListerFunction", "ListerRole"), "classifier": ("ClassifierFunction", "ClassifierRole"),
             "deleter": ("DeleterFunction", "DeleterRole")}
_NO_VALUE = object()


class _Evaluator:
    def __init__(self, template: dict, parameters: dict[str, str] | None) -> None:
        self.template = template
        self.values = parameter_values(template, parameters)
        self.conditions: dict[str, bool] = {}

    def condition(self, name: str) -> bool:
        if name not in self.conditions:
            self.conditions[name] = bool(self.value(self.template["Conditions"][name]))
        return self.conditions[name]

    def value(self, node: Any) -> Any:
        """``node`` evaluated; ``_NO_VALUE`` for AWS::NoValue (dropped from lists and maps)."""
        if isinstance(node, list):
            return [v for v in (self.value(x) for x in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, arg), = node.items()
            if key == "Ref":
                if arg == "AWS::NoValue":
                    return _NO_VALUE
                if arg in self.values:
                    return self.values[arg]
                if arg in PSEUDO:
                    return PSEUDO[arg]
                return f"<{arg}>"  # a resource of the stack
            if key == "Condition":
                return self.condition(arg)
            if key == "Fn::If":
                name, yes, no = arg
                return self.value(yes if self.condition(name) else no)
            if key == "Fn::Equals":
                a, b = (self.value(x) for x in arg)
                return a == b
            if key == "Fn::Not":
                return not self.value(arg[0])
            if key == "Fn::And":
                return all(self.value(x) for x in arg)
            if key == "Fn::Or":
                return any(self.value(x) for x in arg)
            if key == "Fn::Contains":
                items, one = (self.value(x) for x in arg)
                return one in items
            if key == "Fn::Select":
                index, items = self.value(arg[0]), self.value(arg[1])
                return items[int(index)]
            if key == "Fn::Split":
                delimiter, text = arg[0], self.value(arg[1])
                return str(text).split(delimiter)
            if key == "Fn::GetAtt":
                return f"<{arg[0]}.{arg[1]}>"
            if key == "Fn::Join":
                delimiter, items = arg
                return delimiter.join(str(x) for item in self.value(items) for x in as_list(item))
            if key == "Fn::Sub":
                text, local = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
                scope = {**self.values, **PSEUDO, **{k: self.value(v) for k, v in local.items()}}

                def one(m: re.Match) -> str:
                    if m.group(1):
                        return "${" + m.group(2) + "}"
                    found = scope.get(m.group(2), f"<{m.group(2)}>")
                    return ",".join(found) if isinstance(found, list) else str(found)

                return _SUB.sub(one, text)
        out = {k: self.value(v) for k, v in node.items()}
        return {k: v for k, v in out.items() if v is not _NO_VALUE}


@dataclass
class Deployed:
    """What one set of parameters deploys: the Rules that refuse it (their descriptions),
    each function's environment, and each function's role statements."""

    refused: list[str]
    environment: dict[str, dict[str, Any]]
    statements: dict[str, list[dict]]


def deployed(sam: dict, parameters: dict[str, str] | None = None) -> Deployed:
    ev = _Evaluator(sam, parameters)
    refused = []
    for rule in (sam.get("Rules") or {}).values():
        if "RuleCondition" in rule and not ev.value(rule["RuleCondition"]):
            continue
        refused += [" ".join(str(a.get("AssertDescription", "")).split()) for a in rule["Assertions"]
                    if not ev.value(a["Assert"])]
    global_env = ev.value(((sam.get("Globals") or {}).get("Function") or {}).get("Environment", {}))
    environment: dict[str, dict[str, Any]] = {}
    statements: dict[str, list[dict]] = {}
    for name, (fn_id, role_id) in FUNCTIONS.items():
        fn = sam["Resources"][fn_id]["Properties"]
        own = ev.value(fn.get("Environment", {}))
        environment[name] = {**global_env.get("Variables", {}), **own.get("Variables", {})}
        role = sam["Resources"][role_id]
        statements[name] = []
        for policy in ev.value(role["Properties"].get("Policies", [])):
            document = policy["PolicyDocument"]
            if isinstance(document, str):
                document = json.loads(document)
            statements[name] += as_list(document.get("Statement", []))
    return Deployed(refused, environment, statements)


def _secret_reads(statements: list[dict]) -> list[str]:
    return sorted(r for s in statements if s.get("Effect") == "Allow"
                  and "secretsmanager:GetSecretValue" in as_list(s.get("Action"))
                  for r in as_list(s.get("Resource")))


def _connects(statements: list[dict]) -> list[str]:
    return sorted(r for s in statements if s.get("Effect") == "Allow" and "rds-db:connect" in as_list(s.get("Action"))
                  for r in as_list(s.get("Resource")))


SECRETS = {fn: f"arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-{fn}-AbCdEf" for fn in FUNCTIONS}
SHARED_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:oc-runtime-AbCdEf"
RESOURCE_ID = "db-ABCDEFGHIJKL0123456789"
SECRET_PARAMETERS = {"ListerDatabaseUrlSecretArn": SECRETS["lister"],
                     "ClassifierDatabaseUrlSecretArn": SECRETS["classifier"],
                     "DeleterDatabaseUrlSecretArn": SECRETS["deleter"]}


def _dbuser(user: str) -> str:
    return f"arn:aws:rds-db:us-east-1:123456789012:dbuser:{RESOURCE_ID}/{user}"


def database_role_problems(sam: dict) -> list[str]:
    """One role per function by default (docs/DATABASE.md, "One role per function"): the
    default deploys each function with its own secret only (the Rules refuse a missing
    one); with RDS IAM authentication each role may rds-db:connect as its own user only,
    and the function logs in as that user (DATABASE_USER). The shared secret and user are
    an explicit choice (DatabaseRoles=shared)."""
    problems: list[str] = []
    try:
        default = deployed(sam, {})
        per_function = deployed(sam, SECRET_PARAMETERS)
        with_iam = deployed(sam, {**SECRET_PARAMETERS, "DatabaseIamResourceId": RESOURCE_ID})
        shared = deployed(sam, {"DatabaseRoles": "shared", "DatabaseUrlSecretArn": SHARED_SECRET,
                                "DatabaseIamResourceId": RESOURCE_ID})
        shared_missing = deployed(sam, {"DatabaseRoles": "shared"})
    except (KeyError, Unresolved, ValueError, TypeError) as e:
        return [f"database roles: cannot evaluate the template ({e!r})"]
    if not default.refused:
        problems.append("database roles: the default parameters deploy without each function's own secret")
    for fn in FUNCTIONS:
        missing = {k: v for k, v in SECRET_PARAMETERS.items() if not k.lower().startswith(fn)}
        if not deployed(sam, missing).refused:
            problems.append(f"database roles: a deploy without the {fn}'s own secret is not refused")
    if per_function.refused:
        problems.append(f"database roles: the three own secrets are refused ({per_function.refused})")
    if shared.refused:
        problems.append(f"database roles: DatabaseRoles=shared with its secret is refused ({shared.refused})")
    if not shared_missing.refused:
        problems.append("database roles: DatabaseRoles=shared without DatabaseUrlSecretArn is not refused")
    users = {fn: f"orphan_cleanup_{fn}" for fn in FUNCTIONS}
    for fn in FUNCTIONS:
        for view, secret in ((per_function, SECRETS[fn]), (shared, SHARED_SECRET)):
            kind = "shared" if view is shared else "per-function"
            if view.environment[fn].get("DATABASE_URL_SECRET_ARN") != secret:
                problems.append(f"{fn} ({kind}): DATABASE_URL_SECRET_ARN is "
                                f"{view.environment[fn].get('DATABASE_URL_SECRET_ARN')!r}, expected {secret}")
            if _secret_reads(view.statements[fn]) != [secret]:
                problems.append(f"{fn} ({kind}): its role may read {_secret_reads(view.statements[fn])}, "
                                f"expected only {secret}")
        for view, user in ((with_iam, users[fn]), (shared, "orphan_cleanup_runtime")):
            kind = "shared" if view is shared else "per-function"
            if _connects(view.statements[fn]) != [_dbuser(user)]:
                problems.append(f"{fn} ({kind}, IAM auth): rds-db:connect on {_connects(view.statements[fn])}, "
                                f"expected only {_dbuser(user)}")
            env = view.environment[fn]
            if (env.get("DATABASE_IAM_AUTH"), env.get("DATABASE_USER")) != ("true", user):
                problems.append(f"{fn} ({kind}, IAM auth): DATABASE_IAM_AUTH / DATABASE_USER are "
                                f"{env.get('DATABASE_IAM_AUTH')!r} / {env.get('DATABASE_USER')!r}, "
                                f"expected true / {user}")
        if _connects(per_function.statements[fn]) or "DATABASE_USER" in per_function.environment[fn]:
            problems.append(f"{fn}: rds-db:connect or DATABASE_USER without DatabaseIamResourceId")
    return problems


TARGET_PARAMETERS = {"lister": "TargetListRoleArnPattern", "deleter": "TargetDeleteRoleArnPattern"}


def _assumable(statements: list[dict]) -> list[str]:
    """The role ARNs the statements let a function assume; a resource that is no ARN (IAM
    refuses the policy, and the deploy fails) is returned as ``refused: TEXT``."""
    out = []
    for s in statements:
        if s.get("Effect") == "Allow" and "sts:AssumeRole" in as_list(s.get("Action")):
            out += [r if str(r).startswith("arn:") or r == "*" else f"refused: {r}" for r in as_list(s.get("Resource"))]
    return out


def target_scope_problems(sam: dict) -> list[str]:
    """A target role ARN with ``*`` for the account deploys only with TargetOrganizationId or
    TargetAccountIds (else its assume statement names no ARN, so IAM refuses the policy:
    the deploy fails, naming them); a fixed account needs neither."""
    problems: list[str] = []
    base = SECRET_PARAMETERS
    for fn, parameter in TARGET_PARAMETERS.items():
        wildcard = f"arn:aws:iam::*:role/orphan-cleanup-{fn}"
        fixed = f"arn:aws:iam::210987654321:role/orphan-cleanup-{fn}"
        cases = (
            ({parameter: wildcard}, False),
            ({parameter: wildcard, "TargetOrganizationId": "o-abcdef1234"}, True),
            ({parameter: wildcard, "TargetAccountIds": "111111111111,222222222222"}, True),
            ({parameter: fixed}, True),
        )
        for extra, wanted in cases:
            try:
                view = deployed(sam, {**base, **extra})
            except (KeyError, Unresolved, ValueError, TypeError) as e:
                return [f"target roles: cannot evaluate the template ({e!r})"]
            arns = _assumable(view.statements[fn])
            accepted = not view.refused and bool(arns) and not any(a.startswith("refused:") for a in arns)
            if accepted != wanted:
                problems.append(f"{fn}: {parameter}={extra[parameter]} with "
                                f"{ {k: v for k, v in extra.items() if k != parameter} or 'no scope'} is "
                                f"{'accepted' if accepted else 'refused'} ({arns})")
            if wanted and arns != [extra[parameter]]:
                problems.append(f"{fn}: may assume {arns}, expected only {extra[parameter]}")
    return problems


def _deny_keys(statements: list[dict]) -> set[str]:
    keys = set()
    for s in statements:
        if s.get("Effect") == "Deny":
            for k in (s.get("Condition") or {}).get("Null", {}):
                if k.startswith("aws:ResourceTag/"):
                    keys.add(k.removeprefix("aws:ResourceTag/"))
    return keys


def ceiling_problems(sam: dict) -> list[str]:
    """Every function gets ORPHAN_CLEANUP_MAX_MODE (the MaxMode parameter: report or
    delete, report by default) and ORPHAN_CLEANUP_PROTECT_TAG_KEY, a key the deleter's IAM
    Deny covers (docs/SAFETY.md rules 8 and 16)."""
    problems: list[str] = []
    spec = sam.get("Parameters", {}).get("MaxMode") or {}
    if (sorted(spec.get("AllowedValues", [])), spec.get("Default")) != (["delete", "report"], "report"):
        problems.append(f"MaxMode: AllowedValues {spec.get('AllowedValues')!r}, Default {spec.get('Default')!r}; "
                        "expected report | delete, report")
    for extra in ({}, {"MaxMode": "delete", "ProtectTagKeys": "platform-keep,orphan-cleanup-protect"}):
        try:
            view = deployed(sam, {**SECRET_PARAMETERS, **extra})
        except (KeyError, Unresolved, ValueError, TypeError) as e:
            return [f"ceilings: cannot evaluate the template ({e!r})"]
        denied = _deny_keys(view.statements["deleter"])
        for fn in FUNCTIONS:
            env = view.environment[fn]
            if env.get("ORPHAN_CLEANUP_MAX_MODE") != extra.get("MaxMode", "report"):
                problems.append(f"{fn}: ORPHAN_CLEANUP_MAX_MODE is {env.get('ORPHAN_CLEANUP_MAX_MODE')!r} "
                                f"with {extra or 'the defaults'}")
            key = env.get("ORPHAN_CLEANUP_PROTECT_TAG_KEY")
            if key not in denied:
                problems.append(f"{fn}: ORPHAN_CLEANUP_PROTECT_TAG_KEY {key!r} is not a key the deleter's Deny "
                                f"covers ({sorted(denied)})")
    return problems
