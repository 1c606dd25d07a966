"""A3 (P1): an AWS instance that a controller took over after the deleter's first read is
terminated anyway. ``deletion.py: _Run.owner_step`` asks ``ops.protection`` (the controller
tags, ``disableApiTermination``) on the owner's FIRST read only; ``_Run._judged_again``, the
read right before ``TerminateInstances`` that the call "acts on", re-judges only
``not_ours`` (protect tag, ref) and the blast, never the controller tags. An Auto Scaling
group that ``AttachInstances`` the VM meanwhile (it tags it ``aws:autoscaling:groupName``)
sees its instance terminated and launches a replacement: the deleter fights a controller.

Rule 14: "never fight another controller ... The delete's re-read checks both again".
GCP does it (``gcp/operations.py: _judged`` compares ``metadata`` items, ``created-by``
included, on the ``get`` right before the call); AWS does not."""

from __future__ import annotations

from typing import Any

import pytest

from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_asg_tag_added_before_the_final_read_stops_terminate(moto_reset: str) -> None:
    client = ec2(moto_reset)
    iid = client.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="t3.micro",
                               Placement={"AvailabilityZone": f"{EAST}a"},
                               TagSpecifications=spec("instance", {"provider_ref": REF}))["Instances"][0]["InstanceId"]
    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id == iid

    seen = [0]

    def hook(**_: Any) -> None:
        seen[0] += 1
        if seen[0] == 2:  # the final read (``_judged_again``): an ASG attached the instance just before it
            client.create_tags(Resources=[iid], Tags=[{"Key": "aws:autoscaling:groupName", "Value": "web-asg"}])

    provider.ec2(EAST).meta.events.register("before-call.ec2.DescribeInstances", hook)
    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    assert seen[0] >= 2
    assert ("ec2:TerminateInstances", iid) not in journal.calls(), (
        f"{iid}, managed by web-asg in the read TerminateInstances acted on, was terminated (status {result.status})")
