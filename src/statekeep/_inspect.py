"""Reading the stores for people: what the CLI and the web console show, computed once.

Nothing here writes. Stores are opened read-only (:mod:`statekeep._open`): a
missing database or folder is an error naming its setting, never a new empty
one. A run's timeline, its model calls (with the
context each one was sent, as the runtime recorded it), its token usage, and
the context the runtime would send next are assembled from the stores alone.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from statekeep._literal import pretty
from statekeep.errors import ConfigError, NotFoundError, StateNotFoundError

if TYPE_CHECKING:
    from statekeep.context import BuiltContext, ContextStore
    from statekeep.memory import MemoryStore
    from statekeep.runtime import Agent
    from statekeep.workflow import Approval, Run, WorkflowStore
    from statekeep.working import WorkingStateStore

# --- runs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    """One model call of an agent run, as its model step recorded it.

    ``context`` is the context the builder produced for the call (sections with
    their tokens and messages), or None when it was not recorded (a run from
    before contexts were recorded, or an answer recovered after a crash).
    """

    turn: int
    seq: int
    at: datetime
    attempt: int
    content: str | None
    tool_calls: list[dict[str, Any]]
    usage: dict[str, int]
    context: dict[str, Any] | None
    failed: dict[str, Any] | None = None


def model_calls(store: WorkflowStore, run_id: str) -> list[ModelCall]:
    """The model calls of an agent run, in order (its ``model-<turn>`` steps)."""
    calls = []
    for step in store.steps(run_id):
        match = re.fullmatch(r"model-(\d+)", step.name)
        if step.kind != "step" or match is None:
            continue
        out = step.value if isinstance(step.value, dict) else {}
        calls.append(
            ModelCall(
                turn=int(match.group(1)),
                seq=step.seq,
                at=step.finished_at,
                attempt=step.attempt,
                content=out.get("content"),
                tool_calls=list(out.get("tool_calls") or []),
                usage=_usage(out.get("usage")),
                context=out.get("context") if isinstance(out.get("context"), dict) else None,
                failed=out.get("failed") if isinstance(out.get("failed"), dict) else None,
            )
        )
    return calls


def _usage(raw: object) -> dict[str, int]:
    """Token usage as a model reported it: ``prompt``, ``completion`` (and ``cached``) tokens."""
    if not isinstance(raw, dict):
        return {}
    names = {"input_tokens": "prompt", "output_tokens": "completion"}
    return {
        names.get(str(k), str(k)): int(v)
        for k, v in raw.items()
        if isinstance(v, int) and not isinstance(v, bool)
    }


def token_usage(calls: Sequence[ModelCall]) -> dict[str, int]:
    """A run's tokens: as the model reported them (``prompt``, ``completion``...), as sent (``context``)."""
    total = {"calls": len(calls), "prompt": 0, "completion": 0, "context": 0}
    for call in calls:
        for name, n in call.usage.items():
            total[name] = total.get(name, 0) + n
        if call.context is not None:
            total["context"] += int(call.context.get("total", 0))
    return total


