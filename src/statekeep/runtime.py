"""The runtime: the one place where the four stores meet.

One agent step, every time, from the stores and nothing else::

    load run + working state -> retrieve the owner's memories -> build context
    -> model call -> tool calls through the ledger (or an approval gate)
    -> commit (step completion + working-state version + context cursor)

An agent is a workflow of the workflow store: every model call and every tool
call is a journaled step, so a crash, a restart or a wait of days for a person
resumes after the last completed step, on any worker.

Examples:
    >>> from statekeep.models import ModelResponse, ScriptedModel
    >>> agent = Agent("greeter", system="You greet people.", tools=[])
    >>> import tempfile
    >>> rt = Runtime.open(Settings.load(home=tempfile.mkdtemp()), model=ScriptedModel([ModelResponse("Hi!")]))
    >>> rt.run(agent, "greet-1", owner="ada", task="say hi").output
    'Hi!'
    >>> rt.close()
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from statekeep._text import check_storable
from statekeep.config import Settings
from statekeep.context import Event, MemoryItem, Message, SQLContextStore, ToolCall, to_openai
from statekeep.db import Database
from statekeep.errors import AgentError, EventKeyConflictError, InvalidInputError
from statekeep.models import AsyncModel, Model, ModelResponse, ToolSpec
from statekeep.workflow import (
    Engine,
    Reconciler,
    Registry,
    RetryPolicy,
    Run,
    RunContext,
    Step,
    Tool,
    Worker,
    Workflow,
)
from statekeep.working import SQLWorkingStateStore, WorkingState

if TYPE_CHECKING:
    from statekeep.memory import Embedder, Memory, MemoryKind, MemoryStore, SourceKind


@dataclass(frozen=True)
class AgentTool:
    """A tool an agent may call. ``fn(idempotency_key, **arguments)`` returns JSON.

    ``approval`` (a reason) makes every call wait for a person's approval of its
    exact arguments; ``reconciler`` decides, after a crash, whether a call that
    started but never completed actually happened.
    """

    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    approval: str | None = None
    reconciler: Reconciler | None = None

    def __post_init__(self) -> None:
        _check_text(self.name, "name")
        if not callable(self.fn):
            raise InvalidInputError("must be callable", field="fn")
        if self.approval is not None:
            _check_text(self.approval, "approval")

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)

    def bad_arguments(self, arguments: object) -> str | None:
        """Why the model's arguments cannot be passed to ``fn``; None when they can."""
        if not isinstance(arguments, dict):
            return f"the arguments of {self.name!r} must be a JSON object"
        try:
            inspect.signature(self.fn).bind("idempotency-key", **arguments)
        except TypeError as exc:
            return f"bad arguments for {self.name!r}: {exc}"
        return None


