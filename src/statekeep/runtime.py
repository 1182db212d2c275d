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
    >>> rt = Runtime.open(Settings.load(home="/tmp/rt-doc"), model=ScriptedModel([ModelResponse("Hi!")]))
    >>> rt.run(agent, "greet-1", owner="ada", task="say hi").output
    'Hi!'
    >>> rt.close()
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from statekeep.config import Settings
from statekeep.context import MemoryItem, Message, SQLContextStore, ToolCall, to_openai
from statekeep.db import Database
from statekeep.errors import AgentError, InvalidInputError
from statekeep.models import AsyncModel, Model, ModelResponse, ToolSpec
from statekeep.models import ToolCall as ModelToolCall
from statekeep.workflow import Engine, Reconciler, Registry, Run, RunContext, Tool, Worker, Workflow
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

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(self.name, self.description, self.parameters)


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


class AgentState(WorkingState):
    """The working state of an agent run: its task, progress, and what its tools found."""

    state_schema: ClassVar[str] = "statekeep.agent"
    state_version: ClassVar[int] = 1
    owner: str
    session_id: str
    task: str
    turn: int = 0
    #: the last context event a committed step covers
    cursor: int = 0
    #: the latest result of each tool, pinned into every context
    facts: dict[str, Any] = {}

    def pinned(self) -> dict[str, Any]:
        """What the model sees of this state, each step."""
        return {"task": self.task, "turn": self.turn, "facts": self.facts}


@dataclass(frozen=True)
class RunScope:
    """Who and where a tool runs for: read by :meth:`Runtime.remember` for provenance."""

    owner: str
    session_id: str
    run_id: str
    event_id: int | None


