"""The ``ListingBatch`` queue body decoded by msgspec (issue #17 item 4).

A classifier spent as long validating its queue body with pydantic as handling it.
``listing_batch_from_json`` parses and type-checks the body in C against Structs that
mirror the models, checks the models' own validators in Python, and builds the frozen
models as ``model_construct`` does, without a pydantic validation per row. The body is a
hint that may be altered (DESIGN §5 rule 12): anything this path is not sure to decode
exactly as pydantic would goes to pydantic, which decides as before (the same batch or
the same ``ValidationError``). tests/unit/test_wire.py checks both give equal objects
(values, types, fields set) or both refuse.

What the fast path leaves to pydantic, and why (each seen to differ, or not worth it):

- anything msgspec refuses: lax coercions pydantic does from JSON (``"5"`` or ``5.0``
  for an int, ``"true"`` or ``1`` for a bool, a Unix time or a date alone for a datetime),
  ``NaN``/``Infinity`` and floats out of range (pydantic: ``inf``), ints of more than
  4,300 digits, invalid UTF-8 or lone surrogates, unknown or missing keys, a wrong type;
- a fraction of a second of more than 6 digits (msgspec rounds it, pydantic truncates),
  found by a scan of the raw body; a ``\\u`` escape anywhere in the body (an escaped digit
  or dot would hide such a fraction from that scan);
- ``details`` nested more than ``MAX_DETAILS_DEPTH`` deep (pydantic's JSON parser has a
  recursion limit that msgspec's does not share);
- a group whose ``malformed_ref`` disagrees with its ref, a group key twice, a NUL in the
  backend id: the models' validators, which pydantic words (JSON holds a NUL only as
  ``\\u0000``, refused above already: that check stands in case the escape rule changes).

A JSON key given twice is not among them: msgspec, pydantic and ``json.loads`` all keep
the last value, and pydantic counts the field as set, as the fast path does.

Timestamps: an offset other than UTC gets pydantic's ``TzInfo``; UTC keeps msgspec's
``timezone.utc``, equal to pydantic's ``TzInfo(0)`` with the same name and offset
(converting every timestamp of a batch cost a fifth of the decode).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType
from pydantic import BaseModel
from pydantic_core import TzInfo

from orphan_cleanup.messages import ListingBatch
from orphan_cleanup.models import REF_PATTERN, Mode, RegionFailure, Resource, ResourceGroup, ResourceKind, ResourceState

#: How many containers deep a value of a resource's ``details`` may nest on the fast path
#: (listings write flat ones); deeper goes to pydantic, whose JSON parser has a recursion
#: limit that msgspec's does not share.
MAX_DETAILS_DEPTH = 6  # the Decoder is built in time exponential in it: 0.7 ms at 6, 1.6 s at 16
Protection = Literal["deletion_protection", "termination_protection"]
_Leaf = str | int | float | bool | None  # as JSON has them: an int stays an int, a float a float
_Nested: Any = _Leaf
for _ in range(MAX_DETAILS_DEPTH):
    _Nested = Union[_Leaf, list[_Nested], dict[str, _Nested]]  # noqa: UP007  (a runtime-built type)


class _Resource(msgspec.Struct, forbid_unknown_fields=True):
    kind: ResourceKind
    id: Annotated[str, Meta(min_length=1)]
    region: str
    state: ResourceState | UnsetType = UNSET
    tags: dict[str, str] | UnsetType = UNSET
    created_at: datetime | None | UnsetType = UNSET
    attached_to: str | None | UnsetType = UNSET
    details: dict[str, _Nested] | UnsetType = UNSET  # type: ignore[valid-type]
    controller: str | None | UnsetType = UNSET
    protection: Protection | None | UnsetType = UNSET


class _Group(msgspec.Struct, forbid_unknown_fields=True):
    provider_ref: Annotated[str, Meta(max_length=1024)]
    region: str
    primary_id: str | None | UnsetType = UNSET
    resources: tuple[_Resource, ...] | UnsetType = UNSET
    malformed_ref: bool | UnsetType = UNSET


class _Failure(msgspec.Struct, forbid_unknown_fields=True):
    region: str
    error: str


class _Batch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):  # kw_only: the model's order
    v: Literal[1] | UnsetType = UNSET
    cycle_id: Annotated[str, Meta(min_length=1, max_length=64)]
    backend: Annotated[str, Meta(min_length=1, max_length=200)]
    seq: Annotated[int, Meta(ge=0)]
    listed_at: datetime
    mode: Mode | UnsetType = UNSET
    record_all: bool | UnsetType = UNSET
    groups: tuple[_Group, ...] | UnsetType = UNSET
    last: bool | UnsetType = UNSET
    batch_count: Annotated[int, Meta(ge=1)] | None | UnsetType = UNSET
    failures: tuple[_Failure, ...] | UnsetType = UNSET


# Each Struct mirrors its model: the same fields in the same order, required where the
# model requires them and ``UNSET`` (so ``model_fields_set`` can be told) where it has a
# default. A field added to a model and not here fails at import.
_MIRRORS: tuple[tuple[type[BaseModel], type[msgspec.Struct]], ...] = (
    (Resource, _Resource), (ResourceGroup, _Group), (RegionFailure, _Failure), (ListingBatch, _Batch))
for _m, _s in _MIRRORS:
    assert tuple(_m.model_fields) == _s.__struct_fields__, f"{_s.__name__} must mirror {_m.__name__}"
    assert ({f.name for f in msgspec.structs.fields(_s) if f.required}
            == {n for n, f in _m.model_fields.items() if f.is_required()}), f"{_s.__name__}: required fields"
assert get_args(Resource.model_fields["protection"].annotation)[0] == Protection

_BATCH = msgspec.json.Decoder(_Batch)
_LONG_FRACTION = re.compile(r"\.[0-9]{7}")
_LONG_FRACTION_B = re.compile(rb"\.[0-9]{7}")
_new, _set, _asdict = object.__new__, object.__setattr__, msgspec.structs.asdict
_TZ: dict[Any, TzInfo] = {}
_RESOURCE_FIELDS, _GROUP_FIELDS, _FAILURE_FIELDS = (
    frozenset(m.model_fields) for m in (Resource, ResourceGroup, RegionFailure))


class _Refused(Exception):
    """The fast path is not sure: pydantic decides."""


def listing_batch_from_json(body: str | bytes) -> ListingBatch:
    """A queue body as ``ListingBatch.model_validate_json(body)`` gives it: an equal batch
    (values, types, fields set of every model) or the same ``ValidationError``."""
    batch = fast_listing_batch(body)
    return ListingBatch.model_validate_json(body) if batch is None else batch


def fast_listing_batch(body: str | bytes) -> ListingBatch | None:
    """The batch, or ``None`` where only pydantic may decide (see the module docstring).
    The batch is also what ``ListingBatch.model_validate(json.loads(body))`` gives."""
    # a backslash is rare (the lister escapes only control characters, quotes and
    # backslashes): a fast look for it, then the slower one for an escape that hides a digit
    if isinstance(body, str):
        if ("\\" in body and "\\u" in body) or _LONG_FRACTION.search(body):
            return None
    elif (b"\\" in body and b"\\u" in body) or _LONG_FRACTION_B.search(body):
        return None
    try:
        row = _BATCH.decode(body)
    except Exception:  # any refusal (a RecursionError, a UnicodeError on a str included)
        return None
    try:
        return _batch(row)
    except _Refused:
        return None


def _batch(row: _Batch) -> ListingBatch:
    if "\x00" in row.backend:
        raise _Refused
    d = _asdict(row)
    fields_set = _fill(ListingBatch, d)
    d["listed_at"] = _tz(d["listed_at"])
    groups = d["groups"] = _groups(d["groups"])
    d["failures"] = tuple(_model(RegionFailure, _asdict(f), set(_FAILURE_FIELDS)) for f in d["failures"])
    if len({g.key for g in groups}) != len(groups):
        raise _Refused
    return _model(ListingBatch, d, fields_set)


def _groups(rows: tuple[_Group, ...]) -> tuple[ResourceGroup, ...]:
    # One loop per level, its work inline: this runs once per group and per resource.
    new, setattr_, asdict, unset, utc, valid = _new, _set, _asdict, UNSET, UTC, REF_PATTERN.fullmatch
    all_of_resource, all_of_group = set(_RESOURCE_FIELDS), set(_GROUP_FIELDS)
    out = []
    for row in rows:
        d = asdict(row)
        fields_set = _fill(ResourceGroup, d) if unset in d.values() else all_of_group.copy()
        if (valid(d["provider_ref"]) is not None) == d["malformed_ref"]:
            raise _Refused
        resources = []
        for r in d["resources"]:
            rd = asdict(r)
            r_set = _fill(Resource, rd) if unset in rd.values() else all_of_resource.copy()
            created = rd["created_at"]
            if created is not None and created.tzinfo is not utc:
                rd["created_at"] = _tz(created)
            obj = new(Resource)
            setattr_(obj, "__dict__", rd)
            setattr_(obj, "__pydantic_fields_set__", r_set)
            setattr_(obj, "__pydantic_extra__", None)
            setattr_(obj, "__pydantic_private__", None)
            resources.append(obj)
        d["resources"] = tuple(resources)
        group = new(ResourceGroup)
        setattr_(group, "__dict__", d)
        setattr_(group, "__pydantic_fields_set__", fields_set)
        setattr_(group, "__pydantic_extra__", None)
        setattr_(group, "__pydantic_private__", None)
        out.append(group)
    return tuple(out)


def _tz(when: datetime) -> datetime:
    """``when`` with the tzinfo pydantic gives an offset it parsed (a ``TzInfo``, whose
    name is ``+02:00`` where ``timezone``'s is ``UTC+02:00``); UTC is left as it is."""
    tz = when.tzinfo
    if tz is None or tz is UTC:
        return when
    mine = _TZ.get(tz)
    if mine is None:
        offset = tz.utcoffset(None)
        assert offset is not None
        mine = _TZ.setdefault(tz, TzInfo(int(offset.total_seconds())))
    return when.replace(tzinfo=mine)


def _fill(model: type[BaseModel], d: dict[str, Any]) -> set[str]:
    """The fields given (all, for a body the lister wrote); pydantic's defaults put in for the others."""
    if UNSET not in d.values():
        return set(d)
    given = {k for k, v in d.items() if v is not UNSET}
    for name, field in model.model_fields.items():
        if name not in given:
            d[name] = field.get_default(call_default_factory=True)
    return given


def _model(model: type[Any], d: dict[str, Any], fields_set: set[str]) -> Any:
    obj = _new(model)
    _set(obj, "__dict__", d)
    _set(obj, "__pydantic_fields_set__", fields_set)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj
