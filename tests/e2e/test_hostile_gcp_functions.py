"""Hostile input for the Cloud Functions, served by functions-framework's
``create_app`` test client: real Pub/Sub publishing (fake Publisher service),
the real Compute client against the fake Compute REST server, real Postgres.

- The HTTP lister answers any body with 400 and a JSON error, or 200; never a 500.
- The classifier and the deleter refuse a malformed CloudEvent with an error
  (Pub/Sub redelivers it, then dead-letters it), accept harmless well-formed
  ones (unknown cycle, a group never dispatched, a tampered group), and none of
  them deletes anything.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from typing import Any

import pytest
from functions_framework import create_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orphan_cleanup.core.listing import Resource, ResourceGroup, ResourceKind
from orphan_cleanup.core.messages import DeleteRequest, ListingBatch
from orphan_cleanup.core.owners import OwnerStatus
from orphan_cleanup.ledger.client import LedgerClient, gcp_labels
from orphan_cleanup.ledger.db import Database
from tests.support.gcp_fake import FakeCompute
from tests.support.pubsub_harness import FakePubSub, pubsub, pubsub_cloudevent, pubsub_server  # noqa: F401

BACKEND = "gcp-main"
PROJECT = "test-project"
ZONE, REGION = "us-central1-a", "us-central1"
LISTING_TOPIC = f"projects/{PROJECT}/topics/orphan-cleanup-listing"
DELETE_TOPIC = f"projects/{PROJECT}/topics/orphan-cleanup-delete"
SOURCE = "functions/gcp/main.py"
SUB = f"projects/{PROJECT}/subscriptions/hostile"


class Functions:
    def __init__(self, db: Database, gcp: FakeCompute, pubsub: FakePubSub, monkeypatch: pytest.MonkeyPatch) -> None:
        self.db, self.gcp, self.pubsub = db, gcp, pubsub
        for key, value in {"DATABASE_URL": db.info.url(), "ORPHAN_CLEANUP_GCP_ENDPOINT": gcp.url,
                           "LISTING_TOPIC": LISTING_TOPIC, "DELETE_TOPIC": DELETE_TOPIC,
                           "ORPHAN_CLEANUP_MARGIN_SECONDS": "0"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("ORPHAN_CLEANUP_MODE", raising=False)
        self.lister = create_app(target="lister", source=SOURCE, signature_type="http").test_client()
        self.classifier = create_app(target="classifier", source=SOURCE, signature_type="cloudevent").test_client()
        self.deleter = create_app(target="deleter", source=SOURCE, signature_type="cloudevent").test_client()
        with db.connection() as conn:
            conn.run("INSERT INTO backends (id, provider, account, regions, settings, mode)"
                     " VALUES (:i, 'gcp', :a, CAST(:r AS text[]), '{}', 'delete')", i=BACKEND, a=PROJECT, r=[REGION])
        ledger = LedgerClient(db)
        tracked = ledger.issue_ref(owner_name="tracked")
        self.tracked_ref = tracked.provider_ref
        inst = gcp.add_instance("tracked", zone=ZONE, labels=gcp_labels(tracked.provider_ref))
        self.tracked_id = inst["id"]
        ledger.mark_provisioning(tracked.owner_id, backend_id=BACKEND, primary_id=inst["id"], region=REGION,
                                 status=OwnerStatus.BUSY)
        leaked = ledger.issue_ref(owner_name="leaked")
        self.leaked_id = gcp.add_instance("leaked", zone=ZONE, labels=gcp_labels(leaked.provider_ref))["id"]
        ledger.hard_delete(leaked.owner_id)
        gcp.add_instance("foreign", zone=ZONE, labels=gcp_labels("zzzzforeign1"))

    def post_event(self, client: Any, data: bytes) -> int:
        return client.post("/", **pubsub_cloudevent(data, subscription=SUB)).status_code

    def deletes(self) -> int:
        return self.gcp.count("DELETE")


@pytest.fixture
def functions(db: Database, gcp: FakeCompute, pubsub: FakePubSub,  # noqa: F811 - fixtures
              monkeypatch: pytest.MonkeyPatch) -> Functions:
    return Functions(db, gcp, pubsub, monkeypatch)


BODIES = st.one_of(
    st.binary(max_size=40), st.text(max_size=40).map(str.encode),
    st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=10)),
                 lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
                 max_leaves=8).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"backend": st.one_of(st.text(max_size=20), st.just("a\x00b"), st.just(""),
                                                st.integers(), st.text(min_size=201, max_size=220))},
                          optional={"mode": st.one_of(st.text(max_size=8), st.integers())}
                          ).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=30).map(lambda b: json.dumps({"message": {"data": base64.b64encode(b).decode()}}).encode()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES)
def test_the_http_lister_answers_any_body_with_400_or_200(functions: Functions, body: bytes) -> None:
    resp = functions.lister.post("/", data=body, content_type="application/json")

    assert resp.status_code in (200, 400), resp.get_data(as_text=True)
    payload = resp.get_json()
    assert isinstance(payload, dict) and payload["ok"] is (resp.status_code == 200)
    if resp.status_code == 400:
        assert isinstance(payload["error"], str) and payload["error"]


def listing_events(good: ListingBatch) -> dict[str, tuple[bytes, int]]:
    """name -> (Pub/Sub data, expected status): 500 = refused (redelivered, then dead-lettered)."""
    doc = json.loads(good.model_dump_json())
    return {
        "not json": (b"\x00\xffnot json", 500),
        "a list": (b"[1, 2]", 500),
        "wrong types": (json.dumps({**doc, "seq": "first", "groups": 3}).encode(), 500),
        "bad ref": (json.dumps({**doc, "groups": [{"provider_ref": "BAD", "region": REGION}]}).encode(), 500),
        "unknown backend": (json.dumps({**doc, "backend": "nope"}).encode(), 500),
        "NUL in backend": (json.dumps({**doc, "backend": "gcp\x00main"}).encode(), 500),
        # one group 4,000 times: refused as malformed (a group key twice), whatever its cycle
        "huge, one group repeated": (json.dumps({**doc, "cycle_id": "e" * 32,
                                                 "groups": doc["groups"][:1] * 4000}).encode(), 500),
        "huge, bad": (json.dumps({**doc, "groups": [{"provider_ref": "BAD"}] * 4000}).encode(), 500),
        "unknown cycle": (good.model_copy(update={"cycle_id": "f" * 32}).model_dump_json().encode(), 200),
    }


def test_the_classifier_refuses_malformed_events_and_applies_only_real_batches(functions: Functions) -> None:
    # given a real cycle's listing batch and hostile events beside it
    summary = functions.lister.post("/", json={"backend": BACKEND, "mode": "delete"}).get_json()
    [published] = functions.pubsub.take(LISTING_TOPIC)
    good = ListingBatch.model_validate_json(published.data)

    # when each hostile event is delivered, then the real batch (twice)
    statuses = {name: functions.post_event(functions.classifier, data)
                for name, (data, _) in listing_events(good).items()}
    real = [functions.post_event(functions.classifier, published.data) for _ in range(2)]

    # then the hostile ones were refused or were no-ops; the real one applied once
    assert statuses == {name: expected for name, (_, expected) in listing_events(good).items()}
    assert real == [200, 200]
    with functions.db.connection() as conn:
        applied = conn.run("SELECT applied_batches FROM cycles WHERE id = :c", c=summary["cycle_id"])[0][0]
    assert applied == 1
    requests = [DeleteRequest.model_validate_json(m.data) for m in functions.pubsub.take(DELETE_TOPIC)]
    # once, or twice: the redelivered last batch re-publishes the request still queued (SAFETY.md rule 20)
    assert {r.group.primary_id for r in requests} == {functions.leaked_id} and len(requests) <= 2
    assert functions.deletes() == 0


def test_the_deleter_deletes_nothing_on_hostile_events(functions: Functions) -> None:
    # given a dispatched orphan (the leaked VM), and hostile requests naming other things
    functions.lister.post("/", json={"backend": BACKEND, "mode": "delete"})
    [published] = functions.pubsub.take(LISTING_TOPIC)
    assert functions.post_event(functions.classifier, published.data) == 200
    [real] = [DeleteRequest.model_validate_json(m.data) for m in functions.pubsub.take(DELETE_TOPIC)]
    tracked = ResourceGroup(provider_ref=functions.tracked_ref, region=ZONE, primary_id=functions.tracked_id,
                            resources=(Resource(kind=ResourceKind.INSTANCE, id=functions.tracked_id, region=ZONE,
                                                tags={"provider_ref": functions.tracked_ref}),))
    tampered = real.group.model_copy(update={"resources": real.group.resources + (
        Resource(kind=ResourceKind.DISK, id="123", region=ZONE, tags={"provider_ref": real.group.provider_ref}),)})
    events = {
        "not json": (b"{", 500), "a number": (b"12", 500),
        "bad ref": (real.model_dump_json().replace(real.group.provider_ref, "NOT-A-REF").encode(), 500),
        "unknown backend": (real.model_copy(update={"backend": "nope"}).model_dump_json().encode(), 500),
        "tracked group": (real.model_copy(update={"group": tracked}).model_dump_json().encode(), 200),
        "tracked group, unknown cycle": (real.model_copy(update={"group": tracked, "cycle_id": "0" * 32})
                                         .model_dump_json().encode(), 200),
        "tampered group": (real.model_copy(update={"group": tampered}).model_dump_json().encode(), 200),
    }

    statuses = {name: functions.post_event(functions.deleter, data) for name, (data, _) in events.items()}

    assert statuses == {name: expected for name, (_, expected) in events.items()}
    assert functions.deletes() == 0
    # the real request still works afterwards: only the orphan goes
    assert functions.post_event(functions.deleter, real.model_dump_json().encode()) == 200
    assert functions.gcp.get("instances", ZONE, "leaked") is None or functions.deletes() == 1
    assert functions.gcp.get("instances", ZONE, "tracked") is not None
    assert functions.gcp.get("instances", ZONE, "foreign") is not None


def test_a_stale_or_altered_batch_of_a_finished_cycle_applies_nothing(functions: Functions) -> None:
    functions.lister.post("/", json={"backend": BACKEND, "mode": "report"})
    [published] = functions.pubsub.take(LISTING_TOPIC)
    assert functions.post_event(functions.classifier, published.data) == 200
    altered = ListingBatch.model_validate_json(published.data).model_copy(
        update={"listed_at": datetime(2000, 1, 1, tzinfo=timezone.utc)})

    assert functions.post_event(functions.classifier, published.data) == 200  # a redelivery: a no-op
    # a listing time that is not the cycle's: refused (redelivered, then dead-lettered), never applied
    assert functions.post_event(functions.classifier, altered.model_dump_json().encode()) == 500
    assert functions.pubsub.take(DELETE_TOPIC) == [] and functions.deletes() == 0
