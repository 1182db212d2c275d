"""The workflow contract checks arguments once, on the base: a backend's primitives never see bad input."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from statekeep.errors import InvalidInputError
from statekeep.workflow import InMemoryWorkflowStore, SQLWorkflowStore, WorkflowStore

_PRIMITIVES = (
    "_find",
    "_list_runs",
    "_search_runs",
    "_cancel",
    "_retry",
    "_fork",
    "_journal",
    "_replay",
    "_tool_calls",
    "_tool_call",
    "_approvals",
    "_approval",
    "_decide",
    "_send_event",
    "_finished_runs",
    "_delete_runs",
    "_runs_of",
    "_delete_owner",
)


class Watched(InMemoryWorkflowStore):
    """The in-memory backend, noting every primitive called."""

    def __init__(self) -> None:
        super().__init__()
        self.called: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        found = object.__getattribute__(self, name)
        if name not in _PRIMITIVES:
            return found
        called: list[str] = object.__getattribute__(self, "called")

        def noted(*args: Any, **kwargs: Any) -> Any:
            called.append(name)
            return found(*args, **kwargs)

        return noted


BAD: dict[str, Callable[[WorkflowStore], object]] = {
    "find": lambda s: s.find(""),
    "list_runs": lambda s: s.list_runs(limit=0),
    "search_runs": lambda s: s.search_runs(status="nope"),
    "cancel": lambda s: s.cancel("x" * 256),
    "retry": lambda s: s.retry("a\x00b"),
    "fork": lambda s: s.fork("r", -1, {"run_id": "f", "input": None, "input_hash": ""}),
    "journal": lambda s: s.journal("r", 1, -1),
    "replay": lambda s: s.replay("", 1, 10),
    "tool_calls": lambda s: s.tool_calls(""),
    "tool_call": lambda s: s.tool_call("r", 2**31),
    "approvals": lambda s: s.approvals(status="maybe"),
    "approval": lambda s: s.approval(""),
    "decide": lambda s: s.decide("a", approve=True, by=" "),
    "send_event": lambda s: s.send_event("r", ""),
    "purgeable": lambda s: s.purgeable(),
    "delete_runs": lambda s: s.delete_runs("r"),  # type: ignore[arg-type]
    "runs_of": lambda s: s.runs_of(""),
    "delete_owner": lambda s: s.delete_owner(""),
}


@pytest.mark.parametrize("method", sorted(BAD))
def test_bad_input_is_refused_before_any_primitive_runs(method: str) -> None:
    """Each public method refuses a bad argument itself: no primitive of the backend is called."""
    store = Watched()
    with pytest.raises(InvalidInputError):
        BAD[method](store)
    assert store.called == []


def test_good_input_reaches_the_primitive_checked() -> None:
    """A checked call goes to its primitive: the base adds no second path around the backend."""
    store = Watched()
    assert store.find("r") is None
    assert store.purgeable(older_than=timedelta(0)) == []
    assert store.called == ["_find", "_finished_runs"]


@pytest.mark.parametrize("store", [InMemoryWorkflowStore, lambda: SQLWorkflowStore("sqlite:///:memory:")])
def test_claim_takes_its_workflow_pairs_as_any_two_item_sequences(store: Callable[[], WorkflowStore]) -> None:
    """(workflow, version) pairs given as lists (decoded JSON, say) are claimed from as tuples are."""
    s = store()
    assert s.claim("w", 1.0, 5, [["wf", 1], ["wf", 1]]) == []  # type: ignore[list-item]
    s.close()
