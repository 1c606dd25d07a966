"""Hostile messages, pure parts (no database, no sockets; hypothesis).

- A queue body of any shape parses into its model or fails with a pydantic
  ``ValidationError`` (the handlers turn that into one failed record).
- A Pub/Sub or HTTP payload of any shape parses or fails with
  ``MalformedMessage`` (a ``ConfigError``: a clear 400 / a dead-lettered event).
- A listed group that is malformed (resources without the group's ref,
  duplicated, a primary that is not among them or not an instance, no
  resources) is never classified an orphan, whatever the ledger says (SAFETY.md
   rule 1: an unexpected shape means skip, never orphan). Regions are left
  to the adapters' delete-time shape check: a GCP instance's group
  legitimately holds its regional address.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orphan_cleanup.core.classify import ClassifyContext, classify
from orphan_cleanup.core.classify_batch import classify_batch
from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.listing_rules import ListedInstances
from orphan_cleanup.core.messages import DeleteRequest, ListerEvent, ListingBatch
from orphan_cleanup.core.owners import LedgerRecord
from orphan_cleanup.core.verdicts import VerdictKind
from orphan_cleanup.entrypoints.aws import DeleteRequestRecord, ListingBatchRecord
from orphan_cleanup.entrypoints.gcp import MalformedMessage, parse

REF, OTHER = "abcdefgh1234", "zzzzzzzz9999"
NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
OLD = NOW - timedelta(days=2)
# The listing shows the live owner's recorded VM i-tracked (a retry leak is judged beside it).
CTX = ClassifyContext(backend_id="aws-prod", scope="aws:123456789012", listed_at=NOW, margin=timedelta(minutes=5),
                      protect_key="orphan-cleanup-protect",
                      listed=ListedInstances(known=[(REF, "us-east-1", "i-tracked")]))

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=20)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=10), c, max_size=4)),
    max_leaves=20)


def near_valid_group() -> st.SearchStrategy[Any]:
    resource = st.fixed_dictionaries({
        "kind": st.sampled_from(["instance", "volume", "disk", "bucket", ""]),
        "id": st.one_of(st.just(""), st.text(max_size=12), st.integers()),
        "region": st.one_of(st.just("us-east-1"), st.text(max_size=5), st.none()),
    }, optional={"tags": st.one_of(st.dictionaries(st.text(max_size=8), st.text(max_size=14), max_size=2), JSON),
                 "state": st.text(max_size=8), "created_at": st.one_of(st.text(max_size=25), st.integers())})
    return st.fixed_dictionaries({
        "provider_ref": st.one_of(st.just(REF), st.text(max_size=14), st.integers(), st.none()),
        "region": st.one_of(st.just("us-east-1"), st.text(max_size=5)),
    }, optional={"primary_id": st.one_of(st.none(), st.text(max_size=8)),
                 "resources": st.lists(resource, max_size=3)})


def near_valid_batch() -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries({
        "cycle_id": st.one_of(st.just("c1"), st.just(""), st.text(min_size=60, max_size=80), st.integers()),
        "backend": st.one_of(st.just("aws-prod"), st.just(""), st.text(max_size=300)),
        "seq": st.one_of(st.integers(), st.text(max_size=3)),
        "listed_at": st.one_of(st.just(NOW.isoformat()), st.text(max_size=30), st.integers()),
    }, optional={"v": st.integers(), "mode": st.text(max_size=8), "groups": st.lists(near_valid_group(), max_size=3),
                 "last": JSON, "batch_count": JSON, "failures": JSON, "record_all": JSON, "extra": JSON})


BODIES = st.one_of(JSON.map(json.dumps), st.text(max_size=200), near_valid_batch().map(json.dumps),
                   st.fixed_dictionaries({"cycle_id": st.just("c1"), "backend": st.just("aws-prod"),
                                          "group": near_valid_group()}).map(json.dumps))


@settings(max_examples=400, deadline=None)
@given(body=BODIES)
def test_a_queue_body_of_any_shape_parses_or_fails_validation(body: str) -> None:
    for model in (ListingBatch, DeleteRequest):
        try:
            parsed = model.model_validate_json(body)
        except ValidationError:
            continue
        groups = parsed.groups if isinstance(parsed, ListingBatch) else (parsed.group,)
        for group in groups:
            assert len(group.provider_ref) == 12 and all(r.id for r in group.resources)


def sqs_record(body: Any) -> dict[str, Any]:
    return {"messageId": "m-1", "receiptHandle": "rh", "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000",
                           "SenderId": "AIDA", "ApproximateFirstReceiveTimestamp": "1700000000000"},
            "messageAttributes": {}, "md5OfBody": "0" * 32, "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q", "awsRegion": "us-east-1"}


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(BODIES, JSON))
def test_an_sqs_record_of_any_body_parses_or_fails_that_record_only(body: Any) -> None:
    """What Powertools' BatchProcessor does with each record before our handler runs."""
    for model in (ListingBatchRecord, DeleteRequestRecord):
        try:
            model.model_validate(sqs_record(body))
        except ValidationError:
            pass


