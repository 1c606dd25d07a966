"""B2 (P1, latent: needs a reply without ``lastAttachTimestamp``): the round-2 fix of "GCP boot
disk judged on creation time" fails OPEN when the disk's ``lastAttachTimestamp`` is missing.
``gcp/operations.py: own_boot_disk`` returns ``attached_at_launch(created, launched) and (not
last_attached or attached_at_launch(last_attached, launched))``: an absent (or empty) attach
time counts as "attached at launch". An untagged disk created within two minutes of the VM
and swapped in as its boot disk (``autoDelete``) days later is then the VM's "own device"
(``deletion.py: blast_problem`` lets an untagged ``own_device`` through) and
``instances.delete`` deletes it along with the VM, whenever the read of that disk carries no
attach time (a field the API's schema marks optional, an API version that leaves it out).

Rule 15: the boot disk must be "created and last attached (``lastAttachTimestamp``) within two
minutes of the instance's creation"; a time that cannot be read cannot show that. Rule 1:
"Everything fails closed: ... an unexpected reply shape ... means skip", as
``operations.py: attached_at_launch`` itself does for an unreadable time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.attack.helpers import REF, ZONE, RecordingJournal, gcp_provider, groups_of
from tests.support.gcp_fake import FakeCompute


def test_a_swapped_in_boot_disk_without_an_attach_time_is_not_own(gcp: FakeCompute) -> None:
    launched = datetime.now(UTC) - timedelta(days=3)
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF}, status="TERMINATED", created=launched)
    gcp.add_disk("vm-boot", zone=ZONE, attached_to="vm", boot=True, auto_delete=True, created=launched)
    gcp.add_disk("team-b-scratch", zone=ZONE, created=launched + timedelta(seconds=90))
    gcp.swap_boot_disk("vm", "team-b-scratch", zone=ZONE, auto_delete=True)
    # the read of the swapped-in disk carries no attach time
    gcp.set_field("disks", ZONE, "team-b-scratch", "lastAttachTimestamp", ...)
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    assert gcp.get("disks", ZONE, "team-b-scratch") is not None, (
        f"team B's disk, attached days after launch (attach time unreadable), went with the VM: calls"
        f" {journal.calls()} blast {[i['blast'] for i in journal.intents]} (status {result.status})")
    assert "blast_foreign" in {s.reason for s in result.skipped}
