"""What a running step writes through: :class:`RunWrite`, one fenced transaction of a run.

Every write a worker makes to a run goes through :meth:`WorkflowStore.fenced
<statekeep.workflow.base.WorkflowStore.fenced>`, which hands out a :class:`RunWrite`
and refuses the whole transaction once the worker's lease epoch is no longer the
run's current one. A backend implements it beside its
:class:`~statekeep.workflow.base.WorkflowStore` (whose ``_fenced`` primitive
opens it). Its abstract methods are primitives themselves: only the engine calls
them, inside a fenced block, with values it built and checked, so unlike the
store's public methods they have nothing to validate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pydantic

from statekeep.workflow._types import Run, RunStatus, StepRecord
from statekeep.working import StateVersion, WorkingStateStore

#: A staged working state: the validated model and the version record that will store it.
StagedState = tuple[pydantic.BaseModel, StateVersion]


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class RunWrite(ABC):
    """One fenced write transaction of a run: everything in it commits together, or nothing does.

    Obtained from :meth:`WorkflowStore.fenced`; its methods act on the run it was
    opened for (``run``) and are only valid inside the ``with`` block.
    """

    #: The run as :meth:`suspend` left it, when the backend read it back with the write
    #: (the engine returns it after the commit instead of reading the run again).
    parked: Run | None = None

    def __init__(self, run: Run) -> None:
        self.run = run

    def connection(self, db: object) -> Any | None:
        """This transaction's connection, for writes of another store on the same database ``db``.

        None when ``db`` is not this transaction's database (or the backend has no
        connection to share): the caller then writes in a transaction of its own.
        """
        return None

    # --- the journal ----------------------------------------------------------------------

    @abstractmethod
    def record_step(self, step: StepRecord) -> None:
        """Insert a journal entry and move the run's checkpoint (last seq, state version, cursor)."""

    def save_state(self, states: WorkingStateStore, staged: StagedState, latest: int | None) -> int:
        """Store a staged working state for the completion being written; return its version.

        The default writes it first, in the state store's own transaction, so that the
        completion can point at it (a crash in between leaves a version no step points
        at, which replay never reads). A backend that shares a database with the state
        store overrides this to write both in this transaction.
        """
        state, _ = staged
        return states.save(self.run.run_id, state, owner=self.run.owner).version

    @abstractmethod
    def replace_journal(self, journal: list[StepRecord], version: int) -> None:
        """Rewrite the whole journal (a journal migration) and move the run to ``version``."""

    # --- the ledger -----------------------------------------------------------------------

    @abstractmethod
    def start_call(self, seq: int, tool: str, key: str, args: str) -> None:
        """Record a tool call as started, with its idempotency key, before it runs."""

    @abstractmethod
    def extend_lease(self, seconds: float) -> None:
        """Lease the run to its holder for ``seconds`` from now, under the transaction's epoch.

        Written in the transaction that records a tool call as started, before the tool
        runs: a holder whose heartbeats fell behind (a stalled machine, a slow commit) has
        its whole lease again when the call's effect begins, or hears "lease lost" and
        makes no call; no other worker can take the run over while the call is young.

        Raises:
            LeaseLostError: the run was taken over; nothing of the transaction is written.
        """

    @abstractmethod
    def restart_call(self, seq: int) -> None:
        """Mark a settled ambiguous call as started again, just before it is re-run."""

    @abstractmethod
    def drop_call(self, seq: int) -> None:
        """Forget a started call whose tool raised: it reported that it did not complete."""

    @abstractmethod
    def complete_call(self, seq: int, result: str) -> None:
        """Store a tool call's result and mark it completed."""

    # --- approvals and events -------------------------------------------------------------

    @abstractmethod
    def open_approval(self, fields: dict[str, Any], expires_at: datetime | None) -> str:
        """Insert a pending approval; return its id.

        ``fields`` holds its seq, kind, action, args, args_hash and reason.
        """

    @abstractmethod
    def approval_pending(self, approval_id: str) -> bool:
        """True while an approval awaits a decision."""

    @abstractmethod
    def expire_approval(self, approval_id: str) -> None:
        """Mark a pending approval expired (fail closed)."""

    @abstractmethod
    def take_event(self, name: str, seq: int) -> tuple[bool, Any]:
        """Consume the oldest unconsumed event ``name`` for the wait at ``seq``: (received, payload)."""

    # --- the run's status -----------------------------------------------------------------

    @abstractmethod
    def suspend(self, status: RunStatus, wake_at: datetime | None, waiting: dict[str, Any]) -> None:
        """Park the run in a waiting state and release its lease."""

    @abstractmethod
    def wake(self, waiting: Iterable[RunStatus]) -> bool:
        """Make the run runnable now if it is in one of the ``waiting`` states."""

    @abstractmethod
    def finish(self, status: RunStatus, output: str | None, error: str | None) -> None:
        """End the run, withdraw its pending approvals, and wake its parent if it waits for it."""

    @abstractmethod
    def child_finished(self, child_id: str) -> bool:
        """True when the child run ``child_id`` has finished (read under this transaction's lock)."""


__all__ = ["RunWrite", "StagedState", "now"]
