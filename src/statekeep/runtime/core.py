"""The :class:`Runtime`: opens the four stores, registers agents, runs them, remembers."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from statekeep._check import MAX_INT, check_int, check_seconds
from statekeep.config import Settings
from statekeep.context import ContextStore, SQLContextStore
from statekeep.db import Database
from statekeep.errors import InvalidInputError, RunConflictError, SessionOwnerError
from statekeep.models import AnyModel, AsyncModel, AsyncStreamingModel, Model, StreamingModel
from statekeep.runtime.agent import Agent, AgentState, check_run, check_words
from statekeep.runtime.events import ApprovalRequested, RunCompleted, RunEvent, RunFailed, RunWaiting
from statekeep.runtime.fork import copy_session, copy_states
from statekeep.runtime.scope import Invocation, check_turns, current_scope, invocation
from statekeep.runtime.steps import PARK, AgentSteps
from statekeep.runtime.usage import Usage, run_usage
from statekeep.workflow import (
    Engine,
    Registry,
    Run,
    RunContext,
    RunStatus,
    SQLWorkflowStore,
    Worker,
    Workflow,
)
from statekeep.workflow.base import MAX_SEQ
from statekeep.working import SQLWorkingStateStore, WorkingStateStore

if TYPE_CHECKING:
    from statekeep.audit import AuditLog
    from statekeep.erasure import ErasureReceipt
    from statekeep.keys import KeyRing
    from statekeep.memory import Embedder, Memory, MemoryKind, MemoryStore, SourceKind


_DONE = object()


class Runtime:
    """Composes context, working state, workflow and memory into durable agents.

    Build it with :meth:`open` from :class:`~statekeep.config.Settings` (the
    embedded default, or PostgreSQL with pgvector), register agents, and run
    them here (:meth:`run`, :meth:`resume`; :meth:`arun`, :meth:`aresume` in an
    event loop; :meth:`stream`, :meth:`astream` for events as they happen) or on
    workers (:meth:`start`, :meth:`worker`). A failed run is continued with
    :meth:`retry` and branched with :meth:`fork`.

    ``retry_wait`` is the longest wait before retrying a model call (a 429's
    ``Retry-After``, a backoff) that a call here sits out; a longer one returns
    the run ``sleeping``, and a worker (or a later resume) retries when it is due.

    A run's context session belongs to the run's owner: every entry point
    claims it for that owner before anything is written, and a session of
    another owner is refused with :class:`~statekeep.errors.SessionOwnerError`
    (no run, no event, no state is written, and the model is not called).

    Payloads are sealed at rest with per-owner data keys (``keys``, from the
    settings' key provider), and :meth:`erase_owner` removes an owner from every
    store at once; see docs/privacy.md.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        context: ContextStore,
        working: WorkingStateStore,
        memory: Callable[[], MemoryStore],
        model: AnyModel,
        retry_wait: float = 60.0,
        keys: KeyRing | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.engine, self.context, self.working, self.model = engine, context, working, model
        self.retry_wait = check_seconds(retry_wait, "retry_wait")
        self.keys, self.audit = keys, audit
        self._open_memory = memory
        self._memory: MemoryStore | None = None
        self.steps = AgentSteps(context, model, lambda: self.memory, claim=self._claim_session)
        self._agents: dict[tuple[str, int], tuple[Agent, Workflow[Any, Any]]] = {}
        #: the owner of each session's first agent run, read once, to claim sessions older than owners
        self._first_owners: dict[str, str] | None = None

    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        *,
        model: AnyModel,
        embedder: Embedder | None = None,
        lease: float = 30.0,
        retry_wait: float = 60.0,
    ) -> Runtime:
        """Open every store the settings name; stores that share a URL share a database.

        Memory is opened on first use (a LanceDB folder allows one writer at a time).

        Raises:
            ConfigError: a setting is malformed or its server unreachable.
        """
        if not isinstance(model, Model | AsyncModel | StreamingModel | AsyncStreamingModel):
            raise InvalidInputError(
                "needs complete(), acomplete(), stream() or astream(), and a name", field="model"
            )
        check_seconds(retry_wait, "retry_wait")
        if settings is not None and not isinstance(settings, Settings):
            raise InvalidInputError(
                f"must be Settings.load(...) or None, not {type(settings).__name__}", field="settings"
            )
        if embedder is not None:
            from statekeep.memory.embedders import is_embedder  # memory loads on first use

            if not is_embedder(embedder):
                kind = type(embedder).__name__
                raise InvalidInputError(f"must be an Embedder, not {kind}", field="embedder")
        settings = Settings.load() if settings is None else settings
        settings.check()
        from statekeep.audit import AuditLog
        from statekeep.keys import open_key_ring

        dbs: dict[str, Database] = {}

        def db(store: str) -> Database:
            url = settings.url_for(store)
            return dbs.setdefault(url, Database(url, setting=f"STATEKEEP_{store.upper()}_URL"))

        keys = open_key_ring(settings, db("workflow"))  # keys live with the workflow store
        working = SQLWorkingStateStore(db("working"), keys=keys)
        workflow = SQLWorkflowStore(db("workflow"), keys=keys)
        engine = Engine(workflow, Registry(), state_store=working, lease=lease)

        def memory() -> MemoryStore:
            from statekeep.memory import open_memory_store

            return open_memory_store(settings.memory_url, embedder)

        context = SQLContextStore(db("context"), keys=keys)
        # load the tokenizer now: loading it holds the GIL for a few hundred ms, which in the
        # middle of an arun would stall the caller's event loop from the worker thread
        context.counter.count("")
        audit = AuditLog(db("workflow"))
        return cls(
            engine=engine,
            context=context,
            working=working,
            memory=memory,
            model=model,
            retry_wait=retry_wait,
            keys=keys,
            audit=audit,
        )

    @classmethod
    async def aopen(
        cls,
        settings: Settings | None = None,
        *,
        model: AnyModel,
        embedder: Embedder | None = None,
        lease: float = 30.0,
        retry_wait: float = 60.0,
    ) -> Runtime:
        """Awaitable :meth:`open`: connecting and loading the tokenizer happen off the event loop."""
        return await asyncio.to_thread(
            partial(cls.open, settings, model=model, embedder=embedder, lease=lease, retry_wait=retry_wait)
        )

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
            return self.steps.run(ctx, agent, AgentState(owner=owner, session_id=session_id, task=task))

        name = f"agent.{agent.name}"
        registry = self.engine.registry
        workflow = registry.workflow(name, version=agent.version, state=AgentState, owner="owner")(loop)
        self._agents[(agent.name, agent.version)] = (agent, workflow)
        return workflow

    def start(
        self, agent: Agent, run_id: str, *, owner: str, task: str, session_id: str | None = None
    ) -> Run:
        """Record a run for a worker to execute; starting an existing id returns it unchanged.

        Raises:
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        check_run(owner, task, session_id)
        workflow = self.register(agent)
        self._claim_session(session_id or run_id, owner)
        return self.engine.start(workflow, run_id, owner, session_id or run_id, task)

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
        """Start or resume a run and execute it here until it finishes, waits, or has done ``turns`` turns.

        The session (``session_id``, by default the run id) is claimed for ``owner``
        before anything is written. Blocks the calling thread: inside an event loop,
        ``await`` :meth:`arun` instead.

        Raises:
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        start = self._starter(agent, run_id, owner, task, session_id)
        return self._drive(Invocation(turns_left=check_turns(turns)), start)

    def resume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Continue a run by its id alone (its agent must be registered in this process).

        Raises:
            SessionOwnerError: the run's session belongs to another owner; nothing was written.
        """
        return self._drive(Invocation(turns_left=check_turns(turns)), partial(self._resume, run_id))

    def retry(self, run_id: str, *, turns: int | None = None) -> Run:
        """Retry a failed run here, from its last completed step; the retry is recorded.

        A model call that had failed gets a new series of attempts; a tool call that
        failed under ``on_error="fail"`` is called again.

        Raises:
            InvalidInputError: the run has not failed.
        """
        self.engine.retry(run_id)
        return self.resume(run_id, turns=turns)

    async def arun(
        self,
        agent: Agent,
        run_id: str,
        *,
        owner: str,
        task: str,
        session_id: str | None = None,
        turns: int | None = None,
    ) -> Run:
        """Awaitable :meth:`run`: the event loop stays free.

        The durable core (database reads and writes) runs in a worker thread; async
        models and async tools are awaited on this loop.
        """
        start = self._starter(agent, run_id, owner, task, session_id)
        return await self._adrive(Invocation(turns_left=check_turns(turns)), start)

    async def aresume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Awaitable :meth:`resume`."""
        return await self._adrive(Invocation(turns_left=check_turns(turns)), partial(self._resume, run_id))

    async def aretry(self, run_id: str, *, turns: int | None = None) -> Run:
        """Awaitable :meth:`retry`."""
        await asyncio.to_thread(self.engine.retry, run_id)
        return await self.aresume(run_id, turns=turns)

    def stream(
        self,
        agent: Agent,
        run_id: str,
        *,
        owner: str,
        task: str,
        session_id: str | None = None,
        turns: int | None = None,
    ) -> Generator[RunEvent, None, None]:
        """:meth:`run`, yielding typed events as they happen (see :mod:`statekeep.runtime.events`).

        Model text arrives as :class:`TextDelta` while the provider streams it; the
        last event is :class:`RunCompleted`, :class:`RunWaiting` (after any
        :class:`ApprovalRequested`) or :class:`RunFailed`. Only completed messages are
        journaled. The run executes in a thread; leaving the loop early lets it go on
        to its next stop, and waits for that.
        """
        start = self._starter(agent, run_id, owner, task, session_id)
        return self._stream(Invocation(turns_left=check_turns(turns)), start)

    def resume_stream(self, run_id: str, *, turns: int | None = None) -> Generator[RunEvent, None, None]:
        """:meth:`resume`, yielding events as :meth:`stream` does."""
        return self._stream(Invocation(turns_left=check_turns(turns)), partial(self._resume, run_id))

    def astream(
        self,
        agent: Agent,
        run_id: str,
        *,
        owner: str,
        task: str,
        session_id: str | None = None,
        turns: int | None = None,
    ) -> AsyncIterator[RunEvent]:
        """:meth:`stream` for ``async for``: the event loop stays free, async models stream on it."""
        start = self._starter(agent, run_id, owner, task, session_id)
        return self._astream(Invocation(turns_left=check_turns(turns)), start)

    def aresume_stream(self, run_id: str, *, turns: int | None = None) -> AsyncIterator[RunEvent]:
        """:meth:`aresume`, yielding events as :meth:`astream` does."""
        return self._astream(Invocation(turns_left=check_turns(turns)), partial(self._resume, run_id))

    def fork(self, run_id: str, *, at_step: int, new_id: str, session_id: str | None = None) -> Run:
        """A new run ``new_id`` that continues ``run_id`` as it was after journal step ``at_step``.

        The steps up to ``at_step`` (the ``#N`` of ``statekeep runs events``) are copied,
        with the working state they produced and the session's messages up to their
        context cursor (into ``session_id``, default ``new_id``); nothing is executed
        again. The new run is pending: :meth:`resume` it, or a worker will. Its input
        records ``forked_from``; the source records the fork. Forking again to the same
        id returns the existing fork.

        Raises:
            InvalidInputError: not an agent run, or ``at_step`` past its last completed step.
            RunConflictError: ``new_id`` (or ``session_id``) is already used.
        """
        check_words(new_id, "new_id")
        check_int(at_step, "at_step", maximum=MAX_SEQ)
        if session_id is not None:
            check_words(session_id, "session_id")
        source = self.engine.store.get(run_id)
        if not source.workflow.startswith("agent.") or len(source.input.get("args", [])) != 3:
            raise InvalidInputError(f"run {run_id!r} is not an agent run", field="run_id")
        owner, session, task = source.input["args"]
        wanted = {"run_id": run_id, "seq": at_step}
        existing = self.engine.store.find(new_id)
        if existing is not None:
            if existing.input.get("forked_from") == wanted:
                return existing
            raise RunConflictError(new_id, "is taken by another run")
        if at_step > source.last_seq:
            raise InvalidInputError(
                f"run {run_id!r} has {source.last_seq} completed steps: cannot fork at step {at_step}",
                field="at_step",
            )
        journal = self.engine.store.journal(run_id, 1, at_step) if at_step else []
        version = max((s.state_version for s in journal if s.state_version is not None), default=0)
        cursor = max((s.cursor for s in journal if s.cursor is not None), default=0)
        target = session_id or new_id
        copy_session(self.context, session, target, cursor, (f"{run_id}/", f"{new_id}/"), owner)
        copy_states(self.working, run_id, new_id, version, target)
        return self.engine.fork(run_id, new_id, at_step, args=[owner, target, task])

    def usage(self, run_id: str) -> Usage:
        """Tokens the run's model calls used so far (prompt, cached, completion), from its journal."""
        return run_usage(self.engine.store.steps(run_id))

    # --- how a call drives a run --------------------------------------------------------------

    def _starter(
        self, agent: Agent, run_id: str, owner: str, task: str, session_id: str | None
    ) -> Callable[[], Run]:
        check_run(owner, task, session_id)
        workflow = self.register(agent)
        session = session_id or run_id

        def start() -> Run:  # in the caller's thread, or the worker thread of an async call
            self._claim_session(session, owner)
            return self.engine.run(workflow, run_id, owner, session, task)

        return start

    def _resume(self, run_id: str) -> Run:
        run = self.engine.store.get(run_id)
        started = _agent_input(run)
        if started is not None and not run.status.finished:
            self._claim_session(started[1], started[0])
        until = (run.waiting or {}).get("until") if run.status is RunStatus.SLEEPING else None
        if isinstance(until, str):  # parked by a turn limit a moment ago: due in a few ms
            ahead = (datetime.fromisoformat(until) - datetime.now(UTC)).total_seconds()
            if 0 < ahead <= PARK.total_seconds():
                time.sleep(ahead)
        return self.engine.resume(run_id)

    def _wait(self, run: Run, inv: Invocation) -> float | None:
        """Seconds to sit out before resuming a run that parked to retry a model call; None: return it."""
        due, inv.retry_due = inv.retry_due, None
        if due is None or run.status is not RunStatus.SLEEPING:
            return None
        seconds = (due - datetime.now(UTC)).total_seconds()
        return max(0.0, seconds) if seconds <= self.retry_wait else None

    def _drive(self, inv: Invocation, start: Callable[[], Run]) -> Run:
        token = invocation.set(inv)
        try:
            run = start()
            while (delay := self._wait(run, inv)) is not None:
                time.sleep(delay)
                run = self.engine.resume(run.run_id)
            return run
        finally:
            invocation.reset(token)

    async def _adrive(self, inv: Invocation, start: Callable[[], Run]) -> Run:
        inv.loop = asyncio.get_running_loop()
        token = invocation.set(inv)  # asyncio.to_thread carries it into the worker thread
        try:
            run = await asyncio.to_thread(start)
            while (delay := self._wait(run, inv)) is not None:
                await asyncio.sleep(delay)
                run = await asyncio.to_thread(self.engine.resume, run.run_id)
            return run
        finally:
            invocation.reset(token)

    def _stream(self, inv: Invocation, start: Callable[[], Run]) -> Generator[RunEvent, None, None]:
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        inv.sink = events.put
        outcome: list[BaseException] = []

        def work() -> None:
            try:
                for event in self._final_events(self._drive(inv, start)):
                    events.put(event)
            except BaseException as exc:
                outcome.append(exc)
            finally:
                events.put(_DONE)

        thread = threading.Thread(target=work, name="statekeep-stream", daemon=True)
        thread.start()
        try:
            while (event := events.get()) is not _DONE:
                yield event
        finally:
            thread.join()
        if outcome:
            raise outcome[0]

    async def _astream(self, inv: Invocation, start: Callable[[], Run]) -> AsyncIterator[RunEvent]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Any] = asyncio.Queue()

        def sink(event: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        inv.sink = sink

        async def drive() -> None:
            try:
                run = await self._adrive(inv, start)
                for event in await asyncio.to_thread(self._final_events, run):
                    events.put_nowait(event)
            finally:
                events.put_nowait(_DONE)

        task = asyncio.ensure_future(drive())
        try:
            while (event := await events.get()) is not _DONE:
                yield event
            task.result()
        finally:
            if not task.done():
                await asyncio.wait({task})

    def _final_events(self, run: Run) -> list[RunEvent]:
        if run.status is RunStatus.COMPLETED:
            return [RunCompleted(run.run_id, run.output, run)]
        if run.status is RunStatus.FAILED:
            return [RunFailed(run.run_id, run.error, run)]
        asked: list[RunEvent] = []
        if run.status in (RunStatus.WAITING_FOR_APPROVAL, RunStatus.NEEDS_DECISION):
            for a in self.engine.store.approvals(run_id=run.run_id):
                arguments = a.args.get("kwargs", {}) if isinstance(a.args, dict) else {}
                asked.append(ApprovalRequested(run.run_id, a.approval_id, a.action, arguments, a.reason))
        return [*asked, RunWaiting(run.run_id, run.status.value, run)]

    def worker(self, **kw: Any) -> Worker:
        """A worker that executes runnable runs of the registered agents (see :class:`Worker`)."""
        return Worker(self.engine, **kw)

    # --- sessions ---------------------------------------------------------------------------

    def _claim_session(self, session_id: str, owner: str) -> None:
        """Make the session ``owner``'s, or refuse it: a session belongs to one owner.

        A session that predates owners (events, but no owner) is first claimed for
        the owner of its first agent run, so the upgrade hands no one else's
        conversation to whichever owner happens to come first; a session without
        runs goes to this owner.

        Raises:
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        context = self.context
        current = context.owner_of(session_id)
        if current == owner:
            return  # an owner, once recorded, never changes: one read on every later run
        if current is not None:
            raise SessionOwnerError(session_id, owner, current)
        if context.last_seq(session_id) > 0:
            first = self._first_owner(session_id)
            if first is not None:
                with suppress(SessionOwnerError):  # claimed meanwhile: the claim below names that owner
                    context.claim(session_id, first)
        context.claim(session_id, owner)

    def _first_owner(self, session_id: str) -> str | None:
        """The owner of the session's first agent run, from one pass over the runs per runtime.

        Runs started since owners are recorded claim their session when they
        start, so only older runs matter, and they are all there at the first pass.
        """
        if self._first_owners is None:
            owners: dict[str, str] = {}
            for run in self.engine.store.list_runs(limit=MAX_INT):  # oldest first
                started = _agent_input(run)
                if started is not None:
                    owners.setdefault(started[1], started[0])
            self._first_owners = owners
        return self._first_owners.get(session_id)

    # --- erasure ----------------------------------------------------------------------------

    def erase_owner(
        self,
        owner: str,
        *,
        cancel_live: bool = False,
        actor: str | None = None,
        via: Literal["cli", "webhook", "api"] = "api",
    ) -> ErasureReceipt:
        """Erase everything of ``owner`` from every store, with one receipt (see :mod:`statekeep.erasure`).

        Context sessions and their events and summaries, working-state versions,
        runs with their journal, ledger, approvals and events, memories, and last
        the owner's data keys. Live runs are refused with
        :class:`~statekeep.errors.LiveRunsError` unless ``cancel_live``. The
        erasure is recorded in the audit log (``actor``, default ``"runtime"``)
        with the owner's id and the counts only.

        Raises:
            LiveRunsError: the owner has live runs and ``cancel_live`` is False; nothing was erased.
            ErasureError: rows were deleted but a file could not be rewritten; erase again.
        """
        from statekeep.erasure import erase_owner

        receipt = erase_owner(
            owner,
            context=self.context,
            working=self.working,
            workflow=self.engine.store,
            memory=self.memory,
            keys=self.keys,
            cancel_live=cancel_live,
        )
        if self.audit is not None:
            self.audit.record(actor or "runtime", "erase", owner, via=via, detail=receipt.counts())
        return receipt

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
        self.steps.close()
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        for store in (self.engine.store, self.context, self.working):
            store.close()  # stores that share a database each release it; a second dispose is a no-op
        for extra in (self.keys, self.audit):
            if extra is not None:
                extra.db.dispose()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)


def _agent_input(run: Run) -> tuple[str, str] | None:
    """(owner, session id) of an agent run, from its input; None for another workflow's run."""
    if not run.workflow.startswith("agent."):
        return None
    args = run.input.get("args") if isinstance(run.input, dict) else None
    if not isinstance(args, list) or len(args) != 3 or not all(isinstance(a, str) for a in args[:2]):
        return None
    return args[0], args[1]
