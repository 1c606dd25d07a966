"""A4 (P1): GCP's "own boot disk attached at launch" is judged on the disk's CREATION time,
not on when it was attached. ``gcp/operations.py: GcpOperations.blast`` marks an attached
``boot`` disk ``own_device`` when ``attached_at_launch(disk.creationTimestamp,
instance.creationTimestamp)``, an ``abs()`` distance of two minutes (``operations.py:
attached_at_launch``). Any untagged disk created within two minutes of the VM (before or
after it: another team's disk from the same deployment, a disk made for the VM and never
used) that someone swaps in as the boot disk of the stopped VM days later counts as the
VM's own and is deleted along with it (``deletion.py: blast_problem`` lets an untagged
``own_device`` through).

Rule 15: "An untagged volume, disk or interface attached later with the flag set by someone
(a root or boot device swapped on a stopped instance) is not the instance's
(``blast_foreign``)". The rule's GCP wording ("created within two minutes of the instance")
is what the code checks, and it does not tell "attached later" apart; Compute Engine reports
when a disk was attached (``Disk.lastAttachTimestamp``), which is what AWS's check reads
(``Ebs.AttachTime``). Severity P1 (a foreign disk is deleted), narrowed by the creation-time
coincidence it needs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.attack.helpers import REF, ZONE, RecordingJournal, gcp_provider, groups_of
from tests.support.gcp_fake import FakeCompute


def test_a_disk_created_with_the_vm_but_swapped_in_days_later_is_not_own(gcp: FakeCompute) -> None:
    launched = datetime.now(UTC) - timedelta(days=3)
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF}, status="TERMINATED", created=launched)
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", boot=True, auto_delete=True, created=launched)
    # another team's (untagged) disk, created 90 seconds after the VM, used elsewhere since
    gcp.add_disk("team-b-scratch", zone=ZONE, created=launched + timedelta(seconds=90))
    # today someone swaps it in as the stopped VM's boot disk, autoDelete on
    gcp.swap_boot_disk("vm", "team-b-scratch", zone=ZONE, auto_delete=True)
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    assert gcp.get("disks", ZONE, "team-b-scratch") is not None, (
        f"team B's disk, attached as boot days after the VM's launch, went with it: calls {journal.calls()}"
        f" blast {[i['blast'] for i in journal.intents]} (status {result.status})")
    assert "blast_foreign" in {s.reason for s in result.skipped}
