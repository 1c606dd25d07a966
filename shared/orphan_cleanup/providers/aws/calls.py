"""The EC2 calls of one group's deletion in one region: every call's errors translated
(an error code that means "already gone" answered as None), every mutating call
journaled (SAFETY.md rule 19), a resource re-read by its id, and whether a re-read item
is still the group's to delete. ``aws_delete`` decides what to call; this module only
calls and reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import NO_JOURNAL, Journal, journaled
from orphan_cleanup.core.listing import ResourceState
from orphan_cleanup.providers.aws.errors import SDK_ERRORS, error_code, translate_error
from orphan_cleanup.providers.aws.kinds import AwsKind, tags_of

Item = Mapping[str, Any]

#: The EC2 calls that change something, as the journal names them.
MUTATING = {
    "terminate_instances": "ec2:TerminateInstances", "cancel_spot_instance_requests": "ec2:CancelSpotInstanceRequests",
    "delete_volume": "ec2:DeleteVolume", "detach_network_interface": "ec2:DetachNetworkInterface",
    "delete_network_interface": "ec2:DeleteNetworkInterface", "disassociate_address": "ec2:DisassociateAddress",
    "release_address": "ec2:ReleaseAddress", "delete_security_group": "ec2:DeleteSecurityGroup",
    "create_snapshot": "ec2:CreateSnapshot", "delete_snapshot": "ec2:DeleteSnapshot",
}


class Refused(Exception):
    """A call answered with one of its ``refused`` codes (the code is the message)."""


class Ec2Calls:
    """One region's EC2 client, for the deletion of the group of ``ref``."""

    def __init__(self, ec2: Any, *, region: str, ref: str, tag_key: str, protect_keys: Iterable[str],
                 journal: Journal = NO_JOURNAL) -> None:
        self.ec2 = ec2
        self.region = region
        self.ref = ref
        self.tag_key = tag_key
        self.protect_keys = frozenset(protect_keys)
        self.journal = journal

    def read(self, spec: AwsKind, resource_id: str) -> Item | None:
        """Re-read one resource by id; None when it is gone (or terminated/deleted)."""
        params: dict[str, Any] = {spec.ids_param: [resource_id]}
        reply = self.call(spec.describe, spec.not_found, **params)
        try:
            items = [it for it in spec.items(reply or {}) if spec.item_id(it) == resource_id]
        except KeyError as exc:  # an item without its id: fail closed, never "gone"
            raise ProviderError(f"{spec.describe} returned an item without {exc}", region=self.region) from exc
        if len(items) > 1:
            raise ProviderError(f"{spec.describe} returned {resource_id} twice", region=self.region)
        if not items or spec.state(items[0]) is ResourceState.TERMINATED:
            return None
        return items[0]

    def foreign(self, spec: AwsKind, item: Item) -> str | None:
        """Why this item is not ours to delete, or None when it is."""
        tags = tags_of(item, spec)
        if not self.protect_keys.isdisjoint(tags):
            return "protected"
        if self.tag_key not in tags:
            return "ref_missing"
        if tags[self.tag_key] != self.ref:
            return "ref_changed"
        return None

    def call(self, method: str, gone: frozenset[str], *, refused: frozenset[str] = frozenset(),
             target: str | None = None, blast: Sequence[str] = (), **params: Any) -> Mapping[str, Any] | None:
        """One EC2 call; None when its error code says the target is already gone,
        ``Refused`` (the code) when it is one of ``refused``. A mutating call (``MUTATING``)
        names its ``target`` and what the provider deletes along with it (``blast``), and
        is journaled: no intent row, no call."""
        api = MUTATING.get(method)
        if api is None:
            return self._call(method, gone, refused, params)
        if target is None:
            raise ProviderError(f"{method} without a target to journal", region=self.region)
        with journaled(self.journal, api, target, region=self.region, blast=blast) as entry:
            try:
                reply = self._call(method, gone, refused, params)
            except Refused:
                entry.outcome = "refused"
                raise
            if reply is None:
                entry.outcome = "gone"
            return reply

    def _call(self, method: str, gone: frozenset[str], refused: frozenset[str],
              params: dict[str, Any]) -> Mapping[str, Any] | None:
        try:
            return getattr(self.ec2, method)(**params)  # type: ignore[no-any-return]
        except SDK_ERRORS as exc:
            if isinstance(exc, ClientError) and error_code(exc) in gone:
                return None
            if isinstance(exc, ClientError) and error_code(exc) in refused:
                raise Refused(error_code(exc)) from exc
            raise translate_error(exc, region=self.region, operation=method) from exc
