"""F9 (P2): a listing batch can be forged (rule 21), and rule 1 says "a group that no adapter
could have produced (...) is ``skipped`` (``malformed_group``)": fail closed, unsettled. The
classifier's ``malformed`` misses the shapes ``deletion.targets_of`` refuses (a kind this
cloud does not list) and the ones the first read refuses (an id that is no Compute Engine id,
a zone where the kind does not live), and those refusals are ``ProviderError``: the deleter
records ``delete_failed``, the cycle FAILS and the backend backs off (retry delay doubling up
to ``max_backoff``). One forged group per cycle keeps the backend failed and its real orphans
waiting; rule 20: "one bad group fails alone ... neither holds the cycle or the backend"."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from orphan_cleanup.core.listing import RegionListing, Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.cycle.runner import run_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.providers.gcp.provider import build_gcp_provider
from orphan_cleanup.queues.memory import InProcessQueue
from tests.attack.helpers import REF, REGION, ZONE
from tests.support.gcp_fake import FakeCompute
from tests.support.ledger_helpers import add_backend, add_instance, cleanup_row


class ForgingProvider:
    """The real provider, whose listing carries one more group, as a forged batch would."""

    def __init__(self, real: Any, forged: ResourceGroup) -> None:
        self._real, self._forged = real, forged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def iter_listing(self) -> Iterator[RegionListing]:
        for region in self._real.iter_listing():
            if region.region == REGION and region.failure is None:
                region = region.model_copy(update={"groups": (*region.groups, self._forged)})
            yield region


def test_a_forged_kind_is_a_skipped_group_not_a_failed_cycle(gcp: FakeCompute, db: Database) -> None:
    long_ago = datetime.now(UTC) - timedelta(days=3)
    add_backend(db, "gcp-attack", provider="gcp", account=gcp.project, regions=(REGION,))
    add_instance(db, ref=REF, status="terminated", backend_id="gcp-attack", primary_id="1", region=ZONE,
                 issued_at=long_ago, created_at=long_ago, provisioned_at=long_ago, terminated_at=long_ago)
    disk = gcp.add_disk("left", zone=ZONE, labels={"provider_ref": REF}, created=long_ago)
    # the real listing shows the disk; the forged batch names the same id with another kind
    forged = ResourceGroup(provider_ref=REF, region=REGION, primary_id=None, resources=(
        Resource(kind=ResourceKind.VOLUME, id=disk["id"], region=REGION, tags={"provider_ref": REF},
                 created_at=long_ago),))

    def provider_for(b: Any) -> Any:
        return ForgingProvider(build_gcp_provider(b, endpoint=gcp.url, timeout=5), forged)

    pipeline = Pipeline(settings=Settings.explicit(confirm_seconds=0,
                                                   margin_seconds=0), db=db, provider_for=provider_for,
                        listing_queue=InProcessQueue(), delete_queue=InProcessQueue())
    report = run_cycle(pipeline, "gcp-attack", mode="delete")

    row = cleanup_row(db, "gcp-attack")
    actions = [(g.resources[0].kind, g.verdict, g.action) for g in report.groups]
    assert report.outcome != "failed", f"{actions}; error {report.error!r}; retry delay {row['retry_delay_seconds']}"
