"""Spot instances and their requests: what must happen before a spot instance is
terminated. Pure reads of reply items; the calls are ``operations``'.

A ``persistent`` request whose instance is terminated launches a replacement, so it is
cancelled first; a ``one-time`` request (or one already ``cancelled``/``closed``) needs
nothing. Anything this module cannot read as one of those raises ``ProviderError``: the
instance is not terminated and the group is not done (SAFETY.md rules 1 and 14).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orphan_cleanup.core.errors import ProviderError

Item = Mapping[str, Any]
#: Final request states: nothing is launched from the request again.
FINAL_STATES = frozenset({"cancelled", "closed"})
#: ``InstanceLifecycle`` values of instances that no spot request launched.
_NOT_FROM_A_REQUEST = frozenset({"scheduled", "capacity-block"})


def request_of(instance: Item, *, region: str) -> str | None:
    """The id of the spot request that launched ``instance``, or None when none did
    (on-demand: no ``InstanceLifecycle``). A spot instance without a readable request id,
    or a lifecycle this code does not know, is ``ProviderError`` (fail closed)."""
    lifecycle = instance.get("InstanceLifecycle")
    request_id = instance.get("SpotInstanceRequestId")
    iid = instance.get("InstanceId")
    if request_id is None and (lifecycle is None or lifecycle in _NOT_FROM_A_REQUEST):
        return None
    if lifecycle not in (None, "spot") or not isinstance(request_id, str) or not request_id:
        raise ProviderError(f"instance {iid} has InstanceLifecycle {lifecycle!r} and SpotInstanceRequestId"
                            f" {request_id!r}: cannot tell whether a request would replace it", region=region)
    return request_id


def must_cancel(request: Item, *, region: str) -> bool:
    """Would this request launch a replacement of its terminated instance? True for a
    ``persistent`` request in any state but a final one (``open``, ``active``,
    ``disabled``, unknown); False for ``one-time`` or a final state. ``ProviderError``
    when neither can be read (a missing or unknown ``Type``)."""
    state, kind = request.get("State"), request.get("Type")
    if isinstance(state, str) and state in FINAL_STATES:
        return False
    if kind == "one-time":
        return False
    if kind == "persistent":
        return True
    raise ProviderError(f"spot request {request.get('SpotInstanceRequestId')} has Type {kind!r} and State"
                        f" {state!r}: neither one-time nor cancelled", region=region)


def is_final(request: Item | None) -> bool:
    """A cancel confirmed: the request is gone or in a final state."""
    return request is None or request.get("State") in FINAL_STATES
