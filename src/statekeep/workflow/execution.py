"""One execution of a run under its lease: the journal position, staged state, and fenced writes.

:class:`Execution` is what a running step writes through. The run context, the
ledger (:mod:`.tools`) and the waits (:mod:`.waits`) use its public methods;
none of them sees the store's transactions or SQL.

Replay is faithful: while the workflow re-walks completed steps, :meth:`state`
returns the working state as it was at that position (the version committed
with the step just replayed, or none before the first), and anything staged
before a replayed step is dropped, because that step already committed it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import pydantic

from statekeep.db import aio
from statekeep.errors import InvalidInputError, NonDeterminismError, StateNotFoundError, StepOutputError
from statekeep.workflow import codec, spans
from statekeep.workflow._types import Checkpoint, ReplayEntry, Run, StepKind, StepRecord
from statekeep.workflow.base import WorkflowStore
from statekeep.workflow.registry import Workflow
from statekeep.workflow.run_write import RunWrite, StagedState, now
from statekeep.working import StateVersion, WorkingStateStore

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)

#: Journal entries read per round trip during replay: a first page this small (a run that
#: fast-forwards or fails early reads little), each next one twice the last, up to PAGE.
FIRST_PAGE = 64
PAGE = 1024


@dataclass(frozen=True)
class Finish(Generic[T]):
    """A step's value, finished inside the transaction that commits the step's completion.

    A step function returns ``Finish(fn)`` to make writes of another store on the
    same database (a context event, say) commit together with its completion:
    ``fn(tx)`` runs in the fenced transaction, before the staged state and cursor
    are written (so it may still stage them), and its return value is the step's
    output. If anything fails, nothing of the step is committed.
    """

    fn: Callable[[RunWrite], T]


class ChildRunner(Protocol):
    """Opens and executes child runs for a parent (the engine)."""

    def open_child(
        self,
        workflow: Workflow[Any, Any],
        run_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        parent: Run,
    ) -> Run:
        """Record the child run (fenced by the parent's lease) or return the existing one."""
        ...

    def run_child(self, child: Run, parent: Run) -> Run:
        """Take the child through its parent and execute it here, if nobody else holds it."""
        ...


class Execution:
    """The write side of one execution of a run, under the lease epoch in ``run``."""

    def __init__(
        self,
        store: WorkflowStore,
        run: Run,
        workflow: Workflow[Any, Any],
        *,
        states: WorkingStateStore | None,
        children: ChildRunner,
        lease: float,
    ) -> None:
        self.store, self.run, self.workflow = store, run, workflow
        self.lease = lease  # seconds: what a tool call's start extends the lease to
        self.states, self.children = states, children
        self.loop: asyncio.AbstractEventLoop | None = None
        self._seq = 0
        self._calls = 0
        self._staged: StagedState | None = None
        self._cursor: int | None = None
        self._latest = run.state_version  # the newest version the run committed
        self._state_at: int | None = None  # the version as of the current position
        # the version this execution committed last, as staged: read back without a round trip
        self._committed: tuple[int, StateVersion] | None = None
        self._last_seq = run.last_seq
        self._page: dict[int, ReplayEntry] = {}
        self._span = range(0)
        self._written: list[StepRecord] = []  # completions of the open transaction, logged at commit
        self.parked: Run | None = None  # the run as the last committed write parked it, if known

    @property
    def run_id(self) -> str:
        """The id of the run."""
        return self.run.run_id

    @property
    def seq(self) -> int:
        """The journal position of the latest step the workflow asked for."""
        return self._seq

    @property
    def replaying(self) -> bool:
        """True while the workflow is re-walking steps that already completed."""
        return self._seq < self._last_seq

    # --- the journal position -------------------------------------------------------------

    def position(self, name: str, kind: StepKind) -> tuple[int, ReplayEntry | None]:
        """Advance to the next journal position; return it and its record if it already completed.

        A completed step brings the replay's state to the version it committed, and
        drops whatever was staged before it (it committed that already).

        Raises:
            NonDeterminismError: the journal recorded another step at this position.
        """
        # ``name`` is checked where it enters: Step(), the registry (tools, child workflows)
        # and the waits, so the hot path of a step does not check it twice.
        seq = self._seq = self._seq + 1
        # the page in hand answers without a call: a replay asks here once per step it re-walks
        recorded = self._page.get(seq) if seq in self._span else self._recorded(seq)
        if recorded is None:
            return seq, None
        if recorded.name != name or recorded.kind != kind:
            raise NonDeterminismError(self.run_id, seq, f"{recorded.kind} {recorded.name}", f"{kind} {name}")
        self._staged, self._cursor = None, None
        if recorded.state_version is not None:
            self._state_at = recorded.state_version
        return seq, recorded

    def next_call_index(self) -> int:
        """The index of the next tool call of this execution (part of its idempotency key)."""
        self._calls += 1
        return self._calls - 1

    def fast_forward(self) -> Checkpoint | None:
        """Skip replay: continue after the last completed step, and return that checkpoint."""
        if self._seq != 0:
            raise InvalidInputError("must be called before any step", field="fast_forward")
        if self._last_seq == 0:
            return None
        self._seq = self._last_seq
        self._state_at = self.run.state_version
        return Checkpoint(self.run_id, self.run.last_seq, self.run.state_version, self.run.cursor)

    def _recorded(self, seq: int) -> ReplayEntry | None:
        if seq > self._last_seq:
            return None
        if seq not in self._span:  # replay reads a page at a time, never the whole journal
            size = min(PAGE, max(FIRST_PAGE, 2 * len(self._span)))
            self._span = range(seq, seq + size)
            self._page = {s.seq: s for s in self.store.replay(self.run_id, seq, size)}
        return self._page.get(seq)

    # --- working state and cursor ---------------------------------------------------------

    def stage_state(self, state: pydantic.BaseModel) -> None:
        """Stage a working-state version (validated, not written) for the next completion."""
        if self.states is None:
            raise InvalidInputError("this engine has no working-state store", field="state")
        self._staged = (state, self.states.prepare(self.run_id, state))

    def stage_cursor(self, cursor: int) -> None:
        """Stage a context cursor for the next completion."""
        self._cursor = cursor

    def state(self, model: type[M]) -> M | None:
        """The working state as of this position, loaded into ``model``; None before the first."""
        if self.states is None or self._state_at is None:
            return None
        if self._committed is not None and self._committed[0] == self._state_at:
            return self.states.decode(self._committed[1], model)
        try:  # one primary-key lookup, however many versions the run has
            return self.states.load(self.run_id, model, version=self._state_at)
        except StateNotFoundError:
            return None

    # --- writes ---------------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[RunWrite]:
        """A fenced transaction of this run (see :meth:`WorkflowStore.fenced`)."""
        self._written.clear()
        with self.store.fenced(self.run) as tx:
            yield tx
        self.parked = tx.parked
        spans.steps_committed(self.run, self._written)

    def record(
        self,
        tx: RunWrite,
        seq: int,
        name: str,
        kind: StepKind,
        input_hash: str,
        output: str,
        *,
        attempt: int = 1,
        started: datetime | None = None,
    ) -> Any:
        """Write a completion, with the staged state and cursor, in ``tx``; return the decoded output."""
        version = None
        staged = self._staged
        if staged is not None and self.states is not None:
            version = tx.save_state(self.states, staged, self._latest)
        stamp = now()
        step = StepRecord(
            self.run_id,
            seq,
            name,
            kind,
            input_hash,
            output,
            attempt,
            started or stamp,
            stamp,
            version,
            self._cursor,
        )
        tx.record_step(step)
        self._written.append(step)
        self._staged, self._cursor = None, None
        if version is not None and staged is not None:  # only read again after this transaction commits
            self._latest = self._state_at = version
            self._committed = (version, staged[1])
        return codec.loads(output)

    def commit(
        self,
        seq: int,
        name: str,
        kind: StepKind,
        input_hash: str,
        output: str,
        *,
        attempt: int = 1,
        started: datetime | None = None,
    ) -> Any:
        """:meth:`record` in a fenced transaction of its own."""
        with self.write() as tx:
            return self.record(tx, seq, name, kind, input_hash, output, attempt=attempt, started=started)

    def complete(
        self, seq: int, name: str, input_hash: str, value: Any, *, attempt: int, started: datetime
    ) -> Any:
        """Commit a step's value (finishing a :class:`Finish` in the transaction); return the decoded output.

        Raises:
            StepOutputError: the value is not JSON; nothing was committed.
        """
        if not isinstance(value, Finish):
            output = self.encode(name, value)
            return self.commit(seq, name, "step", input_hash, output, attempt=attempt, started=started)
        with self.write() as tx:
            output = self.encode(name, value.fn(tx))
            return self.record(tx, seq, name, "step", input_hash, output, attempt=attempt, started=started)

    # --- calling user code ----------------------------------------------------------------

    def invoke(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a step function or tool; an awaitable result is awaited on the workflow's loop."""
        result = fn(*args, **kwargs)
        if not inspect.isawaitable(result):
            return result
        if aio.active():  # driven on the loop: await it there
            return aio.wait(result)
        if self.loop is not None:
            return asyncio.run_coroutine_threadsafe(_coro(result), self.loop).result()
        return asyncio.run(_coro(result))

    def encode(self, name: str, value: Any) -> str:
        """A step's output as JSON.

        Raises:
            StepOutputError: the value does not survive a JSON round trip.
        """
        try:
            return codec.to_json(value)
        except codec.NotJSONError as exc:
            raise StepOutputError(self.run_id, name, str(exc)) from exc


async def _coro(awaitable: Awaitable[T]) -> T:
    return await awaitable
