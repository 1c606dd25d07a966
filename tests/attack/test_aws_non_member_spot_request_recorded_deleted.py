"""B4 (P3 misleading record): a deletion's result names as DELETED a resource that is not a
member of the group. ``deletion.py: _Run._delete_first`` cancels the owner's persistent spot
request whether or not the group lists it (a ref tag and no protect tag suffice) and, on
success, names it ``deleted`` only ``if replacement.id in self.targets``. But the new
``deletion.py: _Run._delete_call`` appends ``live.id`` to ``deleted`` unconditionally when a
later part of the call fails (``aws/operations.py: AwsOperations.delete`` confirms the cancel
by ``_read_request(confirming=True)``); ``delete_group`` then returns
``_Run.interrupted`` with a ``deleted`` that holds the non-member request, and
``cycle/deleter.py: Deleter._delete`` records it (the ``delete_requests.result`` / event
details of a group that never contained it).

Rule 12/19: the record of a deletion keeps what the deletion learnt about ITS group; a
result's ``deleted`` is read as the group's members that went (``ledger/locked.py:
record_delete`` tests ``group.primary_id in result.deleted``)."""

from __future__ import annotations

import threading

import pytest

from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of
from tests.support.aws_proxy import AwsProxy, Rule

pytestmark = pytest.mark.usefixtures("moto_reset")

FAILED = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InternalError</Code>"
          b"<Message>An internal error has occurred</Message></Error></Errors><RequestID>x</RequestID></Response>")


def test_a_spot_request_outside_the_group_is_never_named_deleted(moto_reset: str) -> None:
    client = ec2(moto_reset)
    req = client.request_spot_instances(
        Type="persistent", InstanceCount=1,
        LaunchSpecification={"ImageId": "ami-12345678", "InstanceType": "t3.micro",
                             "Placement": {"AvailabilityZone": f"{EAST}a"}})["SpotInstanceRequests"][0]
    rid = req["SpotInstanceRequestId"]
    iid = client.describe_spot_instance_requests(SpotInstanceRequestIds=[rid])["SpotInstanceRequests"][0]["InstanceId"]
    client.create_tags(Resources=[iid], Tags=[{"Key": "provider_ref", "Value": REF}])

    cancelled = threading.Event()
    with AwsProxy(moto_reset) as proxy:
        tag = f"<instanceId>{iid}</instanceId>".encode()
        proxy.add_rule(Rule("DescribeInstances", rewrite=lambda body: body.replace(
            tag, tag + f"<spotInstanceRequestId>{rid}</spotInstanceRequestId>".encode())))
        provider = aws_provider(proxy.url)
        [group] = [g for g in groups_of(provider) if g.primary_id == iid]
        assert rid not in group.resource_ids()  # the request was not listed with it (no ref tag then)
        # the platform tags the request with the ref after the listing
        client.create_tags(Resources=[rid], Tags=[{"Key": "provider_ref", "Value": REF}])
        proxy.add_rule(Rule("CancelSpotInstanceRequests", rewrite=lambda b: (cancelled.set(), b)[1]))
        proxy.add_rule(Rule("DescribeSpotInstanceRequests", match=lambda b: cancelled.is_set(),
                            reply=(500, [("Content-Type", "text/xml")], FAILED)))
        journal = RecordingJournal()
        result = provider.delete_resource_group(group, journal)

    assert ("ec2:CancelSpotInstanceRequests", rid) in journal.calls()  # the set-up reached the confirm
    members = set(group.resource_ids())
    outside = [i for i in result.deleted if i not in members]
    assert outside == [], (f"result of group {sorted(members)} names {outside} deleted (status {result.status},"
                           f" error {result.error!r})")