@dataclass(frozen=True)
class Agent:
    """An agent: a system prompt, tools, and the limits of one run."""

    name: str
    system: str
    tools: Sequence[AgentTool]
    version: int = 1
    budget: int = 8_000
    max_turns: int = 20
    memory_k: int = 5
    #: how often a failing model call (an HTTP 429, a timeout) is tried before the run fails
    model_retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=3, backoff=1.0))

    def __post_init__(self) -> None:
        _check_text(self.name, "name")
        if not isinstance(self.system, str):
            raise InvalidInputError("must be a string", field="system")
        if any(not isinstance(t, AgentTool) for t in self.tools):
            raise InvalidInputError("must be AgentTool objects", field="tools")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"tool names must be unique, got {names}", field="tools")
        for name, minimum in (("version", 1), ("budget", 1), ("max_turns", 1), ("memory_k", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidInputError(f"must be an int >= {minimum}", field=name)


class AgentState(WorkingState):
    """The working state of an agent run: its task, its progress, what its tools returned."""

    state_schema: ClassVar[str] = "statekeep.agent"
    state_version: ClassVar[int] = 1
    owner: str
    session_id: str
    task: str
    turn: int = 0
    #: the last context event a committed step covers
    cursor: int = 0
    #: the latest result of each tool, for the application; the model sees results in the
    #: window as tool messages, never promoted into the system prompt
    facts: dict[str, Any] = {}

    def pinned(self) -> dict[str, Any]:
        """What the model sees of this state before each call: the task and how far it got."""
        return {"task": self.task, "turn": self.turn}


@dataclass(frozen=True)
class RunScope:
    """Who and where a tool runs for: read by :meth:`Runtime.remember` for provenance."""

    owner: str
    session_id: str
    run_id: str
    event_id: int | None


_scope: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar("statekeep_run", default=None)
#: turns this invocation may still run before the run parks; None: no limit
_turns: contextvars.ContextVar[int | None] = contextvars.ContextVar("statekeep_turns", default=None)


def current_scope() -> RunScope | None:
    """The run a tool is executing for, or None outside a run."""
    return _scope.get()


class Runtime:
    """Composes context, working state, workflow and memory into durable agents.

    Build it with :meth:`open` from :class:`~statekeep.config.Settings` (the
    embedded default, or PostgreSQL with pgvector), register agents, and run
    them here (:meth:`run`, :meth:`resume`) or on workers (:meth:`start`,
    :meth:`worker`).
    """

    def __init__(
        self,
        *,
        engine: Engine,
        context: SQLContextStore,
        working: SQLWorkingStateStore,
        memory: Callable[[], MemoryStore],
        model: Model | AsyncModel,
    ) -> None:
        self.engine, self.context, self.working, self.model = engine, context, working, model
        self._open_memory = memory
        self._memory: MemoryStore | None = None
        self._model_loop = _ModelLoop()
        self._agents: dict[tuple[str, int], tuple[Agent, Workflow[Any, Any]]] = {}

    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        *,
        model: Model | AsyncModel,
        embedder: Embedder | None = None,
        lease: float = 30.0,
    ) -> Runtime:
        """Open every store the settings name; stores that share a URL share a database.

        Memory is opened on first use (a LanceDB folder allows one writer at a time).

        Raises:
            ConfigError: a setting is malformed or its server unreachable.
        """
        if not isinstance(model, Model | AsyncModel):
            raise InvalidInputError("needs complete() or acomplete() and a name", field="model")
        settings = settings or Settings.load()
        settings.check()
        dbs: dict[str, Database] = {}

        def db(store: str) -> Database:
            url = settings.url_for(store)
            return dbs.setdefault(url, Database(url, setting=f"STATEKEEP_{store.upper()}_URL"))

        working = SQLWorkingStateStore(db("working"))
        engine = Engine(db("workflow"), Registry(), state_store=working, lease=lease)

        def memory() -> MemoryStore:
            from statekeep.memory import open_memory_store

            return open_memory_store(settings.memory_url, embedder)

        context = SQLContextStore(db("context"))
        return cls(engine=engine, context=context, working=working, memory=memory, model=model)

    # --- agents -----------------------------------------------------------------------------

    def register(self, agent: Agent) -> Workflow[Any, Any]:
        """Register an agent as the workflow ``agent.<name>`` at its version (idempotent).

        Raises:
            InvalidInputError: another definition is registered under that name and version.
        """
        if not isinstance(agent, Agent):
            raise InvalidInputError(f"expected an Agent, got {type(agent).__name__}", field="agent")
        known = self._agents.get((agent.name, agent.version))
        if known is not None:
            if known[0] != agent:
                raise InvalidInputError(
                    f"{agent.name!r} v{agent.version} is registered with another definition: "
                    "bump the agent's version",
                    field="agent",
                )
            return known[1]

        def loop(ctx: RunContext, owner: str, session_id: str, task: str) -> str | None:
            return self._loop(ctx, agent, AgentState(owner=owner, session_id=session_id, task=task))

        name = f"agent.{agent.name}"
        workflow = self.engine.registry.workflow(name, version=agent.version, state=AgentState)(loop)
        self._agents[(agent.name, agent.version)] = (agent, workflow)
        return workflow

    def start(
        self, agent: Agent, run_id: str, *, owner: str, task: str, session_id: str | None = None
    ) -> Run:
        """Record a run for a worker to execute; starting an existing id returns it unchanged."""
        _check_run(owner, task, session_id)
        return self.engine.start(self.register(agent), run_id, owner, session_id or run_id, task)

    def run(
        self,
        agent: Agent,
        run_id: str,
        *,
        owner: str,
        task: str,
        session_id: str | None = None,
        turns: int | None = None,
    ) -> Run:
        """Start or resume a run and execute it here until it finishes, waits, or has done ``turns`` turns."""
        _check_run(owner, task, session_id)
        workflow = self.register(agent)
        with _turn_limit(turns):
            return self.engine.run(workflow, run_id, owner, session_id or run_id, task)

    def resume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Continue a run by its id alone (its agent must be registered in this process)."""
        with _turn_limit(turns):
            return self.engine.resume(run_id)

    def worker(self, **kw: Any) -> Worker:
        """A worker that executes runnable runs of the registered agents (see :class:`Worker`)."""
        return Worker(self.engine, **kw)

    # --- memory -----------------------------------------------------------------------------

    @property
    def memory(self) -> MemoryStore:
        """The long-term memory store, opened on first use."""
        if self._memory is None:
            self._memory = self._open_memory()
        return self._memory

    def remember(
        self,
        content: str,
        *,
        owner: str | None = None,
        kind: MemoryKind = "semantic",
        tags: Sequence[str] = (),
        source: SourceKind = "agent_inferred",
        metadata: dict[str, Any] | None = None,
    ) -> Memory:
        """Write a long-term memory; inside a run, its owner and provenance come from the run.

        Raises:
            InvalidInputError: outside a run without an ``owner``, or for another owner inside one.
        """
        from statekeep.memory import Provenance

        scope = current_scope()
        if scope is None and owner is None:
            raise InvalidInputError("outside a run, name the memory's owner", field="owner")
        if scope is not None and owner not in (None, scope.owner):
            raise InvalidInputError("a run writes only its own owner's memories", field="owner")
        provenance = Provenance(source)
        if scope is not None:
            event = None if scope.event_id is None else str(scope.event_id)
            provenance = Provenance(source, session_id=scope.session_id, run_id=scope.run_id, event_id=event)
        who = owner or (scope.owner if scope else "")
        return self.memory.remember(
            who, content, kind=kind, tags=tags, metadata=metadata, provenance=provenance
        )

    def close(self) -> None:
        """Release the memory store (and its folder lock), the async model's loop, and every connection."""
        self._model_loop.close()
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        for db in {id(s.db): s.db for s in (self.engine.store, self.context, self.working)}.values():
            db.dispose()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one agent step ---------------------------------------------------------------------

    def _loop(self, ctx: RunContext, agent: Agent, first: AgentState) -> str | None:
        tools = {t.name: t for t in agent.tools}
        ctx.step("begin", lambda: self._begin(ctx, first))
        for turn in range(agent.max_turns):
            model_step = Step(f"model-{turn}", retry=agent.model_retry)
            reply = ctx.step(model_step, partial(self._think, ctx, agent, turn))
            if not reply["tool_calls"]:
                return reply["content"]  # type: ignore[no-any-return]
            scope = RunScope(first.owner, first.session_id, ctx.run_id, reply["event"])
            for i, call in enumerate(reply["tool_calls"]):
                result = self._act(ctx, tools, call, scope)
                name = f"observe-{turn}-{i}"
                ctx.step(name, partial(self._observe, ctx, call, result, name))
            # a journaled boundary; when this invocation's turns are spent, the run parks as
            # sleeping (due at once) for the next resume or worker
            left = _turns.get()
            if left is not None and not ctx.replaying:
                _turns.set(left - 1)
            ctx.sleep(f"turn-{turn}", until=_soon() if _turns.get() == 0 else _epoch())
        raise AgentError(f"agent {agent.name!r} reached max_turns={agent.max_turns} in run {ctx.run_id!r}")

    def _begin(self, ctx: RunContext, state: AgentState) -> None:
        """First step: the task becomes the session's user message, and state version 1."""
        event = self.context.append(state.session_id, Message.user(state.task), key=f"{ctx.run_id}/begin")
        ctx.set_state(state.model_copy(update={"cursor": event.seq}))
        ctx.set_cursor(event.seq)

    def _think(self, ctx: RunContext, agent: Agent, turn: int) -> dict[str, Any]:
        """Retrieve memories, build the context, call the model, record its answer."""
        state = self._state(ctx)
        key = f"{ctx.run_id}/model-{turn}"
        logged = self.context.find(state.session_id, key)
        if logged is None:  # else the model answered before a crash: it is not paid for twice
            memories = self._memories(state, agent)
            built = self.context.build(
                state.session_id, agent.budget, system=agent.system, pinned=state.pinned(), memories=memories
            )
            response = self._complete(to_openai(built.messages), [t.spec for t in agent.tools])
            calls = [ToolCall(c.id, c.name, c.arguments) for c in response.tool_calls]
            logged = self._append(
                state.session_id, Message.assistant(response.content or "", tool_calls=calls), key
            )
        ctx.set_state(state.model_copy(update={"turn": turn + 1, "cursor": logged.seq}))
        ctx.set_cursor(logged.seq)
        message = logged.message
        calls_json = [
            {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in message.tool_calls
        ]
        return {"content": message.content or None, "tool_calls": calls_json, "event": logged.seq}

    def _act(
        self, ctx: RunContext, tools: dict[str, AgentTool], call: dict[str, Any], scope: RunScope
    ) -> Any:
        """One tool call through the ledger (or an approval gate); a bad call answers with an error."""
        tool = tools.get(call["name"])
        if tool is None:
            return {"error": f"no tool named {call['name']!r}"}
        problem = tool.bad_arguments(call["arguments"])
        if problem is not None:
            return {"error": problem}
        token = _scope.set(scope)
        try:
            return ctx.call_tool(_ledger_tool(tool), **call["arguments"])
        finally:
            _scope.reset(token)

    def _observe(self, ctx: RunContext, call: dict[str, Any], result: Any, step: str) -> None:
        """Record a tool result in the context and the working state."""
        state = self._state(ctx)
        message = Message.tool_result(call["id"], json.dumps(result), name=call["name"])
        seq = self._append(state.session_id, message, f"{ctx.run_id}/{step}").seq
        facts = {**state.facts, call["name"]: result}
        ctx.set_state(state.model_copy(update={"cursor": seq, "facts": facts}))
        ctx.set_cursor(seq)

    # --- helpers ----------------------------------------------------------------------------

    def _append(self, session_id: str, message: Message, key: str) -> Event:
        """Append under an idempotency key; if another holder of the run logged first, use theirs."""
        try:
            return self.context.append(session_id, message, key=key)
        except EventKeyConflictError:
            logged = self.context.find(session_id, key)
            if logged is None:  # pragma: no cover - a key conflict means the key is stored
                raise
            return logged

    def _state(self, ctx: RunContext) -> AgentState:
        state = ctx.state(AgentState)
        if state is None:  # pragma: no cover - the begin step always writes one
            raise AgentError(f"run {ctx.run_id!r} has no agent state")
        return state

    def _memories(self, state: AgentState, agent: Agent) -> list[MemoryItem]:
        if agent.memory_k == 0:
            return []
        from statekeep.memory.prompt import as_item

        return [as_item(h) for h in self.memory.search(state.owner, state.task, k=agent.memory_k)]

    def _complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> ModelResponse:
        if isinstance(self.model, AsyncModel):
            return self._model_loop.run(self.model.acomplete(messages, tools))
        return self.model.complete(messages, tools)


class _ModelLoop:
    """One event loop, on a daemon thread, that runs every call of an async model.

    ``asyncio.run`` per call would fail inside a running loop (a notebook) and
    would close the loop an async HTTP client is bound to after each call.
    Here the caller's thread blocks on the call, whatever loop it runs, and the
    loop lives until the runtime is closed.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, ModelResponse]) -> ModelResponse:
        """Run ``coroutine`` on the loop and wait for its result (cancelled if the wait is interrupted)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="statekeep-async-model", daemon=True
                )
                self._thread.start()
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop and its thread (a later call starts new ones)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def _ledger_tool(tool: AgentTool) -> Tool[Any, Any]:
    ledger: Tool[Any, Any] = Tool(tool.name, tool.fn, tool.reconciler)
    return ledger.requiring_approval(tool.approval) if tool.approval else ledger


@contextmanager
def _turn_limit(turns: int | None) -> Iterator[None]:
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise InvalidInputError("must be an int >= 1, or None", field="turns")
    token = _turns.set(turns)
    try:
        yield
    finally:
        _turns.reset(token)


def _check_text(value: object, name: str, limit: int = 255) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidInputError(f"must be a non-empty string of at most {limit} characters", field=name)
    check_storable(value, name)


def _check_run(owner: object, task: object, session_id: object) -> None:
    _check_text(owner, "owner")
    _check_text(task, "task", limit=100_000)
    if session_id is not None:
        _check_text(session_id, "session_id")


def _epoch() -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC)


def _soon() -> datetime:
    """A pause point: the run parks as sleeping, due in 10 ms, for the next resume or worker."""
    return datetime.now(UTC) + timedelta(milliseconds=10)
