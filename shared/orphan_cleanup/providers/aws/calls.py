"""The EC2 (and ELBv2) calls of one region: every call's errors translated (an error code that means
"already gone" answered as None), every mutating call journaled (SAFETY.md rule 19).
``operations`` decides what to call; this module only calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from orphan_cleanup.core.errors import ProviderError
from orphan_cleanup.core.journal import Journal, journaled
from orphan_cleanup.providers.aws.errors import SDK_ERRORS, error_code, translate_error

Item = Mapping[str, Any]

#: The calls that change something, as the journal names them (their IAM action).
MUTATING = {
    "terminate_instances": "ec2:TerminateInstances", "cancel_spot_instance_requests": "ec2:CancelSpotInstanceRequests",
    "delete_volume": "ec2:DeleteVolume", "detach_network_interface": "ec2:DetachNetworkInterface",
    "delete_network_interface": "ec2:DeleteNetworkInterface", "disassociate_address": "ec2:DisassociateAddress",
    "release_address": "ec2:ReleaseAddress", "delete_security_group": "ec2:DeleteSecurityGroup",
    "create_snapshot": "ec2:CreateSnapshot", "delete_snapshot": "ec2:DeleteSnapshot",
    "delete_launch_template": "ec2:DeleteLaunchTemplate", "delete_key_pair": "ec2:DeleteKeyPair",
    "delete_placement_group": "ec2:DeletePlacementGroup",
    "delete_load_balancer": "elasticloadbalancing:DeleteLoadBalancer",
    "delete_target_group": "elasticloadbalancing:DeleteTargetGroup",
}


class Refused(Exception):
    """A call answered with one of its ``refused`` codes (the code is the message)."""


class Ec2Calls:
    """One region's client of one service: EC2's, or ELBv2's (the same calls' contract)."""

    def __init__(self, ec2: Any, *, region: str) -> None:
        self.ec2 = ec2
        self.region = region

    def call(self, method: str, gone: frozenset[str], *, refused: frozenset[str] = frozenset(),
             target: str | None = None, blast: Sequence[str] = (), journal: Journal | None = None,
             **params: Any) -> Mapping[str, Any] | None:
        """One EC2 call; None when its error code says the target is already gone,
        ``Refused`` (the code) when it is one of ``refused``. A mutating call (``MUTATING``)
        names its ``target`` and what the provider deletes along with it (``blast``), and
        is journaled in ``journal``: no intent row, no call."""
        api = MUTATING.get(method)
        if api is None:
            return self._call(method, gone, refused, params)
        if target is None or journal is None:
            raise ProviderError(f"{method} without a target and a journal", region=self.region)
        with journaled(journal, api, target, region=self.region, blast=blast) as entry:
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
