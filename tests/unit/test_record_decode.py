"""The ledger records' fast decoder (msgspec, ``queries.records_from_json``) gives what
pydantic's validation of the same document gives: equal values of the same types, the
same fields set, or the same refusal (issue #17 item 4)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from orphan_cleanup.core.owners import LedgerRecord, LedgerRow
from orphan_cleanup.ledger.queries import records_from_json

REFERENCE = TypeAdapter(list[LedgerRecord])  # the pydantic path the join used before

texts = st.text(max_size=12)
offsets = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))])
stamps = st.builds(lambda d, tz: d.replace(tzinfo=tz).isoformat(),
                   st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1)), offsets)
# what JOIN_SQL writes (json_build_object), and values it never writes that a pydantic
# model would still coerce or refuse: the fast path must fall back to the same answer
odd = st.none() | st.integers() | st.booleans() | texts | st.just("2024-01-01 10:00") | st.just("infinity") \
    | st.lists(texts, max_size=2) | st.dictionaries(texts, texts, max_size=2)
row = st.fixed_dictionaries({
    "provider_ref": texts, "owner_type": texts, "owner_id": st.none() | texts, "owner_name": st.none() | texts,
    "issued_at": st.none() | stamps, "instance_found": st.booleans(),
    "status": st.none() | st.sampled_from(["idle", "busy", "pending", "weird"]), "backend_id": st.none() | texts,
    "primary_id": st.none() | texts, "region": st.none() | texts, "created_at": st.none() | stamps,
    "provisioned_at": st.none() | stamps, "terminated_at": st.none() | stamps, "deleted_at": st.none() | stamps,
    "owner_backend_scope": st.none() | texts, "known_orphan_resource_ids": st.lists(texts, max_size=3),
    "protected_primaries": st.dictionaries(texts, texts, max_size=2)})


def tampered(draw_row: dict, key: str, value: object, drop: bool) -> dict:
    out = dict(draw_row)
    if drop:
        out.pop(key, None)
    else:
        out[key] = value
    return out


def fields(record: object) -> dict[str, object]:
    return {name: getattr(record, name) for name in LedgerRecord.model_fields}


def assert_same(doc: str) -> None:
    try:
        expected = REFERENCE.validate_json(doc)
    except ValidationError as e:
        with pytest.raises(ValidationError) as got:
            records_from_json(doc)
        assert got.value.errors() == e.errors()
        return
    records = records_from_json(doc)
    assert len(records) == len(expected)
    for fast, slow in zip(records, expected, strict=True):
        if isinstance(fast, LedgerRow):  # the fast path: every field was in the document
            assert slow.model_fields_set == set(LedgerRecord.model_fields)
        else:  # pydantic's own answer (a document msgspec refused)
            assert fast == slow and fast.model_fields_set == slow.model_fields_set
        assert fields(fast) == fields(slow)
        assert {k: type(v) for k, v in fields(fast).items()} == {k: type(v) for k, v in fields(slow).items()}


def test_a_join_document_decodes_to_rows_without_a_model_per_ref():
    doc = json.dumps([{**{k: None for k in LedgerRecord.model_fields}, "provider_ref": "abc", "owner_type": "instance",
                       "instance_found": False, "known_orphan_resource_ids": ["vol-1"], "protected_primaries": {}}])
    [record] = records_from_json(doc)
    assert type(record) is LedgerRow and record.known_orphan_resource_ids == frozenset({"vol-1"})
    with pytest.raises(AttributeError):  # frozen, as the model is
        record.status = "idle"  # type: ignore[misc]


@given(st.lists(row, max_size=4))
def test_the_join_document_decodes_to_the_same_records(rows):
    assert_same(json.dumps(rows))


@given(st.lists(row, min_size=1, max_size=3), st.sampled_from(sorted(LedgerRecord.model_fields) + ["extra"]),
       odd, st.booleans())
def test_a_document_the_join_never_writes_gets_the_same_answer(rows, key, value, drop):
    assert_same(json.dumps([tampered(rows[0], key, value, drop), *rows[1:]]))


def test_timestamps_are_equal_instants_with_the_same_offset():
    doc = json.dumps([{**{k: None for k in LedgerRecord.model_fields}, "provider_ref": "abc", "owner_type": "instance",
                       "instance_found": True, "issued_at": "2026-12-01T16:38:06.123456+02:00",
                       "known_orphan_resource_ids": [], "protected_primaries": {}}])
    [fast], [slow] = records_from_json(doc), REFERENCE.validate_json(doc)
    assert fast.issued_at == slow.issued_at == datetime(2026, 12, 1, 14, 38, 6, 123456, tzinfo=UTC)
    assert fast.issued_at.utcoffset() == slow.issued_at.utcoffset() == timedelta(hours=2)
    assert fast.issued_at.isoformat() == slow.issued_at.isoformat()
