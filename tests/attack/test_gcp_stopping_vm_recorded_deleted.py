"""B5 (P3 misleading record): a GCP VM that someone is merely STOPPING (a stop, not a delete)
is recorded as the group's deleted owner, "termination confirmed", with no delete call.
``gcp/kinds.py: INSTANCE_DELETING`` reads ``STOPPING`` as ``TERMINATING`` for the deletion, and
``deletion.py: _Run.owner_step`` then takes ``_deleting``: the owner is appended to
``deleted`` and the status is ``deleting``; ``core/delete_rules.py: delete_record`` writes
"deleting orphan group ...: owner termination confirmed, dependents follow", the orphan row
goes to ``deleting`` and (``ledger/locked.py: record_delete``) the owner counts as deleted
for ``orphan_resources``. Nothing was deleted, no journal row exists, and the VM comes back
as a stopped (``TERMINATED``) VM. The code's own comment says "from outside, a stop and a
delete look the same": then it is not a confirmed termination.

Rule 3: "After terminating an instance it is read again and the group counts as done only
once the instance is shutting down or gone" - that is after OUR call; rule 19: what the
record says went has a journaled call."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.delete_rules import delete_record
from tests.attack.helpers import REF, ZONE, RecordingJournal, gcp_provider, groups_of
from tests.support.gcp_fake import FakeCompute


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "open P3 (SAFETY.md rule 21; a record only): GCP reads STOPPING as a deletion under way, so a VM being"
    " stopped is recorded 'termination confirmed' with no call; nothing is deleted"))
def test_a_vm_being_stopped_is_not_recorded_as_terminated(gcp: FakeCompute) -> None:
    vm = gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm")
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    gcp.set_status("instances", ZONE, "vm", "STOPPING")  # its user stops it (no delete anywhere)

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)
    message = delete_record(group, result=result).message

    assert journal.intents == [] and gcp.get("instances", ZONE, "vm") is not None
    assert vm["id"] not in result.deleted and "termination confirmed" not in message, (
        f"no call was made, yet: status {result.status}, deleted {result.deleted}, record {message!r}")
