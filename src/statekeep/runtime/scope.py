"""Who a tool runs for, and what this invocation of a run asked for: context variables."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from statekeep._check import check_int


@dataclass(frozen=True)
class RunScope:
    """Who and where a tool runs for: ``Runtime.remember`` reads it for provenance."""

    owner: str
    session_id: str
    run_id: str
    event_id: int | None


@dataclass
class Invocation:
    """One call of ``run``/``resume``/``stream`` (sync or async), as the steps of the run see it.

    ``loop`` is the caller's event loop (async calls): async models and tools are
    awaited there, not on the runtime's own loop. ``sink`` receives the typed
    events of a stream. ``turns_left`` bounds the turns this invocation runs
    (None: no bound). ``retry_due`` is set when the run parked to wait before
    retrying a model call, so that the caller can sit a short wait out.
    """

    loop: asyncio.AbstractEventLoop | None = None
    sink: Callable[[Any], None] | None = None
    turns_left: int | None = None
    retry_due: datetime | None = None


run_scope: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar("statekeep_run", default=None)
invocation: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "statekeep_invocation", default=None
)


def current_scope() -> RunScope | None:
    """The run a tool is executing for, or None outside a run."""
    return run_scope.get()


def check_turns(turns: object) -> int | None:
    """A per-invocation turn limit: an int >= 1, or None."""
    return None if turns is None else check_int(turns, "turns", minimum=1)