@dataclass(frozen=True)
class Entry:
    """One line of a run's timeline."""

    at: datetime
    kind: str  # step, model, tool, sleep, event, child, approval, retry, wait
    seq: int | None
    name: str
    detail: str
    status: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def timeline(store: WorkflowStore, run: Run) -> list[Entry]:
    """Everything a run did, in order: steps, model calls, tool calls (key, ledger status), retries,
    waits, approvals and child runs; the wait it is in now comes last."""
    entries: list[Entry] = []
    calls = {t.seq: t for t in store.tool_calls(run.run_id)}
    for s in store.steps(run.run_id):
        data: dict[str, Any] = {"attempt": s.attempt, "state_version": s.state_version, "cursor": s.cursor}
        kind: str = s.kind
        detail = f"attempt {s.attempt}" if s.attempt > 1 else ""
        if s.kind == "step" and re.fullmatch(r"model-\d+", s.name):
            kind = "model"
            out = s.value if isinstance(s.value, dict) else {}
            if out.get("failed"):
                kind, detail = "retry", f"model call failed: {out['failed'].get('error')}"
            else:
                names = [c.get("name") for c in out.get("tool_calls") or []]
                detail = f"asks for {', '.join(map(str, names))}" if names else "answers"
        elif s.kind == "tool":
            call = calls.pop(s.seq, None)
            if call is not None:
                data.update(key=call.key, ledger=call.status, args=call.kwargs or call.args)
                detail = f"key {call.key}"
        elif s.kind == "sleep":
            detail = f"slept until {s.value}" if s.value else "slept"
        elif s.kind == "event":
            detail = "received" if isinstance(s.value, dict) and s.value.get("received") else "timed out"
        elif s.kind == "child":
            detail = "child run finished"
        if s.attempt > 1 and kind != "retry":
            detail = f"{detail}; succeeded on attempt {s.attempt}".lstrip("; ")
        status = data.get("ledger", "completed") if kind == "tool" else "completed"
        entries.append(Entry(s.finished_at, kind, s.seq, s.name, detail, status, data))
    for t in calls.values():  # started, never completed: the ledger's open calls
        entries.append(
            Entry(
                t.started_at,
                "tool",
                t.seq,
                t.tool,
                f"key {t.key}",
                t.status,
                {"key": t.key, "ledger": t.status},
            )
        )
    for a in store.approvals(status=None, run_id=run.run_id):
        who = f" by {a.decided_by}" if a.decided_by else ""
        entries.append(
            Entry(
                a.decided_at or a.created_at,
                "approval",
                a.seq,
                a.action,
                f"{a.kind}: {a.status}{who}" + (f" ({a.comment})" if a.comment else ""),
                a.status,
                {"approval_id": a.approval_id},
            )
        )
    for child in store.list_runs(parent_id=run.run_id, limit=10_000):
        entries.append(
            Entry(
                child.created_at,
                "child",
                None,
                child.workflow,
                child.run_id,
                child.status.value,
                {"run_id": child.run_id},
            )
        )
    entries.sort(key=lambda e: (e.at, e.seq or 0))
    if run.waiting and not run.status.finished:
        entries.append(
            Entry(run.updated_at, "wait", None, run.status.value, _waiting(run.waiting), run.status.value)
        )
    return entries


def _waiting(waiting: dict[str, Any]) -> str:
    if "held" in waiting:
        return f"held back: {waiting['held']}"
    parts = [f"{k} {v}" for k, v in waiting.items() if k != "seq"]
    return ", ".join(parts) or "waiting"


# --- working state ----------------------------------------------------------------------------


def state_diff(working: WorkingStateStore, run_id: str, a: int, b: int) -> list[str]:
    """A unified diff of two working-state versions of a run, as indented JSON lines.

    Raises:
        StateNotFoundError: either version does not exist.
    """
    left, right = working.get(run_id, version=a), working.get(run_id, version=b)
    return list(
        difflib.unified_diff(
            pretty(json.loads(left.state)).splitlines(),
            pretty(json.loads(right.state)).splitlines(),
            f"version {a}",
            f"version {b}",
            lineterm="",
        )
    )


# --- context ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NextContext:
    """What the runtime would send the model next for a session, and where each input came from."""

    session_id: str
    owner: str | None
    run: Run | None
    built: BuiltContext
    record: dict[str, Any]
    source: str  # where the agent's system prompt, budget and memory_k came from
    notes: list[str]


def find_session_run(store: WorkflowStore, session_id: str) -> Run | None:
    """The newest agent run of a session (its run id is the session id unless it was started with one)."""
    from statekeep.workflow.search import run_owner

    def session_of(run: Run) -> str | None:
        args = run.input.get("args") if isinstance(run.input, dict) else None
        if run_owner(run) is None or not isinstance(args, list) or len(args) < 2:
            return None
        return args[1] if isinstance(args[1], str) else None

    run = store.find(session_id)
    if run is not None and session_of(run) == session_id:
        return run
    page = store.search_runs(text=session_id, limit=1000)
    return next((r for r in page.runs if session_of(r) == session_id), None)


