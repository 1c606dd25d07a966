"""F5 (P1/P2): a persistent spot request is cancelled BEFORE the instance's termination
protection is known. With a delete role that may not read ``disableApiTermination`` (a
configuration the code supports: "falls back to TerminateInstances' own refusal"), the
deletion cancels the protected instance's persistent request, then ``TerminateInstances``
answers ``OperationNotPermitted`` and the group is reported ``protected``: a protected
group was changed (its request, which relaunches it after an interruption, is gone for
good), and the cancel is reported inside a "protected, left in place" result.

Rule 14: a resource that carries termination protection "is protected and reported, not
deleted"; rule 15: "nothing outside the group is changed to make the group deletable" (here
something inside a group that must not be touched at all). The cancel must come after the
last thing that can reveal a protection, or a protection that cannot be read must stop it."""

from __future__ import annotations

import pytest

from orphan_cleanup.core.verdicts import DeleteStatus
from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of, spec
from tests.support.aws_proxy import AwsProxy, Rule

pytestmark = pytest.mark.usefixtures("moto_reset")

DENIED = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>UnauthorizedOperation</Code>"
          b"<Message>You are not authorized to perform this operation.</Message></Error></Errors>"
          b"<RequestID>x</RequestID></Response>")


def test_protected_spot_instance_keeps_its_persistent_request(moto_reset: str) -> None:
    client = ec2(moto_reset)
    req = client.request_spot_instances(
        Type="persistent", InstanceCount=1,
        LaunchSpecification={"ImageId": "ami-12345678", "InstanceType": "t3.micro",
                             "Placement": {"AvailabilityZone": f"{EAST}a"}},
        TagSpecifications=spec("spot-instances-request", {"provider_ref": REF}))["SpotInstanceRequests"][0]
    rid = req["SpotInstanceRequestId"]
    iid = client.describe_spot_instance_requests(SpotInstanceRequestIds=[rid])["SpotInstanceRequests"][0]["InstanceId"]
    client.create_tags(Resources=[iid], Tags=[{"Key": "provider_ref", "Value": REF}])
    client.modify_instance_attribute(InstanceId=iid, DisableApiTermination={"Value": True})

    with AwsProxy(moto_reset) as proxy:
        # the delete role may not read the attribute (the supported fallback: TerminateInstances refuses)
        proxy.add_rule(Rule("DescribeInstanceAttribute", reply=(403, [("Content-Type", "text/xml")], DENIED)))
        # moto leaves SpotInstanceRequestId out of its instances; EC2 shows it on every spot instance
        tag = f"<instanceId>{iid}</instanceId>".encode()
        proxy.add_rule(Rule("DescribeInstances", rewrite=lambda body: body.replace(
            tag, tag + f"<spotInstanceRequestId>{rid}</spotInstanceRequestId>".encode())))
        provider = aws_provider(proxy.url)
        [group] = [g for g in groups_of(provider) if g.primary_id == iid]
        assert rid in group.resource_ids()
        journal = RecordingJournal()
        result = provider.delete_resource_group(group, journal)

    # never probed with a terminate after changing something: the group is left, unchanged
    assert result.status is DeleteStatus.SKIPPED
    assert ("instance", iid, "protection_unreadable") in {(s.kind.value, s.id, s.reason) for s in result.skipped}
    left = client.describe_spot_instance_requests(
        Filters=[{"Name": "spot-instance-request-id", "Values": [rid]}])["SpotInstanceRequests"]
    assert ("ec2:CancelSpotInstanceRequests", rid) not in journal.calls(), \
        f"request {rid} of a protected instance was cancelled (left: {left});" \
        f" result.cancelled={result.cancelled_requests}"
    assert left and left[0]["State"] != "cancelled"