PUBSUB = st.one_of(
    st.binary(max_size=60), st.text(max_size=60), JSON,
    JSON.map(lambda d: {"message": {"data": base64.b64encode(json.dumps(d).encode()).decode()}}),
    st.text(max_size=30).map(lambda t: {"message": {"data": t}}),
    st.binary(max_size=30).map(lambda b: {"message": {"data": base64.b64encode(b).decode()}}),
    near_valid_batch().map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=400, deadline=None)
@given(data=PUBSUB)
def test_a_pubsub_or_http_payload_of_any_shape_parses_or_is_malformed(data: Any) -> None:
    for model in (ListingBatch, DeleteRequest, ListerEvent):
        try:
            parse(model, data)
        except MalformedMessage:
            pass


# ---- malformed groups at the classifier ---------------------------------------------

def _res(rid: str, *, kind: ResourceKind = ResourceKind.INSTANCE, region: str = "us-east-1",
         tags: dict[str, str] | None = None) -> Resource:
    return Resource(kind=kind, id=rid, region=region, created_at=OLD,
                    tags={"provider_ref": REF} if tags is None else tags)


def _orphan_making_records() -> list[LedgerRecord]:
    """Every ledger state that makes a well-formed group of REF an orphan."""
    base = dict(provider_ref=REF, owner_id="inst-1", issued_at=OLD)
    return [
        LedgerRecord(**base),  # owner hard-deleted
        LedgerRecord(**base, instance_found=True, status="terminated", created_at=OLD, terminated_at=OLD),
        LedgerRecord(**base, instance_found=True, status="idle", backend_id="aws-prod", primary_id="i-tracked",
                     created_at=OLD, provisioned_at=OLD + timedelta(hours=1)),  # i-1 is a leaked attempt
    ]


MALFORMED = {
    "resource without the ref tag": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1",
                                                  resources=(_res("i-1", tags={}),)),
    "resource with an empty ref": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1",
                                                resources=(_res("i-1", tags={"provider_ref": ""}),)),
    "resource of another ref": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1",
                                             resources=(_res("i-1"), _res("vol-9", kind=ResourceKind.VOLUME,
                                                                         tags={"provider_ref": OTHER}))),
    "duplicate ids": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1",
                                   resources=(_res("i-1"), _res("i-1"))),
    "primary not among the resources": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-404",
                                                     resources=(_res("vol-1", kind=ResourceKind.VOLUME),)),
    "primary that is not an instance": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="vol-1",
                                                     resources=(_res("vol-1", kind=ResourceKind.VOLUME),)),
    "no resources at all": ResourceGroup(provider_ref=REF, region="us-east-1", primary_id=None, resources=()),
}


def test_the_well_formed_control_group_is_an_orphan() -> None:
    good = ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1", resources=(_res("i-1"),))
    assert all(classify(good, r, CTX).kind is VerdictKind.ORPHAN for r in _orphan_making_records())


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_a_malformed_group_is_never_an_orphan(shape: str) -> None:
    group = MALFORMED[shape]
    for record in [None, *_orphan_making_records()]:
        verdict = classify(group, record, CTX)
        assert verdict.kind is not VerdictKind.ORPHAN, f"{shape}: {verdict.reason} with record {record}"


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_a_batch_of_a_malformed_group_dispatches_nothing(shape: str) -> None:
    # One group a batch: several of these shapes share a key, and a batch with a
    # key twice is refused whole (test_a_batch_with_a_group_key_twice_is_refused).
    batch = ListingBatch(cycle_id="c1", backend="aws-prod", seq=0, listed_at=NOW, mode="delete",
                         groups=(MALFORMED[shape],), last=True, batch_count=1)
    records = {REF: _orphan_making_records()[0]}

    payload = classify_batch(batch, records, CTX, mode="delete", record_all=False)

    assert payload.orphans == ()


def test_a_batch_with_a_group_key_twice_is_refused() -> None:
    tags = {"provider_ref": REF}
    twice = ResourceGroup(provider_ref=REF, region="us-east-1", primary_id="i-1",
                          resources=(Resource(kind=ResourceKind.INSTANCE, id="i-1", region="us-east-1", tags=tags),))
    with pytest.raises(ValidationError, match="duplicate group key"):
        ListingBatch(cycle_id="c1", backend="aws-prod", seq=0, listed_at=NOW, mode="delete",
                     groups=(twice, twice), last=True, batch_count=1)
