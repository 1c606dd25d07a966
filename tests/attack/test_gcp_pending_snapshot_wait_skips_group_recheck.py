"""G3 (P1, a race whose window is a snapshot operation's wait): a snapshot that was TAKEN
(``disks.createSnapshot``, its operation waited for) but is not complete yet leaves
``acted_since_read`` unset. ``deletion.py: _Run._delete_dependent`` sets the flag only in
the branch where ``SnapshotStep.ready`` answers True; when it answers False (the snapshot
``CREATING``/``UPLOADING`` after the create's operation: ``snapshots.py: SnapshotStep.ready``
appends it to ``pending``) the disk is "not yet" and the flag stays False, so
``_Run._siblings_still_the_groups`` returns at once for the next member: a protect label
put on the group (on the very disk being snapshotted) during that wait is never read, and
the group's address is deleted.

Rule 3: "A protect tag on any member protects the whole group ... in a group without an
instance (or whose instance is gone) no member is touched"; the module docstring step 6:
each dependent re-read "right before its own call (never across another call's wait)"."""

from __future__ import annotations

from tests.attack.helpers import PROTECT, REF, REGION, ZONE, RecordingJournal, gcp_provider, groups_of
from tests.support.gcp_fake import FakeCompute


def test_protect_label_during_a_pending_snapshot_stops_the_address_delete(gcp: FakeCompute) -> None:
    # an orphan VM with a data disk and a static address (one group); an earlier delete terminated
    # the VM and recorded both as attached to it (``known_attached``): its leftovers now
    gcp.add_instance("vm-1", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("data-1", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm-1")
    gcp.add_address("ip-1", region=REGION, labels={"provider_ref": REF}, attached_to="vm-1")
    provider = gcp_provider(gcp, snapshot_before_delete=True)
    [group] = groups_of(provider)
    assert group.primary_id is not None and len(group.resources) == 3
    gcp.remove("instances", ZONE, "vm-1")  # terminated by the earlier delete: gone now
    members = [r.id for r in group.resources if r.id != group.primary_id]
    gcp.snapshot_status = "CREATING"  # the snapshot is still being uploaded when its operation is done
    # while the disk's snapshot is being taken, the operator protects the group by labelling that disk
    gcp.on_operation("/disks/data-1/createSnapshot",
                     lambda: gcp.set_labels("disks", ZONE, "data-1", {"provider_ref": REF, PROTECT: "keep"}))

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal, known_attached=members)

    calls = journal.calls()
    assert any("createSnapshot" in c for c, _ in calls), calls  # the snapshot was taken (its wait happened)
    assert not any(c == "compute.addresses.delete" for c, _ in calls) and gcp.get("addresses", REGION, "ip-1"), (
        f"data-1 was labelled {PROTECT} (the group protected) during its snapshot's wait; the group's address"
        f" was deleted after that: calls {calls}, status {result.status},"
        f" skipped {[(s.id, s.reason) for s in result.skipped]}, pending {result.pending}")
