"""The grants of infra/postgres/roles.sql that ``migrate`` applies itself, so that an upgrade
is one command (docs/DEPLOY.md, "Upgrade"; docs/DATABASE.md, "4. Roles").

roles.sql includes ``grants.sql`` (which includes ``function_roles.sql``); ``migrate`` reads
the same two files here, with the subset of psql they are written in: ``:'name'`` (a
literal), ``:"name"`` (an identifier), ``\\gexec`` (run each cell of the query's rows) and
``\\ir``. One text of the grants, two callers, the same result (tests/integration/
test_db_upgrade.py compares the catalog after each)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from orphan_cleanup.core.errors import ConfigError

ROLES_SQL_COMMAND = 'psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f infra/postgres/roles.sql'
_VARIABLE = re.compile(r""":'(\w+)'|:"(\w+)\"""")


@dataclass(frozen=True)
class RoleNames:
    """The role names roles.sql was given (its psql variables), with its defaults."""

    owner: str = "orphan_cleanup_owner"
    runtime: str = "orphan_cleanup_runtime"
    lister: str = "orphan_cleanup_lister"
    classifier: str = "orphan_cleanup_classifier"
    deleter: str = "orphan_cleanup_deleter"
    definer: str = "orphan_cleanup_definer"

    @property
    def granted(self) -> tuple[str, ...]:
        """The roles the grants are for (the owner grants them)."""
        return (self.runtime, self.lister, self.classifier, self.deleter, self.definer)

    def variables(self, schema: str) -> dict[str, str]:
        return dict(owner_role=self.owner, runtime_role=self.runtime, lister_role=self.lister,
                    classifier_role=self.classifier, deleter_role=self.deleter, definer_role=self.definer,
                    schema=schema)


def statements(variables: dict[str, str], name: str = "grants.sql") -> list[tuple[str, bool]]:
    """(sql, gexec) of the packaged script ``name``, its variables substituted as psql does."""
    text = (resources.files("orphan_cleanup.ledger") / name).read_text(encoding="utf-8")
    out: list[tuple[str, bool]] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = end if end >= 0 else n
        elif ch in "'\"":
            j = i + 1
            while j < n and not (text[j] == ch and text[j + 1:j + 2] != ch):
                j += 2 if text[j] == ch else 1
            buf.append(text[i:j + 1])
            i = j + 1
        elif ch == ":" and (m := _VARIABLE.match(text, i)):
            literal, ident = m.groups()
            if (literal or ident) not in variables:
                raise ValueError(f"{name}: no value for :{literal or ident}")
            value = variables[literal or ident]
            buf.append("'" + value.replace("'", "''") + "'" if literal else '"' + value.replace('"', '""') + '"')
            i = m.end()
        elif ch == ":" and text[i + 1:i + 2].isalpha() and text[i - 1:i] != ":":
            raise ValueError(f"{name}: psql's :name is not read here, only :'name' and :\"name\"")
        elif ch == "$":
            raise ValueError(f"{name}: dollar quoting is not read here")
        elif ch == "\\":
            end = text.find("\n", i)
            command = text[i:end if end >= 0 else n].split()
            if command[0] == "\\gexec":
                out.append(("".join(buf).strip(), True))
                buf = []
            elif command[0] == "\\ir" and len(command) == 2:
                out.extend(statements(variables, command[1]))
            else:
                raise ValueError(f"{name}: psql's {command[0]} is not read here")
            i = end if end >= 0 else n
        elif ch == ";":
            if "".join(buf).strip():
                out.append(("".join(buf).strip(), False))
            buf = []
            i += 1
        else:
            buf.append(ch)
            i += 1
    if "".join(buf).strip():
        raise ValueError(f"{name}: a statement without ; or \\gexec at its end")
    return out


def apply(conn: Any, roles: RoleNames, schema: str) -> None:
    """Run grants.sql on ``conn`` (inside the caller's transaction), as psql would."""
    for sql, gexec in statements(roles.variables(schema)):
        if not gexec:
            conn.run(sql)
            continue
        for row in conn.run(sql):
            for cell in row:
                if cell is not None:
                    conn.run(cell)


def blocker(conn: Any, roles: RoleNames) -> tuple[bool, str | None]:
    """(grant?, why not): whether ``migrate`` on ``conn`` can apply the grants for ``roles``.

    (False, None): no role of roles.sql here (the embedded database, a database nobody ran
    roles.sql on), nothing to grant. (True, None): every role exists and ``conn`` is the owner
    role's. Otherwise why it cannot: a missing role, another role connected, or the owner's
    default privileges (which roles.sql sets) naming roles other than the given ones: roles.sql
    ran with other names."""
    user = conn.run("SELECT current_user")[0][0]
    existing = {r[0] for r in conn.run("SELECT rolname FROM pg_roles WHERE rolname = ANY(CAST(:r AS text[]))",
                                       r=list(roles.granted))}
    others = sorted(r[0] for r in conn.run(
        "SELECT DISTINCT g.grantee::regrole::text FROM pg_default_acl d, aclexplode(d.defaclacl) g"
        " WHERE d.defaclrole = (SELECT oid FROM pg_roles WHERE rolname = current_user)"
        " AND g.grantee NOT IN (0, d.defaclrole) AND NOT g.grantee::regrole::text = ANY(CAST(:r AS text[]))",
        r=list(roles.granted)))
    if not existing and not others:
        return False, None
    if others:
        return False, (f"roles.sql granted {', '.join(others)}, not the role names migrate was given"
                       f" ({', '.join(roles.granted)})")
    missing = [r for r in roles.granted if r not in existing]
    if missing:
        return False, f"role(s) {', '.join(missing)} do not exist"
    if user != roles.owner:
        return False, f"connected as {user}, not as the owner role {roles.owner}"
    return True, None


def refusal(pending: int, why: str) -> ConfigError:
    """The one line of a ``migrate`` that cannot grant what its migrations need."""
    return ConfigError(
        f"{pending} migration(s) to apply, but migrate cannot grant the database roles what they need"
        f" ({why}); nothing was applied. Give migrate the role names roles.sql was given (--owner-role,"
        f" --runtime-role, --lister-role, --classifier-role, --deleter-role, --definer-role) and the owner"
        f" role's DATABASE_URL, or run `orphan-cleanup migrate --skip-grants` and then `{ROLES_SQL_COMMAND}`"
        " with the -v options it was first run with")