def next_context(
    *,
    session_id: str,
    context: ContextStore,
    workflow: WorkflowStore | None,
    working: WorkingStateStore | None,
    memory: Callable[[], MemoryStore] | None,
    agent: Agent | None = None,
    system: str | None = None,
    budget: int | None = None,
    memory_k: int | None = None,
) -> NextContext:
    """The context the runtime would build for the session's next model call, built the same way.

    The pinned task state comes from the run's latest working state; memories
    from a search of the owner's memories for the task; the system prompt,
    budget and number of memories from ``agent`` if given, else from the run's
    last recorded model call, else from the arguments (else the Agent
    defaults). Nothing is written: a tail the runtime would first fold into the
    summary is shown unfolded, with a note.

    Raises:
        NotFoundError: the session has no events and no owner.
    """
    from statekeep.context.record import context_record
    from statekeep.memory.prompt import as_item
    from statekeep.runtime import AgentState

    if context.last_seq(session_id) == 0 and context.owner_of(session_id) is None:
        raise NotFoundError(f"no session {session_id!r}: it has no events and no owner")
    notes: list[str] = []
    run = None if workflow is None else find_session_run(workflow, session_id)
    state = None
    if run is not None and working is not None:
        try:
            state = working.load(run.run_id, AgentState)
        except StateNotFoundError:
            notes.append(f"run {run.run_id} has no working state yet")
        if run.status.finished:
            notes.append(f"run {run.run_id} has {run.status.value}: this is what a further call would see")
    else:
        notes.append("no agent run of this session: no pinned task state, no memories")
    recorded = None
    if run is not None and workflow is not None:
        recorded = next((c.context for c in reversed(model_calls(workflow, run.run_id)) if c.context), None)
    if agent is not None:
        system, budget, memory_k, source = agent.system, agent.budget, agent.memory_k, f"agent {agent.name!r}"
    elif recorded is not None:
        first = recorded["sections"][0] if recorded["sections"] else {}
        if system is None and first.get("name") == "system":
            system = first["messages"][0]["content"]
        budget = budget or int(recorded["budget"])
        memory_k = memory_k if memory_k is not None else recorded.get("memory_k", 5)
        source = "the run's last recorded model call"
    else:
        source = "defaults and options (no recorded model call, no --app)"
    budget = budget or 8000
    memory_k = 5 if memory_k is None else memory_k
    owner = state.owner if state is not None else context.owner_of(session_id)
    memories: list[Any] = []
    if state is not None and memory is not None and memory_k > 0:
        try:
            opened = memory()
        except ConfigError as exc:  # no memory folder yet: the runtime would find none either
            notes.append(f"no memories: {exc}")
        else:
            with _closing(opened) as store:
                memories = [as_item(h) for h in store.search(state.owner, state.task, k=memory_k)]
    built = context.build(
        session_id,
        budget,
        system=system,
        pinned=state.pinned() if state is not None else None,
        memories=memories,
        compact=False,
        owner=owner,
    )
    return NextContext(session_id, owner, run, built, context_record(built, memory_k=memory_k), source, notes)


@contextmanager
def _closing(store: MemoryStore) -> Iterator[MemoryStore]:
    try:
        yield store
    finally:
        store.close()


# --- approvals --------------------------------------------------------------------------------


def approval_view(approval: Approval) -> dict[str, Any]:
    """An approval as people read it: its exact arguments as indented JSON, with nothing hidden."""
    return {
        "approval_id": approval.approval_id,
        "run_id": approval.run_id,
        "kind": approval.kind,
        "action": approval.action,
        "args": approval.args,
        "args_text": pretty(approval.args),
        "reason": approval.reason,
        "status": approval.status,
        "created_at": approval.created_at,
        "expires_at": approval.expires_at,
        "decided_by": approval.decided_by,
        "decided_at": approval.decided_at,
        "comment": approval.comment,
    }
