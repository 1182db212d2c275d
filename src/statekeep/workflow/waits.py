"""Durable waits: sleeps, events and child runs. A waiting run is a row, never a process.

The due time of a wait is stored with the run the first time the workflow reaches
it (``runs.waiting``), so a restart neither restarts the clock nor loses it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from statekeep._numbers import check_seconds
from statekeep._text import check_id
from statekeep.errors import ChildRunFailedError, InvalidInputError, Suspended
from statekeep.workflow import codec, gates, store
from statekeep.workflow._types import RunStatus
from statekeep.workflow.registry import Workflow

if TYPE_CHECKING:
    from statekeep.workflow.context import RunContext


def sleep(ctx: RunContext, name: str, seconds: float | None, until: datetime | None) -> None:
    """Park the run as ``sleeping`` until the due time; a no-op once it has passed."""
    if (seconds is None) == (until is None):
        raise InvalidInputError("give exactly one of seconds or until", field="seconds")
    if seconds is not None:  # a deadline already past (negative seconds) is a sleep of 0
        seconds = check_seconds(seconds, "seconds", past_is_zero=True)
    if until is not None and (not isinstance(until, datetime) or until.tzinfo is None):
        raise InvalidInputError("must be a timezone-aware datetime", field="until")
    seq, recorded = ctx._position(check_id(name, "sleep name"), "sleep")
    if recorded is not None:
        return
    due = _due(ctx, seq, "sleep", seconds, until)
    assert due is not None
    with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
        if due <= store.now():
            ctx._write(conn, seq, name, "sleep", codec.digest(due.isoformat()), "null", 1, store.now())
            return
        _suspend(ctx, conn, RunStatus.SLEEPING, due, {"kind": "sleep", "seq": seq, "until": due.isoformat()})
    raise Suspended(ctx.run_id, RunStatus.SLEEPING.value, {"until": due.isoformat()})


def wait_for_event(ctx: RunContext, name: str, timeout: float | None, default: Any) -> Any:
    """Consume the next event ``name`` sent to the run, waiting durably until it arrives or times out."""
    if timeout is not None:
        timeout = check_seconds(timeout, "timeout", past_is_zero=True)
    seq, recorded = ctx._position(check_id(name, "event name"), "event")
    if recorded is not None:
        value = recorded.value
        return value["payload"] if value["received"] else default
    due = _due(ctx, seq, "event", timeout, None)
    with ctx.engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
        received, payload = gates.take_event(conn, ctx.run_id, name, seq)
        if received or (due is not None and due <= store.now()):
            output = codec.to_json({"received": received, "payload": payload})
            ctx._write(conn, seq, name, "event", codec.digest(name), output, 1, store.now())
            return payload if received else default
        until = None if due is None else due.isoformat()
        _suspend(
            ctx,
            conn,
            RunStatus.WAITING_FOR_EVENT,
            due,
            {"kind": "event", "event": name, "seq": seq, "until": until},
        )
    raise Suspended(ctx.run_id, RunStatus.WAITING_FOR_EVENT.value, {"event": name, "until": until})


def child(
    ctx: RunContext, workflow: Workflow[Any, Any], run_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run a child workflow inline (or wait for it) and record its output as this step's."""
    seq, recorded = ctx._position(workflow.name, "child")
    if recorded is not None:
        return recorded.value
    engine = ctx.engine
    run = engine._open(workflow, run_id, args, kwargs, parent_id=ctx.run_id)
    if run.parent_id != ctx.run_id:
        raise InvalidInputError(f"run {run_id!r} already exists outside this parent", field="run_id")
    if not run.status.finished:
        run = engine._take_and_execute(run)
    if run.status is RunStatus.COMPLETED:
        return ctx._commit(
            seq, workflow.name, "child", codec.digest(run_id), codec.to_json(run.output), 1, store.now()
        )
    if run.status.finished:
        raise ChildRunFailedError(ctx.run_id, run_id, run.status.value, run.error)
    with engine.store.fenced(ctx.run_id, ctx.run.epoch) as conn:
        _suspend(ctx, conn, RunStatus.WAITING_FOR_CHILD, None, {"kind": "child", "child": run_id, "seq": seq})
        # the child may have finished between our look and this lock: then wake at once
        if engine.store._get(conn, run_id).status.finished:
            store.wake(conn, ctx.run_id, [RunStatus.WAITING_FOR_CHILD])
    raise Suspended(ctx.run_id, RunStatus.WAITING_FOR_CHILD.value, {"child": run_id})


def _due(
    ctx: RunContext, seq: int, kind: str, seconds: float | None, until: datetime | None
) -> datetime | None:
    """The stored due time of this wait, or a new one from ``seconds`` / ``until``."""
    waiting = ctx.run.waiting or {}
    if waiting.get("kind") == kind and waiting.get("seq") == seq:
        stored = waiting.get("until")
        return None if stored is None else datetime.fromisoformat(stored).astimezone(UTC)
    if until is not None:
        return until.astimezone(UTC)
    return None if seconds is None else store.now() + timedelta(seconds=seconds)


def _suspend(
    ctx: RunContext, conn: Any, status: RunStatus, due: datetime | None, waiting: dict[str, Any]
) -> None:
    store.suspend(conn, ctx.run_id, status, due, json.dumps(waiting))
