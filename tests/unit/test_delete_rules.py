"""SAFETY.md rule 14, as ``delete_rules`` decides it: a protection an orphan row remembers
(AWS termination protection, which no listing shows) survives every end of a deletion
but a deletion. The ledger only writes the decision (``LockedCycle.record_delete``)."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.delete_rules import delete_record, keeps_protection
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.verdicts import Action, DeleteResult, DeleteStatus

REF = "abcdefgh1234"
GROUP = ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1", resources=(
    Resource(kind=ResourceKind.INSTANCE, id="i-1", region="us-east-1", tags={"provider_ref": REF}),))
PROTECTED = DeleteResult(status=DeleteStatus.PROTECTED, protection="termination_protection",
                         protection_detail="i-1 has disableApiTermination")

# (the deletion's end, delete_record's keywords, the orphan row's state, its protection kept)
ENDS = [
    ("deleted", {"result": DeleteResult(status=DeleteStatus.DELETED, deleted=("i-1",))}, "deleted", False),
    ("deleting: the owner terminated", {"result": DeleteResult(status=DeleteStatus.DELETING, deleted=("i-1",))},
     "deleting", False),
    ("skipped by the provider's re-read", {"result": DeleteResult(status=DeleteStatus.SKIPPED)}, "open", True),
    ("the protection found again", {"result": PROTECTED}, "protected", True),
    ("the re-read failed", {"error": "boom"}, "delete_failed", True),
    ("the region tripped", {"error": "timeout", "trip_region": True}, "delete_failed", True),
    ("left in place: the owner changed", {"skipped_reason": "owner_changed:owner_pending"}, "open", True),
    ("left in place: the backend was switched off", {"skipped_reason": "backend_off"}, "open", True),
    ("left in place: the plan was declined", {"skipped_reason": "delete_declined"}, "open", True),
]


@pytest.mark.parametrize(("kwargs", "orphan_state", "kept"), [e[1:] for e in ENDS], ids=[e[0] for e in ENDS])
def test_only_a_deletion_ends_a_remembered_protection(kwargs, orphan_state, kept):
    rec = delete_record(GROUP, **kwargs)

    assert (rec.orphan_state, rec.keeps_protection) == (orphan_state, kept)


@pytest.mark.parametrize(("action", "kept"), [(Action.DELETED, False), (Action.DELETING, False),
                                              (Action.REPORTED, True), (Action.DELETE_FAILED, True),
                                              (Action.NONE, True)])
def test_keeps_protection_by_action(action, kept):
    assert keeps_protection(action) is kept
