"""Bad input to the context stores: InvalidInputError naming the field, and nothing appended.

Each case escaped as TypeError, ValueError or OverflowError before, or (tool-call
arguments given as a list of pairs) was stored as something else than was sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from statekeep.context import ContextStore, Message
from statekeep.errors import InvalidInputError


def _assistant_calling(arguments: Any) -> dict[str, Any]:
    call = {"id": "c", "name": "t", "arguments": arguments}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.extend("s1", None), "messages"),
        (lambda s: s.extend("s1", 5), "messages"),
        (lambda s: s.extend("s1", {"role": "user", "content": "hi"}), "messages"),
        (lambda s: s.extend("s1", "hi"), "messages"),
        (lambda s: s.events("s1", after=10**30), "after"),
        (lambda s: s.events("s1", upto=2**63), "upto"),
        (lambda s: s.compact("s1", upto=10**30), "upto"),
        (lambda s: s.append("s1", _assistant_calling("ab")), "tool_call.arguments"),
        (lambda s: s.append("s1", _assistant_calling(["ab"])), "tool_call.arguments"),
        (lambda s: s.append("s1", _assistant_calling('{"a": 1}')), "tool_call.arguments"),
        (lambda s: s.build("s1", 1000, memories=[{"content": "\ud800"}]), "memories.content"),
        (lambda s: s.build("s1", 1000, compact="yes"), "compact"),
        (lambda s: s.build("s1", 1000, compact=None), "compact"),
        (
            lambda s: s.append("s1", {"role": "tool", "content": "x", "tool_call_id": "c", "is_error": "no"}),
            "message.is_error",
        ),
        (lambda s: s.append("s1", Message("user", "x", is_error="yes")), "message.is_error"),  # type: ignore[arg-type]
        (lambda s: s.build("s1", 1000, memories=[{"content": "ok", "run_id": "\ud800"}]), "memories.run_id"),
    ],
)
def test_bad_arguments_are_refused_and_nothing_is_appended(
    store: ContextStore, call: Callable[[ContextStore], Any], field: str
) -> None:
    store.append("s1", {"role": "user", "content": "hello"})
    with pytest.raises(InvalidInputError) as err:
        call(store)
    assert err.value.field == field
    assert [e.seq for e in store.events("s1")] == [1]


def test_the_last_64_bit_sequence_number_is_a_valid_bound(store: ContextStore) -> None:
    """upto may be 2**63 - 1 (read everything); after it, there is nothing."""
    store.append("s1", {"role": "user", "content": "hello"})
    assert [e.seq for e in store.events("s1", upto=2**63 - 1)] == [1]
    assert store.events("s1", after=2**63 - 1) == []