_scope: contextvars.ContextVar[RunScope | None] = contextvars.ContextVar("statekeep_run", default=None)


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
        self._agents: dict[str, tuple[Agent, Workflow[Any, Any], dict[str, Tool[Any, Any]]]] = {}
        self._turns: int | None = None

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

        return cls(
            engine=engine, context=SQLContextStore(db("context")), working=working, memory=memory, model=model
        )

    # --- agents -----------------------------------------------------------------------------

    def register(self, agent: Agent) -> Workflow[Any, Any]:
        """Register an agent as the workflow ``agent.<name>`` (idempotent)."""
        if agent.name in self._agents:
            return self._agents[agent.name][1]
        tools = {t.name: self._ledger_tool(t) for t in agent.tools}

        def loop(ctx: RunContext, owner: str, session_id: str, task: str) -> str | None:
            return self._loop(ctx, agent, tools, AgentState(owner=owner, session_id=session_id, task=task))

        workflow = self.engine.registry.workflow(
            f"agent.{agent.name}", version=agent.version, state=AgentState
        )(loop)
        self._agents[agent.name] = (agent, workflow, tools)
        return workflow

    def start(
        self, agent: Agent, run_id: str, *, owner: str, task: str, session_id: str | None = None
    ) -> Run:
        """Record a run for a worker to execute; starting an existing id returns it unchanged."""
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
        workflow = self.register(agent)
        with self._turn_limit(turns):
            return self.engine.run(workflow, run_id, owner, session_id or run_id, task)

    def resume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Continue a run by its id alone (its agent must be registered in this process)."""
        with self._turn_limit(turns):
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
            InvalidInputError: outside a run without an ``owner``.
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
        """Release the memory store (and its folder lock) and every database connection."""
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

    def _loop(
        self, ctx: RunContext, agent: Agent, tools: dict[str, Tool[Any, Any]], first: AgentState
    ) -> str | None:
        ctx.step("begin", self._begin, ctx, first)
        done_here = 0
        for turn in range(agent.max_turns):
            reply = ctx.step(f"model-{turn}", self._think, ctx, agent, turn)
            if not reply["tool_calls"]:
                return reply["content"]  # type: ignore[no-any-return]
            scope = RunScope(first.owner, first.session_id, ctx.run_id, reply["event"])
            for i, call in enumerate(reply["tool_calls"]):
                result = self._act(ctx, tools, call, scope)
                ctx.step(f"observe-{turn}-{i}", self._observe, ctx, call, result, f"observe-{turn}-{i}")
            done_here += 0 if ctx.replaying else 1
            pause = self._turns is not None and done_here >= self._turns
            # a journaled boundary: due at once, it parks the run (sleeping) for the next resume
            ctx.sleep(f"turn-{turn}", until=_soon() if pause else _epoch())
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
        earlier = self.context.find(state.session_id, key)
        if earlier is not None:  # the model answered before a crash: do not pay for it twice
            response, seq = _response_of(earlier.message), earlier.seq
        else:
            memories = self._memories(state, agent)
            built = self.context.build(
                state.session_id, agent.budget, system=agent.system, pinned=state.pinned(), memories=memories
            )
            response = self._complete(to_openai(built.messages), [t.spec for t in agent.tools])
            calls = [ToolCall(c.id, c.name, c.arguments) for c in response.tool_calls]
            message = Message.assistant(response.content or "", tool_calls=calls)
            seq = self.context.append(state.session_id, message, key=key).seq
        ctx.set_state(state.model_copy(update={"turn": turn + 1, "cursor": seq}))
        ctx.set_cursor(seq)
        calls_json = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]
        return {"content": response.content, "tool_calls": calls_json, "event": seq}

    def _act(
        self, ctx: RunContext, tools: dict[str, Tool[Any, Any]], call: dict[str, Any], scope: RunScope
    ) -> Any:
        """One tool call through the ledger (or an approval gate); unknown tools answer with an error."""
        tool = tools.get(call["name"])
        if tool is None:
            return {"error": f"no tool named {call['name']!r}"}
        token = _scope.set(scope)
        try:
            return ctx.call_tool(tool, **call["arguments"])
        finally:
            _scope.reset(token)

    def _observe(self, ctx: RunContext, call: dict[str, Any], result: Any, step: str) -> None:
        """Record a tool result in the context and the working state."""
        state = self._state(ctx)
        message = Message.tool_result(call["id"], json.dumps(result, default=str), name=call["name"])
        seq = self.context.append(state.session_id, message, key=f"{ctx.run_id}/{step}").seq
        facts = {**state.facts, call["name"]: result}
        ctx.set_state(state.model_copy(update={"cursor": seq, "facts": facts}))
        ctx.set_cursor(seq)

    # --- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _ledger_tool(tool: AgentTool) -> Tool[Any, Any]:
        ledger: Tool[Any, Any] = Tool(tool.name, tool.fn, tool.reconciler)
        return ledger.requiring_approval(tool.approval) if tool.approval else ledger

    def _state(self, ctx: RunContext) -> AgentState:
        state = ctx.state(AgentState)
        if state is None:  # pragma: no cover - the begin step always writes one
            raise AgentError(f"run {ctx.run_id!r} has no agent state")
        return state

    def _memories(self, state: AgentState, agent: Agent) -> list[MemoryItem]:
        if agent.memory_k == 0:
            return []
        hits = self.memory.search(state.owner, state.task, k=agent.memory_k)
        return [
            MemoryItem(
                h.memory.content,
                h.memory.provenance.source,
                h.memory.provenance.session_id,
                h.memory.provenance.run_id,
                h.memory.provenance.event_id,
                h.memory.id,
            )
            for h in hits
        ]

    def _complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> ModelResponse:
        if isinstance(self.model, AsyncModel):
            import asyncio

            return asyncio.run(self.model.acomplete(messages, tools))
        return self.model.complete(messages, tools)

    @contextmanager
    def _turn_limit(self, turns: int | None) -> Iterator[None]:
        if turns is not None and (not isinstance(turns, int) or turns < 1):
            raise InvalidInputError("must be an int >= 1, or None", field="turns")
        self._turns = turns
        try:
            yield
        finally:
            self._turns = None


def _response_of(message: Message) -> ModelResponse:
    calls = tuple(ModelToolCall(c.id, c.name, dict(c.arguments)) for c in message.tool_calls)
    return ModelResponse(message.content or None, calls)


def _epoch() -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC)


def _soon() -> datetime:
    """A pause point: the run parks as sleeping, due in 10 ms, for the next resume or worker."""
    return datetime.now(UTC) + timedelta(milliseconds=10)
