"""``write_json_document`` (``run --json``) prints byte for byte what ``json.dumps(indent=2)`` would."""

from __future__ import annotations

import io
import json

from hypothesis import given
from hypothesis import strategies as st

from orphan_cleanup.cli.output import write_json_document

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@given(head=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "groups"), values, max_size=5),
       groups=st.lists(st.dictionaries(st.text(max_size=6), values, max_size=4), max_size=4))
def test_the_streamed_document_is_the_dumped_one(head, groups):
    out = io.StringIO()
    write_json_document(head, "groups", iter(groups), out)
    assert out.getvalue() == json.dumps({**head, "groups": groups}, indent=2) + "\n"
