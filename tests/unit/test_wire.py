"""The ListingBatch queue body's fast decoder (msgspec, ``wire.listing_batch_from_json``)
gives what pydantic gives the same body: an equal batch (values, types of every field,
``model_fields_set`` of every model, tzinfo) or the same ``ValidationError``; and where
it decides alone, the batch the GCP entry point's ``json.loads`` + ``model_validate``
gives too (issue #17 item 4; DESIGN §5 rules 1 and 12: the body is hostile input)."""

from __future__ import annotations

import base64
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pydantic import BaseModel, ValidationError

from bench import ledger_data as data
from orphan_cleanup.entrypoints.aws import ListingBatchRecord
from orphan_cleanup.entrypoints.gcp import MalformedMessage, parse, parse_batch
from orphan_cleanup.messages import ListingBatch
from orphan_cleanup.wire import MAX_DETAILS_DEPTH, fast_listing_batch, listing_batch_from_json

REF = "abcdefgh1234"


def same(fast: Any, slow: Any, where: str = "$") -> None:
    """Equal, of the same types all the way down, the same fields set in every model."""
    assert type(fast) is type(slow), f"{where}: {type(fast)} != {type(slow)}"
    if isinstance(slow, BaseModel):
        assert fast.model_fields_set == slow.model_fields_set, where
        assert list(fast.__dict__) == list(slow.__dict__), where
        for name in type(slow).model_fields:
            same(getattr(fast, name), getattr(slow, name), f"{where}.{name}")
    elif isinstance(slow, (tuple, list)):
        assert len(fast) == len(slow), where
        for i, (f, s) in enumerate(zip(fast, slow, strict=True)):
            same(f, s, f"{where}[{i}]")
    elif isinstance(slow, dict):
        assert list(fast) == list(slow), where
        for k in slow:
            same(fast[k], slow[k], f"{where}.{k}")
    elif isinstance(slow, datetime):
        assert fast == slow and fast.isoformat() == slow.isoformat(), where
        assert fast.tzinfo == slow.tzinfo and fast.tzname() == slow.tzname(), where
    elif isinstance(slow, float):
        assert repr(fast) == repr(slow), where  # -0.0, nan
    else:
        assert fast == slow, where


def note(what: str) -> None:
    if currently_in_test_context():
        event(what)


def assert_same(body: str | bytes) -> None:
    try:
        expected = ListingBatch.model_validate_json(body)
    except ValidationError as e:
        with pytest.raises(ValidationError) as got:
            listing_batch_from_json(body)
        assert str(got.value) == str(e)
        assert got.value.errors(include_context=False) == e.errors(include_context=False)
        assert fast_listing_batch(body) is None
        note("refused")
        return
    got_batch = listing_batch_from_json(body)
    assert got_batch.model_dump_json() == expected.model_dump_json()  # not ==: a NaN in details
    same(got_batch, expected)
    fast = fast_listing_batch(body)
    note("fast path" if fast is not None else "pydantic decided")
    if fast is not None:  # decided alone: it is also what the GCP entry point's old parse gave
        same(fast, ListingBatch.model_validate(json.loads(body)))


# ---- valid bodies, of every shape the models accept -------------------------------------------

texts = st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=8) | st.text(max_size=4) | st.sampled_from(
    ["", "x", "\x00", "é", "😀", "a\nb", "\ud800", "\\u0041", ".1234567"])
refs = st.from_regex(r"[a-z0-9]{12}", fullmatch=True)
def stamp(fractions: list[str], zones: list[str]) -> st.SearchStrategy[str]:
    return st.builds(lambda d, sep, frac, tz: f"{d:%Y-%m-%d}{sep}{d:%H:%M:%S}{frac}{tz}",
                     st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1)),
                     st.sampled_from(["T", "T", "t", " "]), st.sampled_from(fractions), st.sampled_from(zones))


# the forms a listing writes, and forms either parser reads otherwise or refuses
stamps = st.one_of(
    stamp(["", ".123456", ".1"], ["Z", "+00:00", "-05:30", ""]),
    stamp(["", ".123456", ".1", ".1234567", ".9999999", ".0000005", ".", ",5", ".000000000"],
          ["Z", "z", "+00:00", "-00:00", "+02:00", "-05:30", "+0200", "+23:59", "+24:00", "", "+02"]))
odd_stamps = st.sampled_from(["2024-01-01", "2024-01-01T10:00", "infinity", "", "1700000000"]) | st.integers()
json_leaf = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63, max_value=2**70)
             | st.floats() | texts)
details_values = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3),
                              max_leaves=8)


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


