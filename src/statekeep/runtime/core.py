"""The :class:`Runtime`: opens the four stores, registers agents, runs them, remembers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Literal

from statekeep._numbers import MAX_INT
from statekeep.config import Settings
from statekeep.context import ContextStore, SQLContextStore
from statekeep.db import Database
from statekeep.errors import InvalidInputError, SessionOwnerError
from statekeep.models import AsyncModel, Model
from statekeep.runtime.agent import Agent, AgentState, check_run
from statekeep.runtime.scope import current_scope, turn_limit
from statekeep.runtime.steps import AgentSteps
from statekeep.workflow import Engine, Registry, Run, RunContext, SQLWorkflowStore, Worker, Workflow
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
    them here (:meth:`run`, :meth:`resume`) or on workers (:meth:`start`,
    :meth:`worker`).

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
        model: Model | AsyncModel,
        keys: KeyRing | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.engine, self.context, self.working, self.model = engine, context, working, model
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
        audit = AuditLog(db("workflow"))
        return cls(
            engine=engine,
            context=context,
            working=working,
            memory=memory,
            model=model,
            keys=keys,
            audit=audit,
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
        before anything is written.

        Raises:
            SessionOwnerError: the session belongs to another owner; nothing was written.
        """
        check_run(owner, task, session_id)
        workflow = self.register(agent)
        self._claim_session(session_id or run_id, owner)
        with turn_limit(turns):
            return self.engine.run(workflow, run_id, owner, session_id or run_id, task)

    def resume(self, run_id: str, *, turns: int | None = None) -> Run:
        """Continue a run by its id alone (its agent must be registered in this process).

        Raises:
            SessionOwnerError: the run's session belongs to another owner; nothing was written.
        """
        run = self.engine.store.get(run_id)
        started = _agent_input(run)
        if started is not None and not run.status.finished:
            self._claim_session(started[1], started[0])
        with turn_limit(turns):
            return self.engine.resume(run_id)

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


def _agent_input(run: Run) -> tuple[str, str] | None:
    """(owner, session id) of an agent run, from its input; None for another workflow's run."""
    if not run.workflow.startswith("agent."):
        return None
    args = run.input.get("args") if isinstance(run.input, dict) else None
    if not isinstance(args, list) or len(args) != 3 or not all(isinstance(a, str) for a in args[:2]):
        return None
    return args[0], args[1]
