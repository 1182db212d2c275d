"""Exact JSON: what a step returns on replay is exactly what it returned the first time."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekeep.workflow import codec

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_every_json_value_round_trips_exactly(value: Any) -> None:
    """Any JSON value encodes, and decodes back equal and of the same shape."""
    text = codec.to_json(value)
    assert codec.loads(text) == value
    assert codec.to_json(codec.loads(text)) == text


@given(json_values)
def test_digest_ignores_key_order(value: Any) -> None:
    """The input hash of a dict does not depend on its key order."""
    if isinstance(value, dict):
        assert codec.digest(dict(reversed(list(value.items())))) == codec.digest(value)


@pytest.mark.parametrize("bad", [(1, 2), {1: "a"}, {"a": {1, 2}}, float("nan"), object(), [b"x"]])
def test_values_that_would_change_on_replay_are_refused(bad: Any) -> None:
    """Tuples, non-string keys, sets, NaN, bytes and objects are refused rather than silently changed."""
    with pytest.raises(codec.NotJSONError):
        codec.to_json(bad)