deep_values = st.integers(MAX_DETAILS_DEPTH - 2, MAX_DETAILS_DEPTH + 1).map(nested)  # both sides of the limit
resource = st.fixed_dictionaries(
    {"kind": st.sampled_from(["instance", "volume", "disk", "snapshot", "spot-request"]),
     "id": texts.filter(bool), "region": st.sampled_from(["us-east-1", "europe-west1-b"]) | texts},
    optional={"state": st.sampled_from(["active", "available", "terminating", "terminated"]),
              "tags": st.dictionaries(texts, texts, max_size=3),
              "created_at": st.none() | stamps,
              "attached_to": st.none() | texts,
              "details": st.dictionaries(texts, details_values | deep_values, max_size=3),
              "controller": st.none() | texts,
              "protection": st.none() | st.sampled_from(["deletion_protection", "termination_protection"])})


@st.composite
def group(draw: st.DrawFn) -> dict[str, Any]:
    malformed = draw(st.booleans())
    ref = draw(texts.filter(lambda t: len(t) != 12) if malformed else refs)
    g = {"provider_ref": ref, "region": draw(st.sampled_from(["us-east-1", "r1"]) | texts)}
    if draw(st.booleans()):
        g["primary_id"] = draw(st.none() | texts)
    if draw(st.booleans()):
        g["resources"] = draw(st.lists(resource, max_size=3))
    if malformed or draw(st.booleans()):
        g["malformed_ref"] = malformed
    return g


@st.composite
def batch(draw: st.DrawFn) -> dict[str, Any]:
    b: dict[str, Any] = {"cycle_id": draw(st.text(min_size=1, max_size=64)),
                         "backend": draw(st.sampled_from(["aws-prod", "gcp-1", "é"]) | texts.filter(bool)),
                         "seq": draw(st.integers(min_value=0, max_value=2**65)), "listed_at": draw(stamps)}
    optional = {"v": st.just(1), "mode": st.sampled_from(["report", "delete", "off"]), "record_all": st.booleans(),
                "groups": st.lists(group(), max_size=3), "last": st.booleans(),
                "batch_count": st.none() | st.integers(min_value=1, max_value=10),
                "failures": st.lists(st.fixed_dictionaries({"region": texts, "error": texts}), max_size=2)}
    for key, values in optional.items():
        if draw(st.booleans()):
            b[key] = draw(values)
    return b


# ---- hostile ones: valid bodies altered --------------------------------------------------------

ODD = (st.none() | st.booleans() | st.integers() | st.floats() | texts | odd_stamps | st.just("5") | st.just(5.0)
       | st.just("true") | st.lists(st.integers(), max_size=2) | st.dictionaries(texts, texts, max_size=2))


