"""The workflow store's contract: what a backend implements (its fenced writes: :mod:`.run_write`).

A backend implements :class:`WorkflowStore` (runs, leases, the journal, the
ledger, approvals, events) and the :class:`~statekeep.workflow.run_write.RunWrite`
that :meth:`WorkflowStore.fenced` hands out (that module says what fencing refuses).
The engine and the run context never see SQL; ``statekeep.testing`` checks that a
backend keeps the invariants.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

from statekeep.workflow._types import (
    Approval,
    Checkpoint,
    LedgerEntry,
    ReplayEntry,
    Run,
    RunPage,
    RunStatus,
    StepRecord,
)
from statekeep.workflow.run_write import RunWrite, StagedState, now
from statekeep.workflow.search import (
    MAX_PAGE,
    check_run_filters,
    page_of,
    run_matches,
    run_owner,
    statuses,
)

#: The largest journal position: seq columns are 32-bit integers.
MAX_SEQ = 2**31 - 1

#: Approval statuses, in the order a person meets them.
APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "withdrawn")

#: Runs a person or a worker still has to act on.
LIVE = frozenset(s for s in RunStatus if not s.finished)


class WorkflowStore(ABC):
    """The workflow store: runs, leases, the journal, the ledger, approvals and events.

    :class:`~statekeep.workflow.SQLWorkflowStore` is the backend for SQLite and
    PostgreSQL; :class:`~statekeep.workflow.InMemoryWorkflowStore` the reference
    in process memory. Reads take a run id; every write of a running worker goes
    through :meth:`fenced`.
    """

    # --- runs -----------------------------------------------------------------------------

    @abstractmethod
    def open_run(self, run: dict[str, Any], *, parent: Run | None = None) -> Run:
        """Insert a new run (``run`` holds its fields) or return the existing one with that id.

        With ``parent``, the insert is fenced by the parent's lease epoch: a stale
        holder of the parent cannot create its children.

        Raises:
            RunConflictError: the id is taken by another workflow or another input.
            LeaseLostError: ``parent`` was taken over; nothing was written.
        """

    @abstractmethod
    def find(self, run_id: str) -> Run | None:
        """The run with this id, or None."""

    @abstractmethod
    def list_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 1000,
    ) -> list[Run]:
        """Runs filtered by status (a status, its name, or several), workflow name or parent, oldest first."""

    def search_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        owner: str | Iterable[str] | None = None,
        text: str | None = None,
        run_ids: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> RunPage:
        """A page of runs, newest first, with the total that matched and the count per status.

        ``owner`` (one or several) keeps the runs of those owners (:func:`run_owner`);
        ``text`` keeps runs whose id, workflow, input or error contains it (any case);
        ``run_ids`` keeps only those runs. This default reads every run of the
        workflow; a backend overrides it with queries.

        Raises:
            InvalidInputError: a malformed filter, ``limit`` not from 1 to 1000, a negative ``offset``.
        """
        owners, needle, ids = check_run_filters(owner, text, run_ids, limit, offset)
        matched = [
            run
            for run in self.list_runs(workflow=workflow, limit=MAX_SEQ)
            if (owners is None or run_owner(run) in owners)
            and (ids is None or run.run_id in ids)
            and (needle is None or run_matches(run, needle))
        ]
        return page_of(matched, status, limit, offset)

    def workflow_names(self) -> list[str]:
        """The names of the workflows that have runs, sorted."""
        return sorted({r.workflow for r in self.list_runs(limit=MAX_SEQ)})

    @abstractmethod
    def cancel(self, run_id: str) -> Run:
        """Cancel a live run; its lease is revoked (epoch bumped) so no worker advances it.

        Raises:
            RunNotFoundError: no such run.
            RunFinishedError: the run has already finished.
        """

    @abstractmethod
    def retry(self, run_id: str) -> Run:
        """Make a failed run runnable again; it continues after its last completed step.

        The journal, the ledger and the working state are kept (the failing step never
        committed, so replay runs it again); the error is cleared, the lease epoch bumped.
        The retry is recorded as the event ``statekeep.retried`` (with the error it
        cleared), which no wait ever consumes.

        Raises:
            RunNotFoundError: no such run.
            InvalidInputError: the run has not failed.
        """

    @abstractmethod
    def fork(self, run_id: str, at_seq: int, run: dict[str, Any]) -> Run:
        """Start the run ``run["run_id"]`` from the journal of ``run_id`` up to ``at_seq``.

        ``run`` holds the new run's ``run_id``, ``input`` and ``input_hash``; its workflow,
        version and state schema are the source's. Journal entries and completed ledger
        calls up to ``at_seq`` are copied (idempotency keys renamed to the new run), and
        its checkpoint is theirs: the working-state version and context cursor of the
        last entries that set one, which the caller copies first. The new run is pending.
        The fork is recorded on the source as the event ``statekeep.forked``. Forking
        again to the same id with the same input returns the existing run.

        Raises:
            RunNotFoundError: no such source run.
            InvalidInputError: ``at_seq`` is past the source's last completed step.
            RunConflictError: the new id is taken by another run.
        """

    def get(self, run_id: str) -> Run:
        """The run with this id.

        Raises:
            RunNotFoundError: no such run.
        """
        from statekeep.errors import RunNotFoundError

        run = self.find(run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def checkpoint(self, run_id: str) -> Checkpoint:
        """The run's last completed step, latest working-state version and context cursor."""
        run = self.get(run_id)
        return Checkpoint(run.run_id, run.last_seq, run.state_version, run.cursor)

    # --- leases ---------------------------------------------------------------------------

    @abstractmethod
    def acquire(self, run_id: str, owner: str, lease: float, *, parent: Run | None = None) -> Run | None:
        """Take a run for ``owner``: bump its epoch (fencing every earlier holder) and lease it.

        Without ``parent`` this is an explicit takeover (a person's resume): the run is
        taken from any holder. With ``parent`` (a child run started inline), it is taken
        only while ``parent`` holds its current epoch, in the same transaction, and only
        if the child's lease has lapsed: a child with a live lease is left to its holder,
        even one that held it through an older epoch of the parent (that holder is alive,
        and may be inside one of the child's tool calls); the parent then waits for it.

        Returns:
            The run as taken; the run unchanged if it has finished; None if it is
            live and held by another worker.

        Raises:
            RunNotFoundError: no such run.
            LeaseLostError: ``parent`` was taken over; nothing was written.
        """

    @abstractmethod
    def claim(self, owner: str, lease: float, limit: int, workflows: Iterable[tuple[str, int]]) -> list[Run]:
        """Claim up to ``limit`` runnable runs (due, lease lapsed) of the given (workflow, version) pairs."""

    @abstractmethod
    def heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        """Extend a lease; False when the epoch is stale (the run was taken over)."""

    def shares(self, db: object) -> bool:
        """True when a :class:`RunWrite` of this store can lend its connection to writes on ``db``."""
        return False

    @abstractmethod
    def fenced(self, run: Run) -> AbstractContextManager[RunWrite]:
        """A write transaction of ``run`` that goes through only while ``run.epoch`` is current.

        Raises:
            LeaseLostError: another worker took the run over; nothing was written.
        """

    # --- journal and ledger ---------------------------------------------------------------

    @abstractmethod
    def journal(self, run_id: str, start: int, size: int) -> list[StepRecord]:
        """Journal entries ``start <= seq < start + size`` of a run, in order."""

    @abstractmethod
    def tool_calls(self, run_id: str) -> list[LedgerEntry]:
        """Every ledger entry of a run, in order."""

    @abstractmethod
    def tool_call(self, run_id: str, seq: int) -> LedgerEntry | None:
        """The ledger entry at a journal position, or None."""

    def replay(self, run_id: str, start: int, size: int) -> list[ReplayEntry]:
        """What replay needs of entries ``start <= seq < start + size`` (default: from :meth:`journal`)."""
        entries = self.journal(run_id, start, size)
        return [ReplayEntry(s.seq, s.name, s.kind, s.state_version, s.output) for s in entries]

    def steps(self, run_id: str) -> list[StepRecord]:
        """Every journal entry of a run, in order."""
        return self.journal(run_id, 1, MAX_SEQ)

    # --- approvals and events -------------------------------------------------------------

    @abstractmethod
    def approvals(
        self,
        *,
        status: str | None = "pending",
        run_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[Approval]:
        """Approvals filtered by status (``pending`` by default; None for all), run, kind or action.

        Oldest first: by creation time, then by id (a stable order, so pages neither
        repeat nor skip an approval).

        Args:
            limit: at most this many (1 to 10,000); None for every one.
            after: an approval's id, the last of the page before: only the approvals
                after it in this order (it need not match the filters).

        Raises:
            InvalidInputError: a filter that is not a storable, non-empty string, or a
                ``limit`` out of range.
            ApprovalNotFoundError: no approval has the id ``after``.
        """

    @abstractmethod
    def approval(self, approval_id: str) -> Approval:
        """One approval by id.

        Raises:
            InvalidInputError: ``approval_id`` is not an id.
            ApprovalNotFoundError: no such approval.
        """

    @abstractmethod
    def approval_at(self, run_id: str, seq: int, kind: str) -> Approval | None:
        """The latest approval of ``kind`` a run opened at a journal position, if any."""

    @abstractmethod
    def decide(
        self, approval_id: str, *, approve: bool, by: str, comment: str | None = None, result: Any = None
    ) -> Approval:
        """Record a person's decision, once, and make the run runnable again.

        For an ``ambiguous`` tool call, approve means "it did not happen: run it";
        reject means "it happened", and ``result`` becomes the call's output.

        Raises:
            InvalidInputError: a bad id, ``by`` empty, ``approve`` not a bool, ``comment``
                not storable text, or ``result`` not JSON; nothing was written.
            ApprovalNotFoundError: no such approval.
            ApprovalDecidedError: the approval was already decided or withdrawn.
            ApprovalExpiredError: the approval expired (now or before); it is recorded as
                expired and fails closed.
        """

    @abstractmethod
    def send_event(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver a named event to a run: woken if it waits for it, kept until it does otherwise.

        Raises:
            InvalidInputError: empty name or non-JSON payload; nothing was written.
            RunNotFoundError: no such run.
            RunFinishedError: the run has finished; the event is refused.
        """

    # --- retention ------------------------------------------------------------------------

    @abstractmethod
    def purgeable(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> list[str]:
        """The ids :meth:`purge` would delete, without deleting anything."""

    @abstractmethod
    def delete_runs(self, run_ids: list[str]) -> int:
        """Delete these finished runs with their journal, ledger, approvals and events; live ones are kept."""

    # --- erasure --------------------------------------------------------------------------

    def runs_of(self, owner: str) -> list[Run]:
        """Every run of ``owner`` (any status, child runs included), oldest first."""
        raise NotImplementedError(f"{type(self).__name__} cannot find runs by owner")

    def delete_owner(self, owner: str) -> dict[str, int]:
        """Erasure: delete every finished run of ``owner`` with its journal, ledger, approvals and events.

        Returns the counts removed (``runs``, ``steps``, ``tool_calls``,
        ``approvals``, ``events``). Live runs are kept (cancel them first).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot erase by owner")

    def purge(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> int:
        """Retention: delete finished runs older than an age, or beyond the last N per workflow.

        Live runs (anything not completed, failed or cancelled) are never touched.
        Returns the number of runs deleted. This deletes the workflow store's rows
        only; :meth:`Engine.purge <statekeep.workflow.Engine.purge>` also deletes
        the runs' working state.
        """
        return self.delete_runs(self.purgeable(older_than=older_than, keep_last=keep_last, workflow=workflow))

    def close(self) -> None:  # noqa: B027 - a backend without resources has nothing to release
        """Release connections; the store must not be used afterwards."""


__all__ = [
    "APPROVAL_STATUSES",
    "LIVE",
    "MAX_PAGE",
    "MAX_SEQ",
    "RunWrite",
    "StagedState",
    "WorkflowStore",
    "check_run_filters",
    "now",
    "page_of",
    "run_matches",
    "run_owner",
    "statuses",
]
