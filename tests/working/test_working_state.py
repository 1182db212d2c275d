"""The working-state store's input checks; its invariants are the conformance suite (test_suite.py)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from statekeep.errors import InvalidInputError, StateValidationError
from statekeep.working import WorkingState, WorkingStateStore


class Plan(WorkingState):
    state_schema: ClassVar[str] = "plan"
    state_version: ClassVar[int] = 1
    steps: list[str] = []


def test_not_a_model_is_refused(store: WorkingStateStore) -> None:
    """Only pydantic models are stored: no pickle, no arbitrary objects."""
    with pytest.raises(StateValidationError):
        store.save("run", {"a": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("run_id", ["", None, "x" * 256, 42, "a\x00b", "\ud800"])
def test_bad_run_id_is_refused(store: WorkingStateStore, run_id: object) -> None:
    """Run ids are non-empty strings of at most 255 characters that every backend can store."""
    with pytest.raises(InvalidInputError) as err:
        store.save(run_id, Plan())  # type: ignore[arg-type]
    assert err.value.field == "run_id"


class Budget(WorkingState):
    state_schema: ClassVar[str] = "budget"
    state_version: ClassVar[int] = 1
    cents: int = 0


def test_loading_with_another_state_class_names_both_schemas(store: WorkingStateStore) -> None:
    """The same version number on both sides said nothing: the message names the stored schema and the fix."""
    from statekeep.errors import SchemaVersionError

    store.save("r-schema", Plan(steps=["a"]))
    with pytest.raises(SchemaVersionError) as err:
        store.load("r-schema", Budget)
    assert "stores schema 'plan', not 'budget'" in str(err.value)
    assert "the state class it was saved with" in str(err.value)
