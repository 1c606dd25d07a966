"""Rule 23: "An operator keeps a ref with `orphans keep` at any time before it goes." A keep is
stored per (backend, ref) and read per backend (``LEDGER_SQL``, ``LockedCycle.delete_request``),
but ownership and listing are per provider account (rules 10, 16): every backend of the account
lists the ref and judges it an orphan. The operator keeps the ref on the owner's backend (the one
``orphans`` names first); the other backend of the same account deletes it anyway."""

from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.store import LedgerStore
from tests.attack.rule23_harness import WINDOW, Clock, actions, pipeline
from tests.support.memory_cloud import MemoryCloud
from tests.support.platform import Platform, add_backend


def test_keep_on_owner_backend_does_not_stop_the_other_backend_of_the_account(db):
    cloud = MemoryCloud()
    add_backend(db, "mem", mode="delete", regions=("r1",))
    add_backend(db, "mem2", mode="delete", regions=("r1",))  # same provider and account
    p = Platform(db, cloud)
    ref, _, iid = p.terminated_leak("r1")
    clock = Clock(db)
    pl = pipeline(db, cloud, clock)

    assert actions(run_cycle(pl, "mem", mode="delete"))[iid][2] == "marked"
    assert actions(run_cycle(pl, "mem2", mode="delete"))[iid][2] == "marked"

    # The operator keeps the ref before it goes (on its owner's backend).
    LedgerStore(db).keep_ref("mem", ref, "investigating", None)

    clock.advance(WINDOW + 1)
    kept = run_cycle(pl, "mem", mode="delete")
    assert actions(kept)[iid][:2] == ("protected", "kept_by_operator")
    other = run_cycle(pl, "mem2", mode="delete")
    assert cloud.exists(iid), f"a kept ref deleted by another backend of its account: {actions(other)[iid]}"
