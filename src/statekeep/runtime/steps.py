"""The steps of one agent run, each journaled by the workflow store.

begin (the task becomes the session's first user message) -> per turn: a model
step (memories, context build, model call, assistant event) -> each tool call
through the ledger or an approval gate -> an observe step per result -> a
journaled turn boundary, where a run limited by ``turns=`` parks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from statekeep.context import ContextStore, Event, MemoryItem, Message, ToolCall, to_openai
from statekeep.errors import AgentError, EventKeyConflictError
from statekeep.models import AsyncModel, Model, ModelResponse, ToolSpec
from statekeep.runtime.agent import Agent, AgentState, AgentTool
from statekeep.runtime.model_loop import ModelLoop
from statekeep.runtime.scope import RunScope, run_scope, turns_left
from statekeep.workflow import RunContext, Step, Tool

if TYPE_CHECKING:
    from statekeep.memory import MemoryStore


class AgentSteps:
    """The step functions of agent runs, over the context store, a model and the memory store.

    ``memory`` opens the memory store on first use (a LanceDB folder allows one writer).
    ``claim(session_id, owner)`` makes the session the run's owner's or raises
    :class:`~statekeep.errors.SessionOwnerError` (default: the context store's ``claim``).
    """

    def __init__(
        self,
        context: ContextStore,
        model: Model | AsyncModel,
        memory: Callable[[], MemoryStore],
        *,
        claim: Callable[[str, str], None] | None = None,
    ) -> None:
        self.context, self.model, self._memory = context, model, memory
        self._claim = claim or context.claim
        self._model_loop = ModelLoop()

    def close(self) -> None:
        """Stop the async model's loop, if one was started."""
        self._model_loop.close()

    def run(self, ctx: RunContext, agent: Agent, first: AgentState) -> str | None:
        """The whole run: begin, then per turn a model step, its tool calls and their observe steps.

        The session is claimed for the run's owner first, on every execution (a
        worker's too): a run never reads or appends to another owner's session.
        """
        self._claim(first.session_id, first.owner)
        tools = {t.name: t for t in agent.tools}
        ctx.step("begin", lambda: self.begin(ctx, first))
        for turn in range(agent.max_turns):
            model_step = Step(f"model-{turn}", retry=agent.model_retry)
            reply = ctx.step(model_step, partial(self.think, ctx, agent, turn))
            if not reply["tool_calls"]:
                return reply["content"]  # type: ignore[no-any-return]
            scope = RunScope(first.owner, first.session_id, ctx.run_id, reply["event"])
            for i, call in enumerate(reply["tool_calls"]):
                result = self.act(ctx, tools, call, scope)
                name = f"observe-{turn}-{i}"
                ctx.step(name, partial(self.observe, ctx, call, result, name))
            # a journaled boundary; when this invocation's turns are spent, the run parks as
            # sleeping (due at once) for the next resume or worker
            left = turns_left.get()
            if left is not None and not ctx.replaying:
                turns_left.set(left - 1)
            ctx.sleep(f"turn-{turn}", until=_soon() if turns_left.get() == 0 else _epoch())
        raise AgentError(f"agent {agent.name!r} reached max_turns={agent.max_turns} in run {ctx.run_id!r}")

    def begin(self, ctx: RunContext, state: AgentState) -> None:
        """First step: the task becomes the session's user message, and state version 1."""
        event = self.context.append(
            state.session_id, Message.user(state.task), key=f"{ctx.run_id}/begin", owner=state.owner
        )
        ctx.set_state(state.model_copy(update={"cursor": event.seq}))
        ctx.set_cursor(event.seq)

    def think(self, ctx: RunContext, agent: Agent, turn: int) -> dict[str, Any]:
        """Retrieve memories, build the context, call the model, record its answer."""
        state = self._state(ctx)
        key = f"{ctx.run_id}/model-{turn}"
        logged = self.context.find(state.session_id, key, owner=state.owner)
        if logged is None:  # else the model answered before a crash: it is not paid for twice
            memories = self._memories(state, agent)
            built = self.context.build(
                state.session_id,
                agent.budget,
                system=agent.system,
                pinned=state.pinned(),
                memories=memories,
                owner=state.owner,
            )
            response = self._complete(to_openai(built.messages), [t.spec for t in agent.tools])
            calls = [ToolCall(c.id, c.name, c.arguments) for c in response.tool_calls]
            logged = self._append(state, Message.assistant(response.content or "", tool_calls=calls), key)
        ctx.set_state(state.model_copy(update={"turn": turn + 1, "cursor": logged.seq}))
        ctx.set_cursor(logged.seq)
        message = logged.message
        calls_json = [
            {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in message.tool_calls
        ]
        return {"content": message.content or None, "tool_calls": calls_json, "event": logged.seq}

    def act(self, ctx: RunContext, tools: dict[str, AgentTool], call: dict[str, Any], scope: RunScope) -> Any:
        """One tool call through the ledger (or an approval gate); a bad call answers with an error."""
        tool = tools.get(call["name"])
        if tool is None:
            return {"error": f"no tool named {call['name']!r}"}
        problem = tool.bad_arguments(call["arguments"])
        if problem is not None:
            return {"error": problem}
        token = run_scope.set(scope)
        try:
            return ctx.call_tool(_ledger_tool(tool), **call["arguments"])
        finally:
            run_scope.reset(token)

    def observe(self, ctx: RunContext, call: dict[str, Any], result: Any, step: str) -> None:
        """Record a tool result in the context and the working state."""
        state = self._state(ctx)
        message = Message.tool_result(call["id"], json.dumps(result), name=call["name"])
        seq = self._append(state, message, f"{ctx.run_id}/{step}").seq
        facts = {**state.facts, call["name"]: result}
        ctx.set_state(state.model_copy(update={"cursor": seq, "facts": facts}))
        ctx.set_cursor(seq)

    def _append(self, state: AgentState, message: Message, key: str) -> Event:
        """Append under an idempotency key; if another holder of the run logged first, use theirs."""
        session_id, owner = state.session_id, state.owner
        try:
            return self.context.append(session_id, message, key=key, owner=owner)
        except EventKeyConflictError:
            logged = self.context.find(session_id, key, owner=owner)
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

        return [as_item(h) for h in self._memory().search(state.owner, state.task, k=agent.memory_k)]

    def _complete(self, messages: list[dict[str, Any]], tools: list[ToolSpec]) -> ModelResponse:
        if isinstance(self.model, AsyncModel):
            return self._model_loop.run(self.model.acomplete(messages, tools))
        return self.model.complete(messages, tools)


def _ledger_tool(tool: AgentTool) -> Tool[Any, Any]:
    ledger: Tool[Any, Any] = Tool(tool.name, tool.fn, tool.reconciler)
    return ledger.requiring_approval(tool.approval) if tool.approval else ledger


def _epoch() -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC)


def _soon() -> datetime:
    """A pause point: the run parks as sleeping, due in 10 ms, for the next resume or worker."""
    return datetime.now(UTC) + timedelta(milliseconds=10)
