"""K1: a launch template of an orphan ref that an Auto Scaling group outside the group launches
from (scaled to zero, or between launches: no instance of the ref names it, so the listing puts
the template in its ref's primary-less group) is deleted. The ASG is left pointing at a template
that no longer exists: its next scale-out fails ("The specified launch template ... does not
exist"). Nothing in ``aws/operations.py: AwsOperations.ready`` asks who else uses a launch
template (a key pair neither); only the placement group has ``instances_filter``.

Rule 21: "A resource something outside the group uses (...) is ``in_use``: left alone"; rule 15:
"nothing outside the group is changed to make the group deletable"; rule 14: never fight another
controller (an ASG). Rule 15's launch-template paragraph only says "an instance launched from
or with them keeps running": it does not cover a controller that launches from it next.

Fixed: before a launch template or target group goes, the deleter reads the region's Auto Scaling
groups (``AwsOperations._scaling_groups_use``: launch template by id or name, mixed instances
policies and overrides; target group ARNs) and leaves it ``in_use`` when one uses it."""

from __future__ import annotations

import boto3
import pytest

from orphan_cleanup.core.listing import ResourceKind
from tests.attack.helpers import EAST, REF, RecordingJournal, aws_provider, ec2, groups_of, spec

pytestmark = pytest.mark.usefixtures("moto_reset")


def test_launch_template_an_asg_uses_is_left_in_use(moto_reset: str) -> None:
    client = ec2(moto_reset)
    lt = client.create_launch_template(
        LaunchTemplateName="platform-web", LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "t3.micro"},
        TagSpecifications=spec("launch-template", {"provider_ref": REF}))["LaunchTemplate"]["LaunchTemplateId"]
    # someone's Auto Scaling group (not ours: no ref tag) launches from that template, scaled to zero
    asg = boto3.client("autoscaling", region_name=EAST, endpoint_url=moto_reset)
    asg.create_auto_scaling_group(AutoScalingGroupName="team-web", MinSize=0, MaxSize=3, DesiredCapacity=0,
                                  LaunchTemplate={"LaunchTemplateId": lt, "Version": "$Latest"},
                                  AvailabilityZones=[f"{EAST}a"])

    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id is None and [(r.kind, r.id) for r in group.resources] == [(ResourceKind.LAUNCH_TEMPLATE, lt)]

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    used_by = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["team-web"])["AutoScalingGroups"][0]
    assert used_by["LaunchTemplate"]["LaunchTemplateId"] == lt
    left = client.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": ["platform-web"]}])
    assert left["LaunchTemplates"], (
        f"launch template {lt}, which Auto Scaling group team-web launches from, was deleted"
        f" (calls {journal.calls()}, status {result.status})")
    assert any(s.id == lt and s.reason == "in_use" for s in result.skipped)


def test_target_group_an_asg_registers_into_is_left_in_use(moto_reset: str) -> None:
    client = ec2(moto_reset)
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    elb = boto3.client("elbv2", region_name=EAST, endpoint_url=moto_reset)
    tg = elb.create_target_group(Name="platform-tg", Protocol="HTTP", Port=80, VpcId=vpc, TargetType="instance",
                                 Tags=[{"Key": "provider_ref", "Value": REF}])["TargetGroups"][0]["TargetGroupArn"]
    client.create_launch_template(LaunchTemplateName="team-lt",
                                  LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "t3.micro"})
    asg = boto3.client("autoscaling", region_name=EAST, endpoint_url=moto_reset)
    asg.create_auto_scaling_group(AutoScalingGroupName="team-web", MinSize=0, MaxSize=3, DesiredCapacity=0,
                                  LaunchTemplate={"LaunchTemplateName": "team-lt", "Version": "$Latest"},
                                  TargetGroupARNs=[tg], AvailabilityZones=[f"{EAST}a"])

    provider = aws_provider(moto_reset)
    [group] = groups_of(provider)
    assert group.primary_id is None and [(r.kind, r.id) for r in group.resources] == [(ResourceKind.TARGET_GROUP, tg)]

    journal = RecordingJournal()
    result = provider.delete_resource_group(group, journal)

    used_by = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["team-web"])["AutoScalingGroups"][0]
    assert used_by["TargetGroupARNs"] == [tg]
    left = [g["TargetGroupArn"] for g in elb.describe_target_groups()["TargetGroups"]]
    assert tg in left, (f"target group {tg}, which Auto Scaling group team-web registers its instances in, was"
                        f" deleted (calls {journal.calls()}, status {result.status})")
