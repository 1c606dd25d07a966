"""P3 findings: the result the deleter records says something other than what happened.

F7: GCP refuses ``instances.delete`` because something outside the group uses the VM (a target
instance, a backend service: ``resourceInUseByAnotherResource``). ``delete_group`` turns that
``DependencyNotReady`` into ``DELETING`` with every member pending, so the cycle records
"deleting ...: owner termination confirmed, dependents follow" for a VM that was refused, every
cycle, instead of ``in_use`` (rule 21: "something outside the group uses it ... is in_use").

F8: an EC2 ``InvalidInstanceID.NotFound`` for an orphan instance that was listed and exists
(an eventual-consistency answer) makes the deletion report the VM ``deleted`` with no
``TerminateInstances`` call: the VM keeps running, the result, the orphan row and the digest
say it went. ``operations``' own docstring says a NotFound "is not proof (an instance launched
moments ago)"; for the group's own owner it is taken as proof."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.delete_rules import delete_record
from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import EAST, REF, ZONE, RecordingJournal, aws_provider, ec2, gcp_provider, groups_of, spec
from tests.support.aws_proxy import AwsProxy, Rule
from tests.support.gcp_fake import FakeCompute


def test_gcp_vm_in_use_by_something_outside_is_in_use_not_deleting(gcp: FakeCompute) -> None:
    gcp.add_instance("vm", zone=ZONE, labels={"provider_ref": REF})
    gcp.add_disk("vm-data", zone=ZONE, labels={"provider_ref": REF}, attached_to="vm")
    provider = gcp_provider(gcp)
    [group] = groups_of(provider)
    gcp.add_fault("DELETE", f"/zones/{ZONE}/instances/vm", status=400, reason="resourceInUseByAnotherResource")

    result = provider.delete_resource_group(group, RecordingJournal())
    message = delete_record(group, result=result).message

    assert gcp.get("instances", ZONE, "vm") is not None  # nothing went
    assert "termination confirmed" not in message, f"{result.status}: {message!r}"
    assert any(s.reason == "in_use" for s in result.skipped)


@pytest.mark.usefixtures("moto_reset")
def test_aws_not_found_for_a_running_orphan_is_not_a_deletion(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               Placement={"AvailabilityZone": f"{EAST}a"},
                               TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]["InstanceId"]
    body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InvalidInstanceID.NotFound"
            f"</Code><Message>The instance ID '{iid}' does not exist</Message></Error></Errors>"
            "<RequestID>x</RequestID></Response>").encode()
    with AwsProxy(moto_reset) as proxy:
        provider = aws_provider(proxy.url)
        [group] = [g for g in groups_of(provider) if g.primary_id == iid]
        proxy.add_rule(Rule("DescribeInstances", match=lambda b: iid.encode() in b, times=1,
                            reply=(400, [("Content-Type", "text/xml")], body)))
        journal = RecordingJournal()
        result = provider.delete_resource_group(group, journal)

    state = client.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert not (result.status is DeleteStatus.DELETED and state == "running"), \
        f"reported {result.status} (deleted={result.deleted}), journal {journal.calls()}, instance {state}"
