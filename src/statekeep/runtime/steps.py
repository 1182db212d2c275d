"""The steps of one agent run, each journaled by the workflow store.

begin (the task becomes the session's first user message) -> per turn: a model
step (memories, context build, model call, assistant event) -> each tool call
through the ledger or an approval gate -> an observe step per result -> a
journaled turn boundary, where a run limited by ``turns=`` parks.

A model call that fails is journaled too, as a model step whose output is the
classified failure: a transient one is followed by a journaled sleep until the
retry is due, then the next attempt; a permanent one (or the last attempt)
fails the run with the provider's message. ``rt.retry`` continues such a run
with a new series of attempts.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from statekeep import tracing
from statekeep.context import ContextStore, Event, MemoryItem, Message, SQLContextStore, ToolCall, to_openai
from statekeep.context.record import context_record
from statekeep.db import aio
from statekeep.errors import (
    AgentError,
    ApprovalExpiredError,
    ApprovalRejectedError,
    ConfigError,
    EventKeyConflictError,
    InvalidInputError,
    LeaseLostError,
    ModelError,
    StorageError,
)
from statekeep.models import (
    AnyModel,
    AsyncModel,
    AsyncStreamingModel,
    Model,
    ModelResponse,
    StreamingModel,
    ToolSpec,
)
from statekeep.runtime.agent import Agent, AgentState, AgentTool
from statekeep.runtime.events import ModelRetrying, TextDelta, ToolCallRequested, ToolResult
from statekeep.runtime.failures import backoff, classify
from statekeep.runtime.model_loop import ModelLoop
from statekeep.runtime.scope import Invocation, RunScope, invocation, run_scope
from statekeep.workflow import Finish, RetryPolicy, RunContext, RunWrite, Step, Tool

if TYPE_CHECKING:
    from statekeep.memory import MemoryStore

T = TypeVar("T")

#: A model step runs once per attempt: the runtime journals each failed attempt itself.
_ONCE = RetryPolicy(attempts=1)
#: The key of a tool's failure in the ledger; the model sees ``{"error": ..., "error_type": ...}``.
TOOL_ERROR = "$tool_error"
#: Errors of the infrastructure, never handed to the model as a tool's result.
_INFRASTRUCTURE = (StorageError, LeaseLostError, ConfigError)


class AgentSteps:
    """The step functions of agent runs, over the context store, a model and the memory store.

    ``memory`` opens the memory store on first use (a LanceDB folder allows one writer).
    ``claim(session_id, owner)`` makes the session the run's owner's or raises
    :class:`~statekeep.errors.SessionOwnerError` (default: the context store's ``claim``).
    """

    def __init__(
        self,
        context: ContextStore,
        model: AnyModel,
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
            reply = self.model_turn(ctx, agent, turn)
            asked_now = ctx.seq > ctx.run.last_seq  # the model was asked in this invocation, not replayed
            if not reply["tool_calls"]:
                return reply["content"]  # type: ignore[no-any-return]
            scope = RunScope(first.owner, first.session_id, ctx.run_id, reply["event"])
            for i, call in enumerate(reply["tool_calls"]):
                result = self.act(ctx, agent, tools, call, scope, turn)
                name = f"observe-{turn}-{i}"
                ctx.step(name, partial(self.observe, ctx, call, result, name))
            # a journaled boundary; when this invocation's turns are spent, the run parks as
            # sleeping (due at once) for the next resume or worker. Only the turns this
            # invocation asked the model for count: not the one an earlier invocation parked at.
            inv = invocation.get()
            if inv is not None and inv.turns_left is not None and asked_now:
                inv.turns_left -= 1
            spent = inv is not None and inv.turns_left == 0
            ctx.sleep(f"turn-{turn}", until=_soon() if spent else _epoch())
        raise AgentError(f"agent {agent.name!r} reached max_turns={agent.max_turns} in run {ctx.run_id!r}")

    def begin(self, ctx: RunContext, state: AgentState) -> Any:
        """First step: the task becomes the session's user message, and state version 1."""

        def moved(event: Event) -> None:
            ctx.set_state(state.model_copy(update={"cursor": event.seq}))
            ctx.set_cursor(event.seq)

        return self._log(ctx, state, Message.user(state.task), f"{ctx.run_id}/begin", moved)

    # --- the model ------------------------------------------------------------------------

    def model_turn(self, ctx: RunContext, agent: Agent, turn: int) -> dict[str, Any]:
        """The model step of a turn, with its journaled retries; the answer, or the run fails."""
        step = Step(f"model-{turn}", retry=_ONCE)
        attempt = 1
        while True:
            out: dict[str, Any] = ctx.step(step, partial(self.think, ctx, agent, turn, attempt))
            failed = out.get("failed")
            if failed is None:
                return out
            replayed = ctx.seq <= ctx.run.last_seq
            if failed["final"]:
                if replayed:  # the run was retried after this failure: a new series of attempts
                    attempt = 1
                    continue
                raise ModelError(
                    f"{failed['error']} (turn {turn}, attempt {failed['attempt']} of "
                    f"{agent.model_retry.attempts})",
                    status=failed["status"],
                    retryable=failed["transient"],
                )
            inv = invocation.get()
            if not replayed:
                _emit(
                    ModelRetrying(ctx.run_id, turn, attempt, failed["error"], failed["status"], failed["due"])
                )
            due = datetime.fromisoformat(failed["due"])
            if inv is not None:
                inv.retry_due = due  # the caller may sit a short wait out, if the run parks
            ctx.sleep(f"model-{turn}-retry-{attempt}", until=due)
            if inv is not None:
                inv.retry_due = None
            attempt += 1

    def think(self, ctx: RunContext, agent: Agent, turn: int, attempt: int = 1) -> Any:
        """Retrieve memories, build the context, call the model, record its answer (or its failure)."""
        state = self._state(ctx)
        key = f"{ctx.run_id}/model-{turn}"
        logged = self.context.find(state.session_id, key, owner=state.owner)
        extra: dict[str, Any] = {}  # usage, and the context sent, for people to see (the console)

        def answered(event: Event) -> dict[str, Any]:
            ctx.set_state(state.model_copy(update={"turn": turn + 1, "cursor": event.seq}))
            ctx.set_cursor(event.seq)
            calls = [
                {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in event.message.tool_calls
            ]
            return {
                "content": event.message.content or None,
                "tool_calls": calls,
                "event": event.seq,
                **extra,
            }

        if logged is not None:  # the model answered before a crash: it is not paid for twice
            return answered(logged)
        built = self.context.build(
            state.session_id,
            agent.budget,
            system=agent.system,
            pinned=state.pinned(),
            memories=self._memories(state, agent),
            owner=state.owner,
        )
        specs = [t.spec for t in agent.tools]
        try:
            with tracing.model_call(self.model.name) as span:
                response = self._complete(ctx.run_id, turn, to_openai(built.messages), specs)
                tracing.model_answered(
                    span, response.input_tokens, response.output_tokens, len(response.tool_calls)
                )
        except _INFRASTRUCTURE:
            raise
        except Exception as exc:
            return {"failed": self._failure(agent, exc, attempt)}
        if response.usage is not None:
            extra["usage"] = response.usage
        extra["context"] = context_record(built, memory_k=agent.memory_k)
        calls = [ToolCall(c.id, c.name, c.arguments) for c in response.tool_calls]
        return self._log(
            ctx, state, Message.assistant(response.content or "", tool_calls=calls), key, answered
        )

    def _failure(self, agent: Agent, exc: Exception, attempt: int) -> dict[str, Any]:
        failure = classify(exc)
        final = not failure.transient or attempt >= agent.model_retry.attempts
        due = None
        if not final:
            wait = backoff(agent.model_retry, attempt, failure.retry_after)
            due = (datetime.now(UTC) + timedelta(seconds=wait)).isoformat()
        return {
            "error": failure.error,
            "status": failure.status,
            "transient": failure.transient,
            "retry_after": failure.retry_after,
            "attempt": attempt,
            "final": final,
            "due": due,
        }

    def _complete(
        self, run_id: str, turn: int, messages: list[dict[str, Any]], tools: list[ToolSpec]
    ) -> ModelResponse:
        """Call the model: streamed when someone listens, awaited on the caller's loop when async."""
        inv = invocation.get()
        listening = inv is not None and inv.sink is not None
        model: Any = self.model

        def delta(text: str) -> None:
            _emit(TextDelta(run_id, turn, text))

        has_async = isinstance(model, AsyncModel | AsyncStreamingModel)
        has_sync = isinstance(model, Model | StreamingModel)
        if has_async and (not has_sync or (inv is not None and inv.loop is not None)):
            return self.await_(_acall(model, messages, tools, delta if listening else None))
        if isinstance(model, StreamingModel) and (listening or not isinstance(model, Model)):
            response = _final(model.name, list(_relay(model.stream(messages, tools), delta)))
        else:
            response = model.complete(messages, tools)
            if listening and response.content:
                delta(response.content)
        if not isinstance(response, ModelResponse):
            raise ModelError(f"{model.name}: answered {type(response).__name__}, not a ModelResponse")
        return response

    def await_(self, awaitable: Awaitable[T]) -> T:
        """Await on the caller's loop (``arun``/``astream``), else on the runtime's own loop."""
        if aio.active():  # driven on the caller's loop (arun, astream)
            return aio.wait(awaitable)
        inv = invocation.get()
        if inv is not None and inv.loop is not None:
            future: Future[T] = asyncio.run_coroutine_threadsafe(_coroutine(awaitable), inv.loop)
            try:
                return future.result()
            except BaseException:
                future.cancel()
                raise
        return self._model_loop.run(_coroutine(awaitable))

    # --- tools ----------------------------------------------------------------------------

    def act(
        self,
        ctx: RunContext,
        agent: Agent,
        tools: dict[str, AgentTool],
        call: dict[str, Any],
        scope: RunScope,
        turn: int = 0,
    ) -> Any:
        """One tool call through the ledger (or an approval gate); a bad or failed call answers an error."""
        fresh = not ctx.replaying
        if fresh:
            _emit(ToolCallRequested(ctx.run_id, turn, call["id"], call["name"], dict(call["arguments"])))
        result = self._act(ctx, agent, tools, call, scope)
        if fresh:
            _emit(ToolResult(ctx.run_id, turn, call["id"], call["name"], result, _is_error(result)))
        return result

    def _act(
        self,
        ctx: RunContext,
        agent: Agent,
        tools: dict[str, AgentTool],
        call: dict[str, Any],
        scope: RunScope,
    ) -> Any:
        tool = tools.get(call["name"])
        if tool is None:
            return {"error": f"no tool named {call['name']!r}; the tools are {sorted(tools)}"}
        try:
            arguments = tool.check_arguments(call["arguments"])
        except InvalidInputError as exc:
            return {"error": str(exc)}
        ledger = self.ledger_tool(agent, tool)
        token = run_scope.set(scope)
        try:
            raw = ctx.call_tool(ledger, **arguments)
            while _failed(raw) and tool.on_error == "ask":
                error = raw[TOOL_ERROR]["error"]
                reason = (
                    f"{tool.name} failed: {error[:500]}. Approve to call it again with the same "
                    "arguments; reject to hand the error to the model."
                )
                try:
                    raw = ctx.call_tool(ledger.requiring_approval(reason), **arguments)
                except (ApprovalRejectedError, ApprovalExpiredError) as exc:
                    raw = {TOOL_ERROR: {**raw[TOOL_ERROR], "error": f"{error} (not called again: {exc})"}}
                    break
        finally:
            run_scope.reset(token)
        return _visible(raw)

    def ledger_tool(self, agent: Agent, tool: AgentTool) -> Tool[Any, Any]:
        """The ledger's view of a tool: transient errors retried in process, others per ``on_error``."""
        policy = tool.retry or agent.tool_retry

        def call(key: str, **arguments: Any) -> Any:
            attempt = 1
            while True:
                try:
                    value = tool.invoke(key, arguments)
                    return self.await_(value) if inspect.isawaitable(value) else value
                except _INFRASTRUCTURE:
                    raise
                except Exception as exc:
                    failure = classify(exc)
                    if failure.transient and attempt < policy.attempts:
                        aio.pause(backoff(policy, attempt, failure.retry_after))
                        attempt += 1
                        continue
                    if tool.on_error == "fail":
                        raise
                    message = str(exc) or type(exc).__name__
                    return {
                        TOOL_ERROR: {"error": message, "error_type": type(exc).__name__, "attempts": attempt}
                    }

        ledger: Tool[Any, Any] = Tool(tool.name, call, tool.reconciler)
        return ledger.requiring_approval(tool.approval) if tool.approval else ledger

    def observe(self, ctx: RunContext, call: dict[str, Any], result: Any, step: str) -> Any:
        """Record a tool result in the context and the working state."""
        state = self._state(ctx)
        message = Message.tool_result(
            call["id"], json.dumps(result), name=call["name"], is_error=_is_error(result)
        )

        def moved(event: Event) -> None:
            facts = {**state.facts, call["name"]: result}
            ctx.set_state(state.model_copy(update={"cursor": event.seq, "facts": facts}))
            ctx.set_cursor(event.seq)

        return self._log(ctx, state, message, f"{ctx.run_id}/{step}", moved)

    # --- helpers --------------------------------------------------------------------------

    def _log(
        self, ctx: RunContext, state: AgentState, message: Message, key: str, then: Callable[[Event], T]
    ) -> T | Finish[T]:
        """Append ``message`` under ``key``, then ``then(event)`` stages the state and cursor it moves.

        When the context store shares the workflow's database, the append joins the
        step's completion (one transaction: event, state version, journal entry);
        otherwise it commits first, and the completion points at it (a crash in
        between leaves an event that the re-run step finds by its key).
        """
        db = self.context.db if isinstance(self.context, SQLContextStore) else None
        if db is None or not ctx.joins(db):
            return then(self._append(state, message, key))
        context = self.context
        assert isinstance(context, SQLContextStore)

        def finish(tx: RunWrite) -> T:
            conn = tx.connection(db)
            assert conn is not None  # ctx.joins(db) said this transaction has it
            event = context.append_in(conn, state.session_id, message, key=key, owner=state.owner)
            return then(event)

        return Finish(finish)

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


def _emit(event: Any) -> None:
    inv: Invocation | None = invocation.get()
    if inv is not None and inv.sink is not None:
        inv.sink(event)


def _relay(chunks: Iterable[Any], delta: Callable[[str], None]) -> Iterator[Any]:
    for chunk in chunks:
        if isinstance(chunk, str) and chunk:
            delta(chunk)
        yield chunk


def _final(model: str, chunks: Sequence[Any]) -> ModelResponse:
    if not chunks or not isinstance(chunks[-1], ModelResponse):
        raise ModelError(f"{model}: the stream ended before the answer was complete", retryable=True)
    return chunks[-1]


async def _acall(
    model: Any, messages: list[dict[str, Any]], tools: list[ToolSpec], delta: Callable[[str], None] | None
) -> ModelResponse:
    if isinstance(model, AsyncStreamingModel) and (delta is not None or not isinstance(model, AsyncModel)):
        last: Any = None
        async for chunk in model.astream(messages, tools):
            if isinstance(chunk, str):
                if chunk and delta is not None:
                    delta(chunk)
            else:
                last = chunk
        return _final(model.name, [last] if last is not None else [])
    response = await model.acomplete(messages, tools)
    if delta is not None and isinstance(response, ModelResponse) and response.content:
        delta(response.content)
    if not isinstance(response, ModelResponse):
        raise ModelError(f"{model.name}: answered {type(response).__name__}, not a ModelResponse")
    return response


async def _coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _failed(raw: Any) -> bool:
    return isinstance(raw, dict) and TOOL_ERROR in raw


def _visible(raw: Any) -> Any:
    """What the model sees of a tool's result: a failure as ``{"error": ..., "error_type": ...}``."""
    if _failed(raw):
        failure = raw[TOOL_ERROR]
        return {"error": failure["error"], "error_type": failure["error_type"]}
    return raw


def _is_error(result: Any) -> bool:
    return isinstance(result, dict) and set(result) <= {"error", "error_type"} and "error" in result


def _epoch() -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC)


#: How far ahead a turn limit parks a run: a sleep due now would not park it at all.
PARK = timedelta(milliseconds=10)


def _soon() -> datetime:
    """A pause point: the run parks as sleeping, due in :data:`PARK`, for the next resume or worker."""
    return datetime.now(UTC) + PARK
