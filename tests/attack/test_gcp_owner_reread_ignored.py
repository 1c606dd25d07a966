"""F3 (P1): GCP's ``delete`` reads the instance by name immediately before ``instances.delete``
(rule 3: "checked against the id by one more read immediately before the call") and looks at
nothing but the id. What the owner's FIRST read saw (labels, deletionProtection, its disks and
their ``autoDelete``) is what the delete is judged on, across every read the deletion makes in
between (every member's list-by-id, the blast's gets). So:

- a protect label added to the VM after that first read (visible in the read right before the
  call) does not stop the delete;
- a disk that is not the group's (another ref's, protected) attached with ``autoDelete`` after
  that first read is deleted along with the VM, and the journal's intent does not name it
  (rule 15: the blast of a call is the group; rule 19: the intent names what goes with it).

The fix is cheap: judge the ``now`` of that last get (labels, protections, the set of
``autoDelete`` disks equal to the judged blast) and refuse on any difference."""

from __future__ import annotations

from tests.attack.helpers import OTHER, PROTECT, REF, ZONE, RecordingJournal, gcp_provider, groups_of, on_gcp_request
from tests.support.gcp_fake import FakeCompute


def orphan_vm_with_data_disk(gcp: FakeCompute) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("vm-boot", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", boot=True, auto_delete=True)
    gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm", auto_delete=False)


def test_protect_label_seen_by_the_last_read_stops_the_delete(gcp: FakeCompute, monkeypatch) -> None:
    orphan_vm_with_data_disk(gcp)
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    assert group.primary_id is not None

    # after the VM's first read, while the deleter reads its members, an operator protects it
    fired = on_gcp_request(monkeypatch, gcp, "GET", f"/zones/{ZONE}/disks", lambda: gcp.set_labels(
        "instances", ZONE, "vm", {"provider_ref": REF, PROTECT: "investigating"}), query_contains="id =")
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    assert fired == [1]
    assert ("compute.instances.delete", group.primary_id) not in journal.calls(), \
        f"a VM carrying {PROTECT} was deleted ({result.status})"
    assert gcp.get("instances", ZONE, "vm") is not None


def test_foreign_disk_attached_with_auto_delete_before_the_call_is_not_deleted(gcp: FakeCompute, monkeypatch) -> None:
    orphan_vm_with_data_disk(gcp)
    foreign = gcp.add_disk("team-b-data", zone=ZONE, labels={"provider_ref": OTHER, PROTECT: "yes"})
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)

    # someone attaches their (protected, other ref's) disk to the VM with autoDelete on
    fired = on_gcp_request(monkeypatch, gcp, "GET", f"/zones/{ZONE}/disks", lambda: gcp.attach_disk(
        "vm", "team-b-data", zone=ZONE, auto_delete=True), query_contains="id =")
    journal = RecordingJournal()
    provider.delete_resource_group(group, journal)

    assert fired == [1]
    blast = [i["blast"] for i in journal.intents if i["call"] == "compute.instances.delete"]
    assert gcp.get("disks", ZONE, "team-b-data") is not None, \
        f"disk {foreign['id']} of {OTHER}, protected, went with the VM; the journaled blast was {blast}"
