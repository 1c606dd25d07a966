"""The deleter's role finishes cycles and releases leases, so it holds a cycle's outcome and
the backend's lease columns; a finished cycle is never re-opened, by any role, or every
"open cycle" check of the known orphan resources would pass again (docs/DATABASE.md, "One role
per function"; SAFETY.md rule 19). And the group's evidence the deleter's checks read (the listed
primary of rule 17) is the classifier's: the deleter changes only its detail. On a real Postgres
with infra/postgres/roles.sql applied, the three functions each on its own role."""

from __future__ import annotations

import pytest

from tests.integration.test_db_function_roles import _open_delete_cycle, ledger, role  # noqa: F401
from tests.integration.test_db_roles import PSQL, denied

pytestmark = pytest.mark.skipif(PSQL is None, reason="roles.sql runs with psql: none found")


def test_a_finished_cycle_is_never_reopened_and_adds_no_known_orphan_resource(ledger):  # noqa: F811
    s = _open_delete_cycle(ledger, "mem-reopen")
    c, b = s["cycle"], s["backend"]
    with role(ledger, "deleter").transaction() as conn:  # the cycle finishes, as its code does
        conn.run("UPDATE cycles SET outcome = 'clean', finished_at = oc_clock() WHERE id = :c", c=c)
        conn.run("UPDATE cleanup SET lease_owner = NULL, lease_expires_at = NULL WHERE backend_id = :b", b=b)

    for who in ("deleter", "classifier", "lister"):
        denied(role(ledger, who), f"UPDATE cycles SET outcome = NULL, finished_at = NULL WHERE id = '{c}'")
        denied(role(ledger, who), f"UPDATE cycles SET outcome = 'unsettled' WHERE id = '{c}'")
    with role(ledger, "deleter").transaction() as conn:  # the lease alone, pointed at the finished cycle
        conn.run("UPDATE cleanup SET lease_owner = :c, lease_expires_at = oc_clock() + interval '1 hour'"
                 " WHERE backend_id = :b", c=c, b=b)
        [[added]] = conn.run("SELECT oc_record_orphan_resources(:c, :k, ARRAY[CAST(:v AS text)])",
                             c=c, k=s["leak"].group.key, v=s["leak_volume"])
    assert added == 0
    for p in s["pipelines"].values():
        p.db.close()


def test_the_deleter_changes_only_the_detail_of_a_groups_evidence(ledger):  # noqa: F811
    s = _open_delete_cycle(ledger, "mem-evidence")
    c, k = s["cycle"], s["other"].group.key
    denied(role(ledger, "deleter"), f"UPDATE cycle_groups SET evidence = jsonb_set(coalesce(evidence, '{{}}'),"
                                    f" '{{lp}}', '\"i-0forged\"') WHERE cycle_id = '{c}' AND group_key = '{k}'")
    with role(ledger, "deleter").transaction() as conn:  # what its code writes: the detail
        conn.run("UPDATE cycle_groups SET evidence = jsonb_set(coalesce(evidence, '{}'::jsonb), '{d}',"
                 " to_jsonb('snapshot snap-1 kept'::text)) WHERE cycle_id = :c AND group_key = :k", c=c, k=k)
    for p in s["pipelines"].values():
        p.db.close()
