"""The :class:`Runtime`: opens the four stores, registers agents, runs them, remembers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from statekeep._check import check_seconds
from statekeep.config import Settings
from statekeep.context import ContextStore, SQLContextStore
from statekeep.db import Database, aio
from statekeep.errors import InvalidInputError
from statekeep.models import AnyModel, AsyncModel, AsyncStreamingModel, Model, StreamingModel
from statekeep.runtime.agent import Agent, AgentState, check_run
from statekeep.runtime.driving import Driver
from statekeep.runtime.events import RunEvent
from statekeep.runtime.fork import fork_run
from statekeep.runtime.scope import Invocation, check_turns, current_scope
from statekeep.runtime.sessions import SessionClaims, agent_input
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
from statekeep.working import SQLWorkingStateStore, WorkingStateStore

if TYPE_CHECKING:
    from statekeep.audit import AuditLog
    from statekeep.erasure import ErasureReceipt
    from statekeep.keys import KeyRing
    from statekeep.memory import Embedder, Memory, MemoryKind, MemoryStore, SourceKind


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
        self._claims = SessionClaims(context, engine.store)
        self.steps = AgentSteps(context, model, lambda: self.memory, claim=self._claims.claim)
        self._driver = Driver(engine, self.retry_wait, self._driven)
        self._agents: dict[tuple[str, int], tuple[Agent, Workflow[Any, Any]]] = {}

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
        from statekeep.stores import Databases

        db = Databases(settings).of  # each store's database, as it declares; one per URL
        keys = open_key_ring(settings, db("keys"))
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
        audit = AuditLog(db("audit"))
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
        check_run(run_id, owner, task, session_id)
        workflow = self.register(agent)
        self._claims.claim(session_id or run_id, owner)
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
        return self._driver.drive(*self._starter(agent, run_id, owner, task, session_id, turns))

    def resume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Continue a run by its id alone (its agent must be registered in this process).

        Raises:
            SessionOwnerError: the run's session belongs to another owner; nothing was written.
        """
        return self._driver.drive(*self._resumer(run_id, turns))

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

        The same steps as :meth:`run`, driven on this loop: database statements go
        through the async drivers (aiosqlite, psycopg's async connections; the
        ``async`` extra), async models and tools are awaited here. Without those
        drivers the run executes in a worker thread.
        """
        return await self._driver.adrive(*self._starter(agent, run_id, owner, task, session_id, turns))

    async def aresume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Awaitable :meth:`resume`."""
        return await self._driver.adrive(*self._resumer(run_id, turns))

    async def aretry(self, run_id: str, *, turns: int | None = None) -> Run:
        """Awaitable :meth:`retry`."""
        await self._driver.hop(partial(self.engine.retry, run_id))
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
        return self._driver.stream(*self._starter(agent, run_id, owner, task, session_id, turns))

    def resume_stream(self, run_id: str, *, turns: int | None = None) -> Generator[RunEvent, None, None]:
        """:meth:`resume`, yielding events as :meth:`stream` does."""
        return self._driver.stream(*self._resumer(run_id, turns))

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
        """:meth:`stream` for ``async for``: driven on the event loop as :meth:`arun` is."""
        return self._driver.astream(*self._starter(agent, run_id, owner, task, session_id, turns))

    def aresume_stream(self, run_id: str, *, turns: int | None = None) -> AsyncIterator[RunEvent]:
        """:meth:`aresume`, yielding events as :meth:`astream` does."""
        return self._driver.astream(*self._resumer(run_id, turns))

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
        return fork_run(self.engine, self.context, self.working, run_id, at_step, new_id, session_id)

    def usage(self, run_id: str) -> Usage:
        """Tokens the run's model calls used so far (prompt, cached, completion), from its journal.

        Raises:
            RunNotFoundError: there is no such run.
        """
        steps = self.engine.store.steps(run_id)
        if not steps:
            self.engine.store.get(run_id)  # no run, or one that has not stepped yet
        return run_usage(steps)

    # --- how a call starts a run --------------------------------------------------------------

    def _starter(
        self, agent: Agent, run_id: str, owner: str, task: str, session_id: str | None, turns: int | None
    ) -> tuple[Invocation, Callable[[], Run]]:
        """The invocation of a call, and what starts its run (checked before anything runs)."""
        inv = Invocation(turns_left=check_turns(turns))
        check_run(run_id, owner, task, session_id)
        workflow = self.register(agent)
        session = session_id or run_id

        def start() -> Run:  # in the caller's thread, on its loop, or in a worker thread
            self._claims.claim(session, owner)
            return self.engine.run(workflow, run_id, owner, session, task)

        return inv, start

    def _resumer(self, run_id: str, turns: int | None) -> tuple[Invocation, Callable[[], Run]]:
        return Invocation(turns_left=check_turns(turns)), partial(self._resume, run_id)

    def _resume(self, run_id: str) -> Run:
        run = self.engine.store.get(run_id)
        started = agent_input(run)
        if started is not None and not run.status.finished:
            self._claims.claim(started[1], started[0])
        until = (run.waiting or {}).get("until") if run.status is RunStatus.SLEEPING else None
        if isinstance(until, str):  # parked by a turn limit a moment ago: due in a few ms
            ahead = (datetime.fromisoformat(until) - datetime.now(UTC)).total_seconds()
            if 0 < ahead <= PARK.total_seconds():
                aio.pause(ahead)
        return self.engine.resume(run_id)

    def _driven(self) -> bool:
        """True when every database of the runtime has an async driver: async calls run on the loop."""
        dbs = [getattr(s, "db", None) for s in (self.engine.store, self.context, self.working)]
        return all(isinstance(db, Database) and db.async_capable for db in dbs)

    def worker(self, **kw: Any) -> Worker:
        """A worker that executes runnable runs of the registered agents (see :class:`Worker`)."""
        return Worker(self.engine, **kw)

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

        Context sessions and their events and summaries (and the Agents SDK items
        stored for them), working-state versions, runs with their journal, ledger,
        approvals and events, memories, and last the owner's data keys. Live runs are refused with
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
