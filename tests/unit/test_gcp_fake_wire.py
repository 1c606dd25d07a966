"""The fake Compute server's filter parser and paging (pure functions)."""

from __future__ import annotations

import pytest

from tests.support.gcp_fake_wire import WireError, aggregated_page, page_params, parse_filter

VM = {"name": "vm-1", "status": "RUNNING", "labels": {"provider_ref": "aaaaaaaaaaa1", "env": "prod"},
      "id": "4100000007919000013"}
BARE = {"name": "vm-2", "status": "RUNNING", "id": "4100000007919000021"}


@pytest.mark.parametrize(
    ("text", "vm", "bare"),
    [
        ("labels.provider_ref:*", True, False),
        ("(labels.provider_ref:*)", True, False),
        ("labels.env=prod AND labels.provider_ref:*", True, False),
        ("(labels.env = prod) (name eq vm-.*)", True, False),
        ('labels.env!="dev"', True, True),
        ("labels.provider_ref eq aaaa.*", True, False),
    ],
)
def test_filter(text: str, vm: bool, bare: bool) -> None:
    pred, keys, ids = parse_filter(text)
    assert (pred(VM), pred(BARE)) == (vm, bare)
    assert keys and ids == frozenset()


@pytest.mark.parametrize("text", ["id = 4100000007919000013", "id=4100000007919000013", 'id = "4100000007919000013"',
                                  "id eq 4100000007919000013", "(id = 4100000007919000013)",
                                  "(id = 4100000007919000013) AND (status = RUNNING)"])
def test_an_id_term_pins_that_id_and_matches_it_alone_whatever_the_labels(text: str) -> None:
    pred, keys, ids = parse_filter(text)
    assert ids == frozenset({VM["id"]}) and keys == frozenset()
    assert (pred(VM), pred(BARE), pred({**VM, "labels": {}})) == (True, False, True)


def test_an_id_term_with_labels_names_both_and_a_negated_id_pins_nothing() -> None:
    flt = parse_filter(f"labels.provider_ref:* AND id = {VM['id']}")
    assert (flt.label_keys, flt.ids, flt.predicate(VM), flt.predicate({**VM, "labels": {}})) == (
        frozenset({"provider_ref"}), frozenset({VM["id"]}), True, False)
    negated = parse_filter(f"id != {VM['id']}")
    assert (negated.ids, negated.predicate(VM), negated.predicate(BARE)) == (frozenset(), False, True)


@pytest.mark.parametrize("text", ["", "labels.a:* OR labels.b:*", "zone:*", "labels.a:* )", "(labels.a:*", "???",
                                  "id = vm-1", "id = -1", "id:*", "id = 18446744073709551616"])
def test_unparseable_filter_is_400(text: str) -> None:
    with pytest.raises(WireError) as info:
        parse_filter(text)
    assert info.value.status == 400


def test_name_only_filter_mentions_no_label() -> None:
    assert parse_filter("name eq vm-.*")[1] == frozenset()


def test_pages_split_scopes_and_chain_tokens() -> None:
    units = [("zones/a", "item", {"name": str(n)}) for n in range(3)] + [("zones/b", "warning", {"code": "X"})]
    first, token = aggregated_page(units, "instances", 0, 2)
    assert first == {"zones/a": {"instances": [{"name": "0"}, {"name": "1"}]}}
    offset, size = page_params({"pageToken": token or "", "maxResults": "2"})
    second, token2 = aggregated_page(units, "instances", offset, size)
    assert second == {"zones/a": {"instances": [{"name": "2"}]}, "zones/b": {"warning": {"code": "X"}}}
    assert token2 is None


@pytest.mark.parametrize("query", [{"maxResults": "0"}, {"maxResults": "501"}, {"maxResults": "x"}, {"pageToken": "!!"}])
def test_bad_paging_is_400(query: dict[str, str]) -> None:
    with pytest.raises(WireError):
        page_params(query)
