"""The GCP adapter of the provider port: the Compute Engine instances, disks, static
addresses, regional forwarding rules and images (and, past their retention, our snapshots)
of one project.

``backend.account`` is the project id (``settings.project`` overrides it);
``backend.regions`` holds regions (``us-central1``: all its zones, and its regional
addresses) or single zones (``us-central1-a``: that zone, plus the addresses its listed
instances use). Listing is ``listing``'s; deletion is the one algorithm
(``providers.deletion``) over ``operations.GcpOperations``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from google.api_core.retry import Retry

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError, ProviderError
from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind, ResourceState
from orphan_cleanup.providers.deletion import OperationsProvider
from orphan_cleanup.providers.gcp.calls import GcpCalls, read_retry
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.kinds import INSTANCE, parse_time
from orphan_cleanup.providers.gcp.listing import GcpListing
from orphan_cleanup.providers.gcp.operations import GcpOperations
from orphan_cleanup.providers.gcp.places import entry_for, location_of, outside_of
from orphan_cleanup.providers.operations import Live, Target
from orphan_cleanup.providers.ratelimit import DEFAULT_BUDGETS, RateLimits, process_limits

LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_DEFAULT: Any = object()


class GcpProvider(OperationsProvider):
    """``ResourceProvider`` for one GCP backend over injected ``compute_v1`` clients.

    ``timeout`` bounds every call; ``operation_timeout`` bounds waiting for a
    delete operation (then the resource is re-read to confirm). ``retry``
    applies to reads (default: throttling only, see ``read_retry``; ``None``
    disables it). The identity check reads the project itself
    (``projects.get``, permission ``compute.projects.get``) and compares its
    ``name``, the project id.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        instances: Any,
        disks: Any,
        addresses: Any,
        zone_operations: Any,
        region_operations: Any,
        projects: Any,
        snapshots: Any = None,
        global_operations: Any = None,
        forwarding_rules: Any = None,
        images: Any = None,
        timeout: float = 30.0,
        operation_timeout: float = 120.0,
        page_size: int = 500,
        retry: Retry | None = _DEFAULT,
        poll_interval: float = 1.0,
        limits: RateLimits | None = None,
    ) -> None:
        super().__init__(backend)
        if backend.provider != "gcp":
            raise ConfigError(f"backend {backend.id} is not a gcp backend")
        for key in (self.tag_key, *sorted(self.protect_keys)):
            if not LABEL_KEY.fullmatch(key):
                raise ConfigError(f"backend {backend.id}: {key!r} is not a valid GCP label key")
        self.project = backend.settings.project or backend.account
        s = backend.settings
        if (s.snapshot_before_delete or s.retain_snapshots_days is not None) and (
                snapshots is None or global_operations is None):
            raise ConfigError(f"backend {backend.id}: snapshot settings need the snapshots and global operations"
                              " clients")
        self.calls = GcpCalls(
            self.project,
            {"instances": instances, "disks": disks, "addresses": addresses, "projects": projects,
             "snapshots": snapshots, "forwarding_rules": forwarding_rules, "images": images},
            {"zone": zone_operations, "region": region_operations, "global": global_operations},
            timeout=timeout, operation_timeout=operation_timeout, page_size=page_size,
            retry=None, poll_interval=poll_interval, limits=limits,
        )
        self.calls.retry = read_retry(timeout, self.calls.on_throttle) if retry is _DEFAULT else retry

    def reached_account(self) -> str:
        return self.calls.project_name()

    def iter_listing(self) -> Iterator[RegionListing]:
        yield from GcpListing(self.calls, self.backend).regions()

    def group_operations(self, group: ResourceGroup) -> GcpOperations:
        """The group's places belong to the backend's entries (a forged batch may name others)."""
        if (outside := outside_of(tuple(self.backend.regions), group)) is not None:
            raise ProviderError(f"group {group.key} names {outside}, not in a zone or region of backend"
                                f" {self.backend.id}", region=group.region)
        return GcpOperations(self.calls)

    def holds_instance(self, region: str, instance_id: str, ref: str) -> bool:
        """Only in ``region`` (the group's zone), and only a zone of this backend's entries."""
        if not instance_id.isdigit() or entry_for(tuple(self.backend.regions), region) is None:
            return False
        try:
            for page in self.calls.pages(INSTANCE, f"labels.{self.tag_key} = {ref}"):
                for scope, scoped in page.items.items():
                    if location_of(scope) == region and any(
                            str(item.id) == instance_id and dict(item.labels).get(self.tag_key) == ref
                            for item in scoped.instances):
                        return True
        except ProviderError:  # cannot confirm, so no
            return False
        return False

    def holds_volume(self, region: str, volume_id: str, ref: str) -> bool:
        """Only in ``region`` (the group's zone), and only a zone of this backend's entries."""
        if not volume_id.isdigit() or entry_for(tuple(self.backend.regions), region) is None:
            return False
        try:
            live = GcpOperations(self.calls).read([Target(ResourceKind.DISK, volume_id, region)])[volume_id]
        except ProviderError:  # cannot confirm, so no
            return False
        return isinstance(live, Live) and live.tags.get(self.tag_key) == ref \
            and live.state not in (ResourceState.TERMINATING, ResourceState.TERMINATED)

    def instance_created_at(self, instance: Resource) -> datetime | None:
        """The instance read by its numeric id in the zone it was listed in; its
        ``creationTimestamp``, as the listing reads it."""
        if entry_for(tuple(self.backend.regions), instance.region) is None:
            raise ProviderError(f"instance {instance.id} is in {instance.region!r}, not a zone of backend"
                                f" {self.backend.id}", region=instance.region)
        target = Target(ResourceKind.INSTANCE, instance.id, instance.region)
        found = GcpOperations(self.calls).read([target])[instance.id]
        if not isinstance(found, Live):  # gone, or not answered for: the deleter skips its group
            return None
        return parse_time(getattr(found.item, "creation_timestamp", "") or "")


# --- composition ---------------------------------------------------------------------


def build_gcp_provider(backend: Backend, *, endpoint: str | None = None, timeout: float = 30.0,
                       limits: RateLimits | None = None) -> GcpProvider:
    """Build a ``GcpProvider`` with real ``compute_v1`` clients (see ``build_gcp_clients``);
    ``limits``: the request budgets (default: the process's, at the default rates)."""
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=endpoint), timeout=timeout,
                       limits=limits if limits is not None else process_limits(DEFAULT_BUDGETS))
