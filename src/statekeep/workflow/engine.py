"""The engine: start, resume and execute runs of registered workflows, under a fenced lease."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from datetime import timedelta
from functools import partial
from typing import Any, ParamSpec, TypeVar

from statekeep._check import check_id, check_run_id, check_seconds
from statekeep.db import Database, aio
from statekeep.errors import (
    ConfigError,
    InvalidInputError,
    LeaseLostError,
    NonDeterminismError,
    SealedDataError,
    StorageError,
    Suspended,
    UnknownWorkflowError,
    WorkflowVersionError,
)
from statekeep.keys import KeyRing
from statekeep.workflow import codec, spans
from statekeep.workflow._types import FINISHED, Run, RunStatus
from statekeep.workflow.base import WorkflowStore
from statekeep.workflow.execution import Execution
from statekeep.workflow.leases import Heartbeats
from statekeep.workflow.registry import Registry, Workflow
from statekeep.workflow.run_context import AsyncRunContext, RunContext
from statekeep.workflow.run_write import now
from statekeep.workflow.sql import SQLWorkflowStore
from statekeep.working import WorkingStateStore

P = ParamSpec("P")
R = TypeVar("R")

#: errors that mean the code or its configuration, not the run, is wrong: they reach the caller
#: and the run is held back (a sealed value this engine cannot open: it was built without keys=)
_HOLD = (NonDeterminismError, InvalidInputError, WorkflowVersionError, ConfigError, SealedDataError)


class Engine:
    """Runs registered workflows durably: every step commits before the next starts.

    Share one :class:`~statekeep.db.Database` with a
    :class:`~statekeep.working.SQLWorkingStateStore` and each step's completion
    commits in the same transaction as the state version it produced. ``db`` may
    also be any :class:`~statekeep.workflow.WorkflowStore` backend.

    ``keys`` (a :class:`~statekeep.keys.KeyRing`, for a URL or a Database) seals
    the payloads of owned runs and opens sealed ones, as the CLI, the console and
    the Runtime do: ``keys=open_key_ring(Settings.load())``. Without it, owned
    runs are stored plain, and a run holding sealed values is held back.

    Examples:
        >>> from statekeep.workflow import Registry, RunContext
        >>> registry = Registry()
        >>> @registry.workflow("greet", version=1)
        ... def greet(ctx: RunContext, name: str) -> str:
        ...     return ctx.step("shout", str.upper, name)
        >>> engine = Engine("sqlite:///:memory:", registry)
        >>> engine.run(greet, "greet-ada", "ada").output
        'ADA'
    """

    def __init__(
        self,
        db: Database | str | WorkflowStore,
        registry: Registry,
        *,
        state_store: WorkingStateStore | None = None,
        owner: str | None = None,
        lease: float = 30.0,
        keys: KeyRing | None = None,
    ) -> None:
        check_seconds(lease, "lease", positive=True)
        if not isinstance(registry, Registry):
            raise InvalidInputError(f"must be a Registry, not {type(registry).__name__}", field="registry")
        if owner:  # None or "" means: this host, process and a random suffix
            check_id(owner, "owner")
        if state_store is not None and not isinstance(state_store, WorkingStateStore):
            raise InvalidInputError(
                f"must be a WorkingStateStore or None, not {type(state_store).__name__}", field="state_store"
            )
        if keys is not None and isinstance(db, WorkflowStore):
            raise InvalidInputError("a ready-made store has its own key ring: pass keys= to it", field="keys")
        self.store = db if isinstance(db, WorkflowStore) else SQLWorkflowStore(db, keys=_key_ring(keys))
        self.registry = registry
        self.state_store = state_store
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease = float(lease)
        self._heartbeats = Heartbeats(self._heartbeat, lambda: self.lease / 3)

    # --- entry points ---------------------------------------------------------------------

    def purge(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> int:
        """Retention: delete finished runs (see :meth:`WorkflowStore.purge`) and their working state.

        The working state goes first: should the process die in between, the
        runs are still there, so purging again finds them and finishes the job.
        Returns the number of runs deleted.
        """
        ids = self.store.purgeable(older_than=older_than, keep_last=keep_last, workflow=workflow)
        if self.state_store is not None and ids:
            self.state_store.delete(*ids)
        return self.store.delete_runs(ids)

    def start(self, workflow: Workflow[P, R], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> Run:
        """Record a run as pending, for a worker to execute; return it (existing or new).

        Raises:
            InvalidInputError: bad run id or non-JSON input; nothing was written.
            RunConflictError: the id belongs to another workflow or input.
        """
        return self._open(workflow, run_id, args, kwargs)

    def run(self, workflow: Workflow[P, R], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> Run:
        """Start or resume a run and execute it here until it finishes or waits.

        Raises:
            InvalidInputError: bad run id or non-JSON input; nothing was written.
            UnknownWorkflowError: this engine's registry cannot run ``workflow`` (neither
                registered nor migratable); nothing was written. :meth:`start` enqueues a
                run for workers whose registry can.
            RunConflictError: the id belongs to another workflow or input.
            NonDeterminismError, StepOutputError, WorkflowVersionError: the code is wrong for this run.
        """
        if isinstance(workflow, Workflow):
            name, version = workflow.name, workflow.version
            if self.registry.migration_path(name, version) is None:
                raise UnknownWorkflowError("workflow", name, version)
        return self._take_and_execute(self._open(workflow, run_id, args, kwargs))

    def resume(self, run_id: str) -> Run:
        """Resume a run by id alone, here (taking it over from any other holder).

        Raises:
            RunNotFoundError: no run has this id (never a silent new run).
            WorkflowVersionError: the run's version is neither registered nor migratable.
        """
        return self._take_and_execute(self.store.get(run_id))

    def retry(self, run_id: str) -> Run:
        """Make a failed run runnable again, from its last completed step (see :meth:`WorkflowStore.retry`).

        It is not executed here: :meth:`resume` it, or a worker will.
        """
        return self.store.retry(run_id)

    def fork(
        self,
        run_id: str,
        new_id: str,
        at_seq: int,
        *,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> Run:
        """A new pending run ``new_id`` that starts from ``run_id``'s journal up to step ``at_seq``.

        Its input is the source's (or ``args``/``kwargs``), plus ``forked_from``
        (``{"run_id": ..., "seq": ...}``). Working state the copied steps refer to
        must already be stored under ``new_id``. See :meth:`WorkflowStore.fork`.

        Raises:
            InvalidInputError: bad ids, ``at_seq`` past the source's last step, or non-JSON input.
            RunNotFoundError: no such source run.
            RunConflictError: ``new_id`` is taken by another run.
        """
        source = self.store.get(run_id)
        check_run_id(new_id)
        stored = source.input if isinstance(source.input, dict) else {}
        payload = {
            "args": list(stored.get("args", [])) if args is None else list(args),
            "kwargs": dict(stored.get("kwargs", {})) if kwargs is None else dict(kwargs),
            "forked_from": {"run_id": run_id, "seq": at_seq},
        }
        try:
            text = codec.to_json(payload)
        except codec.NotJSONError as exc:
            raise InvalidInputError(f"workflow input is not JSON: {exc}", field="input") from exc
        return self.store.fork(
            run_id, at_seq, {"run_id": new_id, "input": text, "input_hash": codec.digest(payload)}
        )

    async def arun(self, workflow: Workflow[P, R], run_id: str, /, *args: P.args, **kwargs: P.kwargs) -> Run:
        """Awaitable :meth:`run`, for callers inside an event loop: the loop stays free.

        The one sync implementation is driven on this loop (:mod:`statekeep.db.aio`):
        statements go through the async driver, async steps and tools are awaited
        here. Without the ``async`` extra (or on an in-memory SQLite database) it
        runs in a worker thread instead.
        """
        call = partial(self.run, workflow, run_id, *args, **kwargs)
        db = getattr(self.store, "db", None)
        if getattr(db, "async_capable", False):
            return await aio.drive(call)
        return await asyncio.to_thread(call)

    def execute(self, run: Run) -> Run:
        """Execute a run this engine already holds the lease of (a worker's claim)."""
        with spans.run_attempt(run, self.owner) as attempt:
            result = self._execute(run)
            attempt.done(result)
            return result

    def _execute(self, run: Run) -> Run:
        workflow = self._resolve(run)
        exe = Execution(self.store, run, workflow, states=self.state_store, children=self, lease=self.lease)
        with self._heartbeats.held(run):
            try:
                output = _invoke(exe, self.store, run.input)
            except Suspended:
                return exe.parked or self.store.get(run.run_id)
            except (LeaseLostError, *_HOLD) as exc:
                self._hold(run, exc)
                raise
            except (StorageError, ConfigError):  # infrastructure, not the run: lease lapses, it is retried
                raise
            except Exception as exc:
                return self._finish(run, RunStatus.FAILED, None, f"{type(exc).__name__}: {exc}")
            try:
                encoded = codec.to_json(output)
            except codec.NotJSONError as exc:
                return self._finish(run, RunStatus.FAILED, None, f"workflow output is not JSON: {exc}")
            return self._finish(run, RunStatus.COMPLETED, encoded, None)

    def held_back(self) -> list[Run]:
        """Live runs this code cannot continue: unknown or unmigratable versions, or held by an error."""
        live = [s for s in RunStatus if s not in FINISHED]
        runnable = set(self.registry.runnable())
        return [
            r
            for r in self.store.list_runs(status=live, limit=100_000)
            if (r.workflow, r.version) not in runnable or (r.waiting or {}).get("held")
        ]

    # --- internals ------------------------------------------------------------------------

    def _open(
        self,
        workflow: Workflow[Any, Any],
        run_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        parent: Run | None = None,
    ) -> Run:
        check_run_id(run_id)
        if not isinstance(workflow, Workflow):
            raise InvalidInputError(
                f"expected a registered Workflow, got {type(workflow).__name__}", field="workflow"
            )
        payload = {"args": list(args), "kwargs": kwargs}
        try:
            text = codec.to_json(payload)
        except codec.NotJSONError as exc:
            raise InvalidInputError(f"workflow input is not JSON: {exc}", field="input") from exc
        state = workflow.state
        owner = workflow.owner_of(args, kwargs)
        if owner is None and parent is not None:
            owner = parent.owner  # a child run holds its parent's owner's data
        start = spans.RunStart(workflow.name, run_id)
        opened = self.store.open_run(
            {
                "run_id": run_id,
                "workflow": workflow.name,
                "version": workflow.version,
                "input": text,
                "input_hash": codec.digest(payload),
                "status": RunStatus.PENDING.value,
                "runnable_at": now(),
                "parent_id": None if parent is None else parent.run_id,
                "state_schema": None
                if state is None
                else getattr(state, "state_schema", "") or state.__name__,
                "state_schema_version": None if state is None else getattr(state, "state_version", 1),
                "trace_context": start.carrier,
                "owner": owner,
            },
            parent=parent,
        )
        start.stored(opened)
        return opened

    def _take_and_execute(self, run: Run, parent: Run | None = None) -> Run:
        if run.status.finished:
            return run
        self._resolve(run)  # fail before taking the lease when the version cannot run
        taken = self.store.acquire(run.run_id, self.owner, self.lease, parent=parent)
        if taken is None:  # a child another worker holds: the parent waits for it
            return run
        return taken if taken.status.finished else self.execute(taken)

    # --- child runs (the ChildRunner of an Execution) ---------------------------------------

    def open_child(
        self,
        workflow: Workflow[Any, Any],
        run_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        parent: Run,
    ) -> Run:
        """Record a child run of ``parent`` (fenced by the parent's lease), or return the existing one."""
        return self._open(workflow, run_id, args, kwargs, parent=parent)

    def run_child(self, child: Run, parent: Run) -> Run:
        """Take a child through its parent's lease and execute it here; unchanged if another holds it."""
        return self._take_and_execute(child, parent=parent)

    def _resolve(self, run: Run) -> Workflow[Any, Any]:
        """The workflow code for a run, migrating its journal to a newer version if needed."""
        if (run.workflow, run.version) in self.registry.workflows:
            return self.registry.get(run.workflow, run.version)
        path = self.registry.migration_path(run.workflow, run.version)
        if path is None:
            raise WorkflowVersionError(
                run.run_id, run.workflow, run.version, self.registry.versions(run.workflow)
            )
        target, chain = path
        journal = self.store.steps(run.run_id)
        for migrate in chain:
            journal = migrate(journal)
        with self.store.fenced(run) as tx:
            tx.replace_journal(journal, target)
        return self.registry.get(run.workflow, target)

    def _finish(self, run: Run, status: RunStatus, output: str | None, error: str | None) -> Run:
        with self.store.fenced(run) as tx:
            tx.finish(status, output, error)
        return self.store.get(run.run_id)

    def _heartbeat(self, run: Run) -> bool:
        """Extend the lease of a run executing here; False once it was taken over."""
        return self.store.heartbeat(run.run_id, run.epoch, self.lease)

    def _hold(self, run: Run, exc: BaseException) -> None:
        """Park a run the code cannot continue, so workers stop picking it up; a resume retries."""
        if isinstance(exc, LeaseLostError):
            return
        try:
            with self.store.fenced(run) as tx:
                tx.suspend(RunStatus.PENDING, None, {"held": f"{type(exc).__name__}: {exc}"})
        except LeaseLostError:
            pass


def _key_ring(keys: object) -> KeyRing | None:
    if keys is not None and not isinstance(keys, KeyRing):
        raise InvalidInputError(f"must be a KeyRing or None, not {type(keys).__name__}", field="keys")
    return keys


def _invoke(exe: Execution, store: WorkflowStore, stored: dict[str, Any]) -> Any:
    args, kwargs, workflow = stored["args"], stored["kwargs"], exe.workflow
    ctx = RunContext(exe)
    if not workflow.is_async:
        return workflow.fn(ctx, *args, **kwargs)
    db = getattr(store, "db", None)
    if isinstance(db, Database) and db.in_memory:
        # each thread would see its own empty in-memory database
        raise ConfigError(db.setting, str(db.url), "async workflows need a SQLite file, not :memory:")

    async def _main() -> Any:
        exe.loop = asyncio.get_running_loop()
        return await workflow.fn(AsyncRunContext(ctx), *args, **kwargs)

    if aio.active():  # driven on the caller's loop: the workflow runs there
        return aio.wait(_main())
    return asyncio.run(_main())
