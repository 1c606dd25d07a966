"""``settings.controller_tag_keys`` (SAFETY.md rule 14): the AWS tag keys naming a
controller, defaults and validation."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from orphan_cleanup.core.backends import DEFAULT_CONTROLLER_TAG_KEYS, Backend, BackendSettings


def test_the_defaults_name_asg_node_group_and_fleets() -> None:
    assert BackendSettings().controller_tag_keys == DEFAULT_CONTROLLER_TAG_KEYS == (
        "aws:autoscaling:groupName", "eks:nodegroup-name", "aws:ec2:fleet-id", "aws:ec2spot:fleet-request-id")


@pytest.mark.parametrize("value", [["team:controller"], [], ("a", "b")])
def test_a_list_of_keys_is_kept(value: Any) -> None:
    assert BackendSettings.from_input({"controller_tag_keys": value}).controller_tag_keys == tuple(value)


@pytest.mark.parametrize("value", ["aws:autoscaling:groupName", [""], ["  "], [None], [7], {"k": 1}, None,
                                   ["x" * 129]])
def test_anything_else_is_refused(value: Any) -> None:
    with pytest.raises(ValidationError, match="controller_tag_keys"):
        BackendSettings.model_validate({"controller_tag_keys": value})


def test_the_keys_are_part_of_the_listing_key() -> None:
    a = Backend(id="a", provider="aws", account="123456789012", regions=("us-east-1",))
    b = a.model_copy(update={"settings": BackendSettings(controller_tag_keys=())})
    assert a.listing_key != b.listing_key
