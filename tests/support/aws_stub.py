"""An EC2 client whose every reply is stubbed (botocore's ``Stubber``): fixture ``ec2``
yields (client, stubber) and checks at the end that every expected call was made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber


@pytest.fixture
def ec2() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y",
                          endpoint_url="http://ec2.stubbed.invalid")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def stubbed_delete(client: Any, group: Any, *, controller_keys: tuple[str, ...] = (), **kw: Any) -> Any:
    """The one deletion algorithm over the AWS operations of ``client`` (the group's region)."""
    from orphan_cleanup.providers.aws.calls import Ec2Calls
    from orphan_cleanup.providers.aws.operations import AwsOperations
    from orphan_cleanup.providers.deletion import delete_group

    ops = AwsOperations(Ec2Calls(client, region=group.region), controller_keys=controller_keys)
    return delete_group(ops, group, tag_key="provider_ref", protect_keys={"orphan-cleanup-protect"}, **kw)
