"""Reading the stores for people: what the CLI and the web console show, computed once.

Nothing here writes. Stores are opened read-only (:func:`open_sql`,
:func:`open_memory`): a missing database or folder is an error naming its
setting, never a new empty one. A run's timeline, its model calls (with the
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statekeep.errors import ConfigError, NotFoundError, StateNotFoundError

if TYPE_CHECKING:
    from statekeep.config import Settings
    from statekeep.context import BuiltContext, ContextStore
    from statekeep.db import Database
    from statekeep.memory import Embedder, MemoryStore
    from statekeep.runtime import Agent
    from statekeep.workflow import Approval, Run, WorkflowStore
    from statekeep.working import WorkingStateStore

# --- showing stored text literally -----------------------------------------------------------

# What a terminal would act on instead of showing: C0 and C1 control codes (but newline and tab),
# DEL, invisible formatting and bidi controls, and lone surrogates (no terminal encoding takes them).
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff]"
)


def visible(text: str, *, json_text: bool = False) -> str:
    """``text`` with every character a terminal would act on, rather than show, written as an escape.

    ESC, CR and the other control codes, bidi overrides and zero-width characters
    become ``\\x1b``, ``\\r``, ``\\u202e``...; newlines, tabs and every printable
    character (any script, emoji) are kept. With ``json_text``, ``text`` is JSON and
    the escapes are JSON's own (``\\u001b``), so it stays JSON that decodes the same.
    """
    return _INVISIBLE.sub(_escape_json if json_text else _escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    short = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    return short or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _escape_json(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def pretty(value: Any) -> str:
    """A JSON value as indented JSON text, every invisible character escaped (for <pre> and terminals)."""
    return visible(json.dumps(value, indent=2, ensure_ascii=False, default=str), json_text=True)


# --- opening stores without creating anything ------------------------------------------------


def sql_setting(settings: Settings, store: str) -> str:
    """The name of the setting that gives ``store`` its URL."""
    url = settings.url_for(store)
    return "STATEKEEP_DATABASE_URL" if url == settings.database_url else f"STATEKEEP_{store.upper()}_URL"


def find_sql(settings: Settings, store: str) -> Database | None:
    """:func:`open_sql`, or None when the database holds no such store (a context-only database)."""
    return _open_sql(settings, store, missing_ok=True)


def open_sql(settings: Settings, store: str) -> Database:
    """The database of one SQL store, checked to exist and to hold the store's current schema.

    Nothing is created: a SQLite file that is not there, a schema never
    created, or one older than this code is an error naming the setting.
    :func:`find_sql` returns None instead for a schema never created.

    Raises:
        ConfigError: the database is missing, unreachable, or not (yet) a statekeep database.
    """
    db = _open_sql(settings, store, missing_ok=False)
    assert db is not None
    return db


def _open_sql(settings: Settings, store: str, *, missing_ok: bool) -> Database | None:
    from statekeep.db import Database
    from statekeep.db.engine import normalize_url
    from statekeep.db.migrations import current_version

    url, setting = settings.url_for(store), sql_setting(settings, store)
    parsed = normalize_url(url, setting=setting)
    file = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if file not in (None, "", ":memory:") and not Path(str(file)).is_file():
        raise ConfigError(
            setting,
            url,
            "no database file there; nothing was created. Check the setting (or --home, "
            "--database-url), or create the stores with `statekeep db upgrade`",
        )
    db = Database(url, setting=setting)
    try:
        db.check()
        schema, migrations = _schema_of(store)
        applied = current_version(db, store, schema)
    except BaseException:
        db.dispose()
        raise
    if applied < migrations or (applied == 0 and missing_ok):
        db.dispose()
        if applied == 0 and missing_ok:
            return None
        reason = (
            f"holds no {store} store yet"
            if applied == 0
            else f"holds the {store} store at schema version {applied}; this statekeep needs {migrations}"
        )
        raise ConfigError(setting, url, f"{reason}: run `statekeep db upgrade` (nothing was changed)")
    return db


def _schema_of(store: str) -> tuple[str, int]:
    if store == "workflow":
        from statekeep.workflow import tables

        return tables.SCHEMA, len(tables.MIGRATIONS)
    if store == "context":
        from statekeep.context import sql as context_sql

        return context_sql.SCHEMA, len(context_sql.MIGRATIONS)
    from statekeep.working import sql as working_sql

    return working_sql.SCHEMA, len(working_sql.MIGRATIONS)


def open_memory(
    settings: Settings, embedder: Embedder | None = None, *, read_only: bool = True
) -> MemoryStore:
    """The memory store; read-only by default: a LanceDB folder is opened without its writer lock.

    LanceDB readers are safe beside the one writer (a worker), so searches,
    lists and exports work while agents run. A folder that does not exist is an
    error naming ``STATEKEEP_MEMORY_URL``, never a new empty one.

    Raises:
        ConfigError: the folder is missing or holds no memories; the database is unreachable.
    """
    from statekeep.memory import open_memory_store

    memory = settings.memory
    if memory.backend != "lancedb" or not read_only:
        return open_memory_store(settings.memory_url, embedder)
    from statekeep.memory.lancedb import LanceDBMemoryStore

    return LanceDBMemoryStore(memory.location, embedder, read_only=True)


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

_SECTIONS = ("system", "pinned", "memories", "summary")


def context_record(built: BuiltContext, *, memory_k: int | None = None) -> dict[str, Any]:
    """What a model call was sent, as the builder produced it: its sections, their tokens and messages.

    The runtime stores this with each model step, so the console shows the exact
    context of every call.
    """
    report = built.report
    present = [name for name in _SECTIONS if getattr(report, name) > 0]
    messages = [m.to_json() for m in built.messages]
    sections = [
        {"name": name, "tokens": getattr(report, name), "messages": [messages[i]]}
        for i, name in enumerate(present)
    ]
    sections.append({"name": "window", "tokens": report.window, "messages": messages[len(present) :]})
    record: dict[str, Any] = {
        "budget": report.budget,
        "counter": report.counter,
        "total": report.total,
        "reply_overhead": report.reply_overhead,
        "sections": sections,
        "memories_dropped": report.memories_dropped,
        "summary_dropped": report.summary_dropped,
        "orphans_dropped": report.orphans_dropped,
    }
    if memory_k is not None:
        record["memory_k"] = memory_k
    return record


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
    from statekeep.workflow.base import run_owner

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
