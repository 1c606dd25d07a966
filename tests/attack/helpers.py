"""Shared set-up for the attack reproductions: providers on the real fake Compute server and
on moto in server mode, a recording journal, and group builders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import boto3

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.listing import ResourceGroup
from orphan_cleanup.providers.aws.provider import AwsProvider, build_aws_provider
from orphan_cleanup.providers.gcp.clients import build_gcp_clients
from orphan_cleanup.providers.gcp.provider import GcpProvider
from tests.support.listing import collect

REF = "attackref001"
OTHER = "otherref0002"
TAG = "provider_ref"
PROTECT = "orphan-cleanup-protect"
EAST = "us-east-1"
ZONE, REGION = "us-central1-a", "us-central1"


@dataclass
class RecordingJournal:
    """The journal port (rule 19), recording each intent and result in memory."""

    intents: list[dict[str, Any]] = field(default_factory=list)
    results: list[tuple[int, str, str | None]] = field(default_factory=list)

    def intent(self, call: str, target: str, *, region: str | None, blast: Any = ()) -> object:
        self.intents.append({"call": call, "target": target, "region": region, "blast": list(blast)})
        return len(self.intents) - 1

    def result(self, intent: object, outcome: str, error: str | None = None) -> None:
        self.results.append((int(intent), outcome, error))  # type: ignore[arg-type]

    def calls(self) -> list[tuple[str, str]]:
        return [(i["call"], i["target"]) for i in self.intents]


# ---- GCP ---------------------------------------------------------------------------

def gcp_provider(gcp: Any, regions: tuple[str, ...] = (REGION,), **settings: Any) -> GcpProvider:
    backend = Backend(id="gcp-attack", provider="gcp", account=gcp.project, regions=regions, settings=settings)
    return GcpProvider(backend, **build_gcp_clients(backend.settings, endpoint=gcp.url),
                       timeout=5.0, poll_interval=0.01)


# ---- AWS ---------------------------------------------------------------------------

def aws_provider(endpoint: str, session: boto3.Session | None = None, **settings: Any) -> AwsProvider:
    backend = Backend(id="aws-attack", provider="aws", account="123456789012", regions=(EAST,),
                      settings=settings)
    return build_aws_provider(backend, connect_timeout=5, read_timeout=10, session=session or boto3.Session(),
                              endpoint_url=endpoint)


def ec2(endpoint: str | None = None) -> Any:
    return boto3.client("ec2", region_name=EAST, endpoint_url=endpoint)


def spec(resource_type: str, values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": [{"Key": k, "Value": v} for k, v in values.items()]}]


def groups_of(provider: Any, ref: str = REF) -> list[ResourceGroup]:
    return [g for g in collect(provider).groups if g.provider_ref == ref]


def on_gcp_request(monkeypatch: Any, gcp: Any, method: str, path_contains: str, action: Any, *,
                   query_contains: str = "", times: int = 1) -> list[int]:
    """Run ``action()`` (under the fake's lock, before it answers) when a request of ``method``
    whose path contains ``path_contains`` (and whose query contains ``query_contains``) arrives,
    ``times`` times: something changes in the cloud between two of the deleter's calls.
    Returns a one-item list counting how often it fired."""
    fired = [0]
    original = gcp.dispatch

    def dispatch(m: str, path: str, query: dict[str, str], body: bytes = b"") -> Any:
        if m == method and path_contains in path and query_contains in str(query) and fired[0] < times:
            fired[0] += 1
            action()
        return original(m, path, query, body)

    monkeypatch.setattr(gcp, "dispatch", dispatch)
    return fired
