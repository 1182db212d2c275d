"""Who a tool runs for, and how many turns this invocation may still run: context variables."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from statekeep.errors import InvalidInputError


@dataclass(frozen=True)
class RunScope:
    """Who and where a tool runs for: ``Runtime.remember`` reads it for provenance."""

    owner: str
    session_id: str
    run_id: str
    event_id: int | None


run_scope: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar("statekeep_run", default=None)
#: turns this invocation may still run before the run parks; None: no limit
turns_left: contextvars.ContextVar[int | None] = contextvars.ContextVar("statekeep_turns", default=None)


def current_scope() -> RunScope | None:
    """The run a tool is executing for, or None outside a run."""
    return run_scope.get()


@contextmanager
def turn_limit(turns: int | None) -> Iterator[None]:
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise InvalidInputError("must be an int >= 1, or None", field="turns")
    token = turns_left.set(turns)
    try:
        yield
    finally:
        turns_left.reset(token)
