"""Exact JSON: what a step returns on replay is exactly what it returned the first time."""

from __future__ import annotations

import json
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


@given(json_values, st.sampled_from(["", " ", "\n", " \t\r\n"]), st.sampled_from(["", " ", "\n"]))
def test_loads_reads_what_json_loads_reads(value: Any, before: str, after: str) -> None:
    """Text written elsewhere (whitespace around it, indented) decodes as ``json.loads`` decodes it."""
    text = before + json.dumps(value, indent=1) + after
    assert codec.loads(text) == json.loads(text)


@pytest.mark.parametrize("bad", ["", " ", "[1", "1 x", "{}{}", "nul", "'a'", "[1,]"])
def test_loads_refuses_what_json_loads_refuses(bad: str) -> None:
    """Text that is not one JSON document raises json's own error, with its message."""
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(bad)
    with pytest.raises(json.JSONDecodeError) as ours:
        codec.loads(bad)
    assert str(ours.value) == str(theirs.value)
