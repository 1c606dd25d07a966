"""What the moto server (moto 5.2.5, in this process) does not do as EC2 documents it, added
for the tests that need it, and only for them (a function-scoped ``monkeypatch``): each patch
follows the EC2 API reference, the product's code runs unchanged against it, and a test that
uses one says so. Nothing here decides a test's outcome; it only lets moto answer a call EC2
answers.

``key_pairs_by_id``
    moto reads ``KeyName`` only: ``DeleteKeyPair(KeyPairId=...)`` deletes nothing (and answers
    ``Return: true``), ``DescribeKeyPairs(KeyPairIds=[...])`` answers every key pair. EC2 deletes
    the key pair of that id, and describes only the ids asked for (``InvalidKeyPair.NotFound``
    for one that does not exist).
"""

from __future__ import annotations

from typing import Any

import pytest
from moto.core.responses import ActionResult
from moto.ec2.exceptions import InvalidKeyPairNameError
from moto.ec2.responses.key_pairs import KeyPairs
from moto.ec2.utils import generic_filter


def key_pairs_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
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

    monkeypatch.setattr(KeyPairs, "delete_key_pair", delete_key_pair)
    monkeypatch.setattr(KeyPairs, "describe_key_pairs", describe_key_pairs)
