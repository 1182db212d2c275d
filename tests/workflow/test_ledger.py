"""The tool-call ledger's input check; its invariants (keys, replay, reconcilers, ambiguous calls)
are in the conformance suite."""

from __future__ import annotations

from typing import Any

import pytest

from statekeep.errors import InvalidInputError
from statekeep.workflow import Registry, RunContext

from .conftest import EngineFactory


def test_non_json_tool_arguments_are_refused_before_the_call(make_engine: EngineFactory) -> None:
    """Arguments that cannot be recorded exactly raise InvalidInputError; the tool never runs."""
    registry = Registry()
    ran: list[int] = []

    @registry.tool()
    def t(key: str, value: Any) -> None:
        ran.append(1)

    @registry.workflow("w", version=1)
    def wf(ctx: RunContext) -> Any:
        return ctx.call_tool(t, object())

    engine = make_engine(registry)
    with pytest.raises(InvalidInputError, match="not JSON"):
        engine.run(wf, "r")
    assert (ran, engine.store.tool_calls("r")) == ([], [])
