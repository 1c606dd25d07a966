"""What moto (5.2.5, in server mode in this process: the demo's, the tests' and the bench's EC2)
does not do as EC2 documents it, added while ``filled()`` is open: each patch follows the EC2 API
reference, and the product's code runs unchanged against it. Without them the listing fails on
moto (``DescribePlacementGroups`` is not implemented there) and a key pair deleted by its id stays.
Nothing here decides what the product does; it only lets moto answer a call EC2 answers.

Key pairs by id
    moto reads ``KeyName`` only: ``DeleteKeyPair(KeyPairId=...)`` deletes nothing (and answers
    ``Return: true``), ``DescribeKeyPairs(KeyPairIds=[...])`` answers every key pair. EC2 deletes
    the key pair of that id, and describes only the ids asked for (``InvalidKeyPair.NotFound``
    for one that does not exist).

Placement groups
    moto has no placement groups at all (``CreatePlacementGroup``, ``DescribePlacementGroups``
    and ``DeletePlacementGroup`` raise ``NotImplementedError``; ``RunInstances`` ignores
    ``Placement.GroupName``; ``DescribeInstances`` has no ``placement-group-name`` filter). This
    adds the minimum, as the EC2 API reference describes it: a group has an id (``pg-...``), a
    name unique in its region, a strategy, ``State`` ``available`` and tags; ``DescribePlacementGroups``
    answers ``GroupIds``, ``GroupNames`` (``InvalidPlacementGroup.Unknown`` for one that does not
    exist) and the ``group-name``, ``tag-key`` and ``tag:KEY`` filters; ``DeletePlacementGroup`` takes
    the name and answers ``InvalidPlacementGroup.InUse`` while an instance that is not terminated is
    in the group; ``RunInstances`` puts the instance in the group it names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import moto.ec2.utils as moto_ec2_utils
from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError, InvalidKeyPairNameError
from moto.ec2.responses import EC2Response
from moto.ec2.responses.instances import InstanceResponse
from moto.ec2.responses.key_pairs import KeyPairs
from moto.ec2.utils import generic_filter, random_id


def _key_pairs_by_id(patches: ExitStack) -> None:
    """``DeleteKeyPair`` and ``DescribeKeyPairs`` by ``KeyPairId`` as EC2 answers them."""
    delete_by_name, describe_by_name = KeyPairs.delete_key_pair, KeyPairs.describe_key_pairs

    def delete_key_pair(self: Any) -> ActionResult:
        key_id = self._get_param("KeyPairId")
        if not key_id:
            return delete_by_name(self)
        self.error_on_dryrun()
        names = [k.key_name for k in self.ec2_backend.key_pairs.values() if k.id == key_id]
        for name in names:
            self.ec2_backend.delete_key_pair(name)
        return ActionResult({"Return": True, **({"KeyPairId": key_id} if names else {})})

    def describe_key_pairs(self: Any) -> ActionResult:
        ids = self._get_param("KeyPairIds", [])
        if not ids:
            return describe_by_name(self)
        found = [k for k in self.ec2_backend.key_pairs.values() if k.id in ids]
        missing = sorted(set(ids) - {k.id for k in found})
        if missing:
            raise InvalidKeyPairNameError(missing)
        filters = self._filters_from_querystring()
        self._exclude_from_response("DescribeKeyPairsResult.KeyPairs.KeyPairInfo.PublicKey")
        return ActionResult({"KeyPairs": generic_filter(filters, found) if filters else found})

    patches.enter_context(mock.patch.object(KeyPairs, "delete_key_pair", delete_key_pair))
    patches.enter_context(mock.patch.object(KeyPairs, "describe_key_pairs", describe_key_pairs))


def _groups(backend: Any) -> dict[str, dict[str, Any]]:
    """The placement groups of one moto EC2 backend (account and region), by name; a moto reset
    makes new backends, so it forgets them too."""
    if not hasattr(backend, "_placement_groups"):
        backend._placement_groups = {}
    return backend._placement_groups  # type: ignore[no-any-return]


def _unknown(name: str) -> EC2ClientError:
    return EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")


def _matches(group: dict[str, Any], filters: dict[str, list[str]]) -> bool:
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    for name, values in filters.items():
        if name == "group-name":
            ok = group["GroupName"] in values
        elif name == "tag-key":
            ok = any(k in tags for k in values)
        elif name.startswith("tag:"):
            ok = name[4:] in tags and (tags[name[4:]] in values or "*" in values)
        else:
            raise NotImplementedError(f"moto_gaps: placement group filter {name!r}")
        if not ok:
            return False
    return True


def _placement_groups(patches: ExitStack) -> None:
    """Placement groups on the moto server, as the module docstring says."""
    run_instances = InstanceResponse.run_instances

    def create_placement_group(self: Any) -> ActionResult:
        name = self._get_param("GroupName")
        groups = _groups(self.ec2_backend)
        if name in groups:
            raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
        tags = self._parse_tag_specification("placement-group").get("placement-group", {})
        groups[name] = {"GroupName": name, "GroupId": random_id("pg"), "State": "available",
                        "Strategy": self._get_param("Strategy") or "cluster",
                        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        return ActionResult({"PlacementGroup": groups[name]})

    def describe_placement_groups(self: Any) -> ActionResult:
        groups = _groups(self.ec2_backend)
        names, ids = self._get_param("GroupNames", []), self._get_param("GroupIds", [])
        for name in names:
            if name not in groups:
                raise _unknown(name)
        by_id = {g["GroupId"]: g for g in groups.values()}
        for group_id in ids:
            if group_id not in by_id:
                raise _unknown(group_id)
        found = [groups[n] for n in names] + [by_id[i] for i in ids] if names or ids else list(groups.values())
        filters = self._filters_from_querystring()
        return ActionResult({"PlacementGroups": [g for g in found if _matches(g, filters)]})

    def delete_placement_group(self: Any) -> ActionResult:
        name = self._get_param("GroupName")
        groups = _groups(self.ec2_backend)
        if name not in groups:
            raise _unknown(name)
        inside = [i.id for i in self.ec2_backend.all_instances()
                  if i.placement.group_name == name and i.state != "terminated"]
        if inside:
            raise EC2ClientError("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use"
                                 f" by {', '.join(inside)}.")
        del groups[name]
        return ActionResult({})

    def run_instances_in_group(self: Any) -> ActionResult:
        name = self._get_param("Placement.GroupName")
        if name and name not in _groups(self.ec2_backend):
            raise _unknown(name)
        result = run_instances(self)
        for instance in result.result.instances if name else ():  # type: ignore[attr-defined]
            instance.placement.group_name = name
        return result

    for name, method in (("create_placement_group", create_placement_group),
                         ("describe_placement_groups", describe_placement_groups),
                         ("delete_placement_group", delete_placement_group)):
        patches.enter_context(mock.patch.object(EC2Response, name, method, create=True))
    patches.enter_context(mock.patch.object(InstanceResponse, "run_instances", run_instances_in_group))
    patches.enter_context(mock.patch.dict(moto_ec2_utils.filter_dict_attribute_mapping,
                                          {"placement-group-name": "placement.group_name"}))


@contextmanager
def filled() -> Iterator[None]:
    """moto's EC2 with the gaps of the module docstring filled, until the block ends."""
    with ExitStack() as patches:
        _key_pairs_by_id(patches)
        _placement_groups(patches)
        yield