def slots(tree: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON tree."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        out.append((tree, k))
        slots(v, out)
    return out


@st.composite
def hostile(draw: st.DrawFn) -> dict[str, Any]:
    b = draw(batch())
    for _ in range(draw(st.integers(1, 2))):
        places = slots(b, [])
        tree, key = places[draw(st.integers(0, len(places) - 1))]
        how = draw(st.sampled_from(["replace", "drop", "extra", "twice", "flip", "nul"]))
        if how == "replace":
            tree[key] = draw(ODD)
        elif how == "drop" and isinstance(tree, dict):
            del tree[key]
        elif how == "extra" and isinstance(tree[key], dict):
            tree[key][draw(st.sampled_from(["extra", "ID", "v", "kind "]))] = draw(ODD)
        elif how in ("twice", "flip") and isinstance(b.get("groups"), list) and b["groups"] \
                and isinstance(b["groups"][0], dict):
            first = b["groups"][0]
            if how == "twice":
                b["groups"].append(dict(first))  # the same group key twice
            else:
                first["malformed_ref"] = not first.get("malformed_ref", False)
        elif how == "nul" and isinstance(b.get("backend"), str):
            b["backend"] = b["backend"][:1] + "\x00"
    return b


def dumped(tree: Any, ascii_only: bool, text_edit: int) -> str:
    body = json.dumps(tree, ensure_ascii=ascii_only)
    if text_edit == 1:  # a key given twice, the first value kept nowhere
        body = body.replace("{", '{"seq": 7, ', 1)
    elif text_edit == 2:  # an escaped digit: a fraction of 7 digits the raw text does not show
        body = body.replace("0", "\\u0030", 1)
    return body


BODIES = st.builds(dumped, st.one_of(batch(), batch(), hostile()), st.sampled_from([False, False, True]),
                   st.sampled_from([0, 0, 0, 0, 1, 2]))


@settings(max_examples=400, deadline=None)
@given(BODIES, st.booleans())
def test_the_fast_decoder_gives_pydantics_batch_or_its_error(body: str, as_bytes: bool) -> None:
    assert_same(body.encode("utf-8", "surrogatepass") if as_bytes else body)


@pytest.mark.slow
@settings(max_examples=6000, deadline=None)
@given(BODIES, st.booleans())
def test_the_fast_decoder_gives_pydantics_batch_or_its_error_many(body: str, as_bytes: bool) -> None:
    assert_same(body.encode("utf-8", "surrogatepass") if as_bytes else body)


# ---- each validator, on the fast path --------------------------------------------------------------

def good() -> dict[str, Any]:
    res = {"kind": "instance", "id": "i-1", "region": "us-east-1", "state": "active",
           "tags": {"provider_ref": REF}, "created_at": "2026-11-29T10:00:00.123456Z", "attached_to": None,
           "details": {"zone": "us-east-1a", "n": 1, "f": 0.5, "l": [1, {"a": None}]}, "controller": None,
           "protection": None}
    return {"v": 1, "cycle_id": "c" * 32, "backend": "aws-prod", "seq": 3, "listed_at": "2026-12-01T10:00:00Z",
            "mode": "report", "record_all": False,
            "groups": [{"provider_ref": REF, "region": "us-east-1", "primary_id": "i-1", "resources": [res],
                        "malformed_ref": False},
                       {"provider_ref": "Not-A-Ref", "region": "us-east-1", "primary_id": None, "resources": [],
                        "malformed_ref": True}],
            "last": True, "batch_count": 4, "failures": [{"region": "eu-west-1", "error": "timeout"}]}


def test_a_body_as_the_lister_writes_it_takes_the_fast_path() -> None:
    groups = data.make_groups(1000, 300, random.Random(7))
    body = ListingBatch(cycle_id="c1", backend=data.BACKEND, seq=0, listed_at=datetime.now(UTC),
                        groups=tuple(groups)).model_dump_json()
    fast = fast_listing_batch(body)
    assert fast is not None
    same(fast, ListingBatch.model_validate_json(body))
    assert fast_listing_batch(json.dumps(good())) is not None


def test_fields_left_out_are_defaults_and_not_set() -> None:
    body = json.dumps({"cycle_id": "c1", "backend": "b", "seq": 0, "listed_at": "2026-12-01T10:00:00+02:00",
                       "groups": [{"provider_ref": REF, "region": "r",
                                   "resources": [{"kind": "volume", "id": "v", "region": "r"}]}]})
    fast = fast_listing_batch(body)
    assert fast is not None
    same(fast, ListingBatch.model_validate_json(body))
    assert fast.model_fields_set == {"cycle_id", "backend", "seq", "listed_at", "groups"}
    assert fast.groups[0].resources[0].model_fields_set == {"kind", "id", "region"}
    assert fast.listed_at.utcoffset() == timedelta(hours=2) and fast.listed_at.tzname() == "+02:00"
    other = fast_listing_batch(body)
    assert other is not None and other.groups[0].resources[0].tags is not fast.groups[0].resources[0].tags


def edit(path: str, value: Any) -> dict[str, Any]:
    b: Any = good()
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    tree = b
    for p in parents:
        tree = tree[p]
    if value is DROP:
        del tree[last]
    else:
        tree[last] = value
    return b


DROP = object()
REFUSED = {  # what the fast path must leave to pydantic, each with the check it exercises
    "a valid ref marked malformed": edit("groups.1.provider_ref", "abcdefgh9999"),
    "a malformed ref not marked": edit("groups.0.malformed_ref", True),
    "a malformed ref, flag left out": edit("groups.1.malformed_ref", DROP),
    "a group key twice": edit("groups.1", good()["groups"][0]),
    "a NUL in the backend": edit("backend", "aws\x00prod"),
    "an unknown batch key": edit("extra", 1),
    "an unknown group key": edit("groups.0.extra", 1),
    "an unknown resource key": edit("groups.0.resources.0.extra", 1),
    "an unknown failure key": edit("failures.0.extra", 1),
    "v is not 1": edit("v", 2),
    "no cycle_id": edit("cycle_id", DROP),
    "an empty cycle_id": edit("cycle_id", ""),
    "a cycle_id too long": edit("cycle_id", "c" * 65),
    "an empty backend": edit("backend", ""),
    "a backend too long": edit("backend", "b" * 201),
    "a negative seq": edit("seq", -1),
    "a batch_count of 0": edit("batch_count", 0),
    "an unknown mode": edit("mode", "destroy"),
    "an unknown kind": edit("groups.0.resources.0.kind", "bucket"),
    "an unknown state": edit("groups.0.resources.0.state", "running"),
    "an unknown protection": edit("groups.0.resources.0.protection", "legal_hold"),
    "an empty resource id": edit("groups.0.resources.0.id", ""),
    "a ref too long": edit("groups.1.provider_ref", "x" * 1025),
    "a null tag": edit("groups.0.resources.0.tags.Name", None),
    # lax coercions pydantic does from JSON, and values it reads otherwise than msgspec
    "a seq as text": edit("seq", "5"),
    "a seq as a float": edit("seq", 5.0),
    "a flag as text": edit("last", "true"),
    "a flag as 1": edit("record_all", 1),
    "a timestamp as a number": edit("listed_at", 1700000000),
    "a date alone": edit("listed_at", "2026-12-01"),
    "a fraction of 7 digits": edit("groups.0.resources.0.created_at", "2026-11-29T10:00:00.1234567Z"),
    "a float out of range": edit("groups.0.resources.0.details.n", 1e400),
    "NaN": edit("groups.0.resources.0.details.n", float("nan")),
    "details nested too deep": edit("groups.0.resources.0.details.n", nested(MAX_DETAILS_DEPTH + 1)),
    "details past pydantic's recursion limit": edit("groups.0.resources.0.details.n", nested(300)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_fast_path_leaves_to_pydantic(case: str) -> None:
    body = json.dumps(REFUSED[case], ensure_ascii=False)
    assert fast_listing_batch(body) is None
    assert_same(body)


def test_an_escape_that_hides_a_long_fraction_goes_to_pydantic() -> None:
    body = json.dumps(good()).replace('.123456Z', '.123456\\u0037Z')
    assert fast_listing_batch(body) is None
    assert listing_batch_from_json(body).groups[0].resources[0].created_at.microsecond == 123456  # truncated


def test_details_as_deep_as_allowed_take_the_fast_path() -> None:
    body = json.dumps(edit("groups.0.resources.0.details.n", nested(MAX_DETAILS_DEPTH)))
    assert fast_listing_batch(body) is not None
    assert_same(body)


def test_a_key_twice_keeps_the_last_value_as_pydantic_does() -> None:
    body = json.dumps(good()).replace('{"v": 1,', '{"v": 1, "seq": 9, "mode": "delete",', 1)
    fast = fast_listing_batch(body)
    assert fast is not None and fast.seq == 3 and fast.mode == "report"
    assert_same(body)


# ---- the entry points -------------------------------------------------------------------------------

def sqs_record(body: Any) -> dict[str, Any]:
    return {"messageId": "m-1", "receiptHandle": "rh", "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000",
                           "SenderId": "AIDA", "ApproximateFirstReceiveTimestamp": "1700000000000"},
            "messageAttributes": {}, "md5OfBody": "0" * 32, "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:q", "awsRegion": "us-east-1"}


@settings(max_examples=150, deadline=None)
@given(BODIES | st.just(json.dumps(good())))
def test_the_sqs_record_body_is_the_batch_or_the_error_it_was(body: str) -> None:
    try:
        expected = ListingBatch.model_validate_json(body)
    except ValidationError:
        with pytest.raises(ValidationError) as got:
            ListingBatchRecord.model_validate(sqs_record(body))
        assert got.value.title == "ListingBatchRecord"  # what Powertools fails the one record on
        assert all(e["loc"][0] == "body" for e in got.value.errors())
        return
    same(ListingBatchRecord.model_validate(sqs_record(body)).body, expected)


def envelope(body: str) -> dict[str, Any]:
    return {"message": {"data": base64.b64encode(body.encode("utf-8", "surrogatepass")).decode(),
                        "messageId": "1"}, "subscription": "s"}


PAYLOADS = st.one_of(BODIES.map(envelope), BODIES.map(lambda b: b.encode("utf-8", "surrogatepass")), BODIES,
                     st.just({"message": {"data": "not base64!"}}), st.just({"message": {"data": 5}}),
                     st.just(good()), st.just(envelope(json.dumps(good()))))


@settings(max_examples=200, deadline=None)
@given(PAYLOADS)
def test_the_pubsub_payload_is_the_batch_or_the_error_it_was(payload: Any) -> None:
    try:
        expected = parse(ListingBatch, payload)
    except MalformedMessage as e:
        with pytest.raises(MalformedMessage) as got:
            parse_batch(payload)
        assert str(got.value) == str(e)
        return
    same(parse_batch(payload), expected)
