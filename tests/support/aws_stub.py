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
