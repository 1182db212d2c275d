"""Durable waits: sleeps, events and child runs. A waiting run is a row, never a process.

The due time of a wait is stored with the run the first time the workflow reaches
it (``runs.waiting``), so a restart neither restarts the clock nor loses it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from statekeep._check import MAX_DEPTH, check_id, check_seconds
from statekeep.errors import ChildRunFailedError, InvalidInputError, Suspended
from statekeep.workflow import codec
from statekeep.workflow._types import RunStatus
from statekeep.workflow.execution import Execution
from statekeep.workflow.registry import Workflow
from statekeep.workflow.run_write import RunWrite, now


def sleep(exe: Execution, name: str, seconds: float | None, until: datetime | None) -> None:
    """Park the run as ``sleeping`` until the due time; a no-op once it has passed."""
    if (seconds is None) == (until is None):
        raise InvalidInputError("give exactly one of seconds or until", field="seconds")
    if seconds is not None:  # a deadline already past (negative seconds) is a sleep of 0
        seconds = check_seconds(seconds, "seconds", past_is_zero=True)
    if until is not None and (not isinstance(until, datetime) or until.tzinfo is None):
        raise InvalidInputError("must be a timezone-aware datetime", field="until")
    seq, recorded = exe.position(check_id(name, "sleep name"), "sleep")
    if recorded is not None:
        return
    due = _due(exe, seq, "sleep", seconds, until)
    assert due is not None
    with exe.write() as tx:
        if due <= now():
            exe.record(tx, seq, name, "sleep", codec.digest(due.isoformat()), "null")
            return
        tx.suspend(RunStatus.SLEEPING, due, {"kind": "sleep", "seq": seq, "until": due.isoformat()})
    raise Suspended(exe.run_id, RunStatus.SLEEPING.value, {"until": due.isoformat()})


def wait_for_event(exe: Execution, name: str, timeout: float | None, default: Any) -> Any:
    """Consume the next event ``name`` sent to the run, waiting durably until it arrives or times out."""
    if timeout is not None:
        timeout = check_seconds(timeout, "timeout", past_is_zero=True)
    seq, recorded = exe.position(check_id(name, "event name"), "event")
    if recorded is not None:
        value = recorded.value
        return value["payload"] if value["received"] else default
    due = _due(exe, seq, "event", timeout, None)
    with exe.write() as tx:
        received, payload = tx.take_event(name, seq)
        if received or (due is not None and due <= now()):
            output = codec.to_json({"received": received, "payload": payload}, limit=MAX_DEPTH + 1)
            exe.record(tx, seq, name, "event", codec.digest(name), output)
            return payload if received else default
        until = None if due is None else due.isoformat()
        waiting = {"kind": "event", "event": name, "seq": seq, "until": until}
        tx.suspend(RunStatus.WAITING_FOR_EVENT, due, waiting)
    raise Suspended(exe.run_id, RunStatus.WAITING_FOR_EVENT.value, {"event": name, "until": until})


def child(
    exe: Execution, workflow: Workflow[Any, Any], run_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run a child workflow inline (or wait for it) and record its output as this step's.

    Creating and taking the child are both fenced by this run's lease: a stale
    holder of the parent can do neither. A child that another worker holds is left
    to it, and this run waits until the child finishes.
    """
    seq, recorded = exe.position(workflow.name, "child")
    if recorded is not None:
        return recorded.value
    run = exe.children.open_child(workflow, run_id, args, kwargs, exe.run)
    if run.parent_id != exe.run_id:
        raise InvalidInputError(f"run {run_id!r} already exists outside this parent", field="run_id")
    if not run.status.finished:
        run = exe.children.run_child(run, exe.run)
    if run.status is RunStatus.COMPLETED:
        return exe.commit(seq, workflow.name, "child", codec.digest(run_id), codec.to_json(run.output))
    if run.status.finished:
        raise ChildRunFailedError(exe.run_id, run_id, run.status.value, run.error)
    with exe.write() as tx:
        _wait_for_child(tx, run_id, seq)
    raise Suspended(exe.run_id, RunStatus.WAITING_FOR_CHILD.value, {"child": run_id})


def _wait_for_child(tx: RunWrite, run_id: str, seq: int) -> None:
    tx.suspend(RunStatus.WAITING_FOR_CHILD, None, {"kind": "child", "child": run_id, "seq": seq})
    # the child may have finished between our look and this lock: then wake at once
    if tx.child_finished(run_id):
        tx.wake([RunStatus.WAITING_FOR_CHILD])


def _due(
    exe: Execution, seq: int, kind: str, seconds: float | None, until: datetime | None
) -> datetime | None:
    """The stored due time of this wait, or a new one from ``seconds`` / ``until``."""
    waiting = exe.run.waiting or {}
    if waiting.get("kind") == kind and waiting.get("seq") == seq:
        stored = waiting.get("until")
        return None if stored is None else datetime.fromisoformat(stored).astimezone(UTC)
    if until is not None:
        return until.astimezone(UTC)
    return None if seconds is None else now() + timedelta(seconds=seconds)
