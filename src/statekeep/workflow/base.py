"""The workflow store's contract: public methods that validate once, over the primitives a backend implements.

:class:`WorkflowStore`'s public methods (runs, leases, the journal, the ledger,
approvals, events, retention, erasure) check their arguments here, once, and call
a private primitive (``_find``, ``_cancel``, ``_decide``...) with checked values;
a backend implements the primitives and the
:class:`~statekeep.workflow.run_write.RunWrite` that ``_fenced`` hands out (that
module says what fencing refuses). The engine and the run context never see
SQL; ``statekeep.testing`` checks that a backend keeps the invariants.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from statekeep._check import check_id, check_int, check_optional_id, check_run_id
from statekeep.errors import ApprovalExpiredError, RunNotFoundError
from statekeep.workflow._types import (
    MAX_SEQ,
    Approval,
    Checkpoint,
    LedgerEntry,
    ReplayEntry,
    Run,
    RunPage,
    RunStatus,
    StepRecord,
)
from statekeep.workflow.rules import (
    check_approval_filters,
    check_approvals_page,
    check_decision,
    check_event,
    check_retention,
    check_run_ids,
    purge_selection,
    same_run,
)
from statekeep.workflow.run_write import RunWrite
from statekeep.workflow.search import check_run_filters, page_of, run_matches, run_owner, statuses

#: The statuses a run filter asks for (None: every status).
Wanted = list[RunStatus] | None


class WorkflowStore(ABC):
    """The workflow store: runs, leases, the journal, the ledger, approvals and events.

    :class:`~statekeep.workflow.SQLWorkflowStore` is the backend for SQLite and
    PostgreSQL; :class:`~statekeep.workflow.InMemoryWorkflowStore` the reference
    in process memory. Reads take a run id; every write of a running worker goes
    through :meth:`fenced`.

    A backend implements the abstract primitives below (each receives checked
    arguments); ``_search_runs``, ``_workflow_names`` and ``_replay`` have
    defaults over the others that a backend may replace with queries, and
    ``_runs_of`` and ``_delete_owner`` (erasure by owner) are optional: without
    them :meth:`runs_of` and :meth:`delete_owner` raise ``NotImplementedError``.
    """

    # --- runs -----------------------------------------------------------------------------

    def open_run(self, run: dict[str, Any], *, parent: Run | None = None) -> Run:
        """Insert a new run (``run`` holds its fields) or return the existing one with that id.

        With ``parent``, the insert is fenced by the parent's lease epoch: a stale
        holder of the parent cannot create its children.

        Raises:
            RunConflictError: the id is taken by another workflow or another input.
            LeaseLostError: ``parent`` was taken over; nothing was written.
        """
        return same_run(self._open_run(run, parent), run)

    def find(self, run_id: str) -> Run | None:
        """The run with this id, or None."""
        return self._find(check_run_id(run_id))

    def list_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 1000,
    ) -> list[Run]:
        """Runs filtered by status (a status, its name, or several), workflow name or parent, oldest first."""
        limit = check_int(limit, "limit", minimum=1)
        wanted = None if status is None else statuses(status)
        workflow = check_optional_id(workflow, "workflow")
        return self._list_runs(wanted, workflow, check_optional_id(parent_id, "parent_id"), limit)

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
        ``run_ids`` keeps only those runs.

        Raises:
            InvalidInputError: a malformed filter, ``limit`` not from 1 to 1000, a negative ``offset``.
        """
        owners, needle, ids = check_run_filters(owner, text, run_ids, limit, offset)
        workflow = check_optional_id(workflow, "workflow")
        wanted = None if status is None else statuses(status)
        return self._search_runs(RunFilter(wanted, workflow, owners, needle, ids), limit, offset)

    def workflow_names(self) -> list[str]:
        """The names of the workflows that have runs, sorted."""
        return self._workflow_names()

    def cancel(self, run_id: str) -> Run:
        """Cancel a live run; its lease is revoked (epoch bumped) so no worker advances it.

        Raises:
            RunNotFoundError: no such run.
            RunFinishedError: the run has already finished.
        """
        return self._cancel(check_run_id(run_id))

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
        return self._retry(check_run_id(run_id))

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
        check_run_id(run_id)
        new_id = check_run_id(run["run_id"])
        at_seq = check_int(at_seq, "at_seq", maximum=MAX_SEQ)
        return self._fork(run_id, at_seq, {**run, "run_id": new_id})

    def get(self, run_id: str) -> Run:
        """The run with this id.

        Raises:
            RunNotFoundError: no such run.
        """
        run = self.find(run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def checkpoint(self, run_id: str) -> Checkpoint:
        """The run's last completed step, latest working-state version and context cursor."""
        run = self.get(run_id)
        return Checkpoint(run.run_id, run.last_seq, run.state_version, run.cursor)

    # --- leases ---------------------------------------------------------------------------

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
        return self._acquire(run_id, owner, lease, parent)

    def claim(self, owner: str, lease: float, limit: int, workflows: Iterable[tuple[str, int]]) -> list[Run]:
        """Claim up to ``limit`` runnable runs (due, lease lapsed) of the given (workflow, version) pairs."""
        pairs = list(dict.fromkeys((name, version) for name, version in workflows))
        return self._claim(owner, lease, limit, pairs) if pairs else []

    def heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        """Extend a lease; False when the epoch is stale (the run was taken over)."""
        return self._heartbeat(run_id, epoch, lease)

    def shares(self, db: object) -> bool:
        """True when a :class:`RunWrite` of this store can lend its connection to writes on ``db``."""
        return False

    def fenced(self, run: Run) -> AbstractContextManager[RunWrite]:
        """A write transaction of ``run`` that goes through only while ``run.epoch`` is current.

        Raises:
            LeaseLostError: another worker took the run over; nothing was written.
        """
        return self._fenced(run)

    # --- journal and ledger ---------------------------------------------------------------

    def journal(self, run_id: str, start: int, size: int) -> list[StepRecord]:
        """Journal entries ``start <= seq < start + size`` of a run, in order."""
        return self._journal(*_seq_range(run_id, start, size))

    def tool_calls(self, run_id: str) -> list[LedgerEntry]:
        """Every ledger entry of a run, in order."""
        return self._tool_calls(check_run_id(run_id))

    def tool_call(self, run_id: str, seq: int) -> LedgerEntry | None:
        """The ledger entry at a journal position, or None."""
        check_run_id(run_id)
        return self._tool_call(run_id, check_int(seq, "seq", maximum=MAX_SEQ))

    def replay(self, run_id: str, start: int, size: int) -> list[ReplayEntry]:
        """What replay needs of entries ``start <= seq < start + size``, checked as :meth:`journal`."""
        return self._replay(*_seq_range(run_id, start, size))

    def steps(self, run_id: str) -> list[StepRecord]:
        """Every journal entry of a run, in order."""
        return self.journal(run_id, 1, MAX_SEQ)

    # --- approvals and events -------------------------------------------------------------

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
        wanted = check_approval_filters(status, run_id, kind, action)
        limit, after = check_approvals_page(limit, after)
        return self._approvals(wanted, limit, after)

    def approval(self, approval_id: str) -> Approval:
        """One approval by id.

        Raises:
            InvalidInputError: ``approval_id`` is not an id.
            ApprovalNotFoundError: no such approval.
        """
        return self._approval(check_id(approval_id, "approval_id"))

    def approval_at(self, run_id: str, seq: int, kind: str) -> Approval | None:
        """The latest approval of ``kind`` a run opened at a journal position, if any."""
        return self._approval_at(run_id, seq, kind)

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
        encoded = check_decision(approval_id, approve, by, comment, result)
        decided = self._decide(approval_id, Decision(approve, by, comment, encoded))
        if decided.status == "expired":  # recorded as expired (and committed) before this raises
            raise ApprovalExpiredError(approval_id, decided.action, "expired before a decision")
        return decided

    def send_event(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver a named event to a run: woken if it waits for it, kept until it does otherwise.

        Raises:
            InvalidInputError: empty name or non-JSON payload; nothing was written.
            RunNotFoundError: no such run.
            RunFinishedError: the run has finished; the event is refused.
        """
        check_run_id(run_id)
        self._send_event(run_id, name, check_event(name, payload))

    # --- retention ------------------------------------------------------------------------

    def purgeable(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        workflow: str | None = None,
    ) -> list[str]:
        """The ids :meth:`purge` would delete, without deleting anything."""
        check_retention(older_than, keep_last, workflow)
        return purge_selection(self._finished_runs(workflow), older_than, keep_last)

    def delete_runs(self, run_ids: list[str]) -> int:
        """Delete these finished runs with their journal, ledger, approvals and events; live ones are kept."""
        return self._delete_runs(check_run_ids(run_ids))

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

    # --- erasure --------------------------------------------------------------------------

    def runs_of(self, owner: str) -> list[Run]:
        """Every run of ``owner`` (any status, child runs included), oldest first."""
        return self._runs_of(check_id(owner, "owner"))

    def delete_owner(self, owner: str) -> dict[str, int]:
        """Erasure: delete every finished run of ``owner`` with its journal, ledger, approvals and events.

        Returns the counts removed (``runs``, ``steps``, ``tool_calls``,
        ``approvals``, ``events``). Live runs are kept (cancel them first).
        """
        return self._delete_owner(check_id(owner, "owner"))

    def close(self) -> None:  # noqa: B027 - a backend without resources has nothing to release
        """Release connections; the store must not be used afterwards."""

    # --- the primitives a backend implements ------------------------------------------------

    @abstractmethod
    def _open_run(self, run: dict[str, Any], parent: Run | None) -> Run:
        """Insert ``run`` unless its id exists (fenced by ``parent``'s epoch); return the stored run."""

    @abstractmethod
    def _find(self, run_id: str) -> Run | None:
        """The run with this id, or None."""

    @abstractmethod
    def _list_runs(
        self, wanted: Wanted, workflow: str | None, parent_id: str | None, limit: int
    ) -> list[Run]:
        """Up to ``limit`` runs with these statuses, workflow and parent (None: any), oldest first."""

    def _search_runs(self, where: RunFilter, limit: int, offset: int) -> RunPage:
        """A page of the runs ``where`` keeps; this default reads every run of the workflow."""
        matched = [r for r in self._list_runs(None, where.workflow, None, MAX_SEQ) if where.keeps(r)]
        return page_of(matched, where.wanted, limit, offset)

    def _workflow_names(self) -> list[str]:
        """The workflows that have runs, sorted; this default reads every run."""
        return sorted({r.workflow for r in self._list_runs(None, None, None, MAX_SEQ)})

    @abstractmethod
    def _cancel(self, run_id: str) -> Run:
        """Cancel the live run: finished as cancelled, epoch bumped, approvals withdrawn, parent woken."""

    @abstractmethod
    def _retry(self, run_id: str) -> Run:
        """Make the failed run pending again (epoch bumped, error cleared), noting ``statekeep.retried``."""

    @abstractmethod
    def _fork(self, run_id: str, at_seq: int, run: dict[str, Any]) -> Run:
        """Copy ``run_id`` up to ``at_seq`` (checked with :func:`~.rules.check_fork_point`) into a new run."""

    @abstractmethod
    def _acquire(self, run_id: str, owner: str, lease: float, parent: Run | None) -> Run | None:
        """Take the run for ``owner`` as :meth:`acquire` says."""

    @abstractmethod
    def _claim(self, owner: str, lease: float, limit: int, pairs: list[tuple[str, int]]) -> list[Run]:
        """Lease up to ``limit`` due, unheld live runs of these (workflow, version) pairs (at least one)."""

    @abstractmethod
    def _heartbeat(self, run_id: str, epoch: int, lease: float) -> bool:
        """Extend the lease from now if ``epoch`` is current; False otherwise."""

    @abstractmethod
    def _fenced(self, run: Run) -> AbstractContextManager[RunWrite]:
        """The fenced write transaction of ``run`` (see :class:`RunWrite`)."""

    @abstractmethod
    def _journal(self, run_id: str, start: int, last: int) -> list[StepRecord]:
        """Journal entries ``start <= seq <= last`` of a run (none for an unknown run), in order."""

    def _replay(self, run_id: str, start: int, last: int) -> list[ReplayEntry]:
        """What replay needs of entries ``start <= seq <= last``; this default reads :meth:`_journal`."""
        entries = self._journal(run_id, start, last)
        return [ReplayEntry(s.seq, s.name, s.kind, s.state_version, s.output) for s in entries]

    @abstractmethod
    def _tool_calls(self, run_id: str) -> list[LedgerEntry]:
        """Every ledger entry of a run, in order."""

    @abstractmethod
    def _tool_call(self, run_id: str, seq: int) -> LedgerEntry | None:
        """The ledger entry at ``seq``, or None."""

    @abstractmethod
    def _approvals(self, wanted: dict[str, str], limit: int | None, after: str | None) -> list[Approval]:
        """Approvals whose fields equal ``wanted``, after the approval ``after``, oldest first.

        Raises:
            ApprovalNotFoundError: no approval has the id ``after``.
        """

    @abstractmethod
    def _approval(self, approval_id: str) -> Approval:
        """One approval.

        Raises:
            ApprovalNotFoundError: no such approval.
        """

    @abstractmethod
    def _approval_at(self, run_id: str, seq: int, kind: str) -> Approval | None:
        """The latest approval of ``kind`` the run opened at ``seq``, if any."""

    @abstractmethod
    def _decide(self, approval_id: str, decision: Decision) -> Approval:
        """Record ``decision`` on the pending approval (or record it expired) and wake the run.

        Returns the approval as written, or as it is when it had expired before (nothing is
        written, no run woken); the base raises for an expired one.

        Raises:
            ApprovalNotFoundError: no such approval.
            ApprovalDecidedError: it was already decided or withdrawn.
        """

    @abstractmethod
    def _send_event(self, run_id: str, name: str, payload: str) -> None:
        """Keep the event (``payload`` is JSON text) for the run, and wake it if it waits for ``name``.

        Raises:
            RunNotFoundError: no such run.
            RunFinishedError: the run has finished.
        """

    @abstractmethod
    def _finished_runs(self, workflow: str | None) -> list[tuple[str, str, datetime]]:
        """(run id, workflow, finished at) of every finished run, of ``workflow`` if given."""

    @abstractmethod
    def _delete_runs(self, run_ids: list[str]) -> int:
        """Delete the finished runs among ``run_ids`` with all they hold; return how many."""

    def _runs_of(self, owner: str) -> list[Run]:
        """Every run of ``owner``, oldest first (optional: erasure by owner)."""
        raise NotImplementedError(f"{type(self).__name__} cannot find runs by owner")

    def _delete_owner(self, owner: str) -> dict[str, int]:
        """Delete the finished runs of ``owner``; the counts per table (optional: erasure by owner)."""
        raise NotImplementedError(f"{type(self).__name__} cannot erase by owner")


@dataclass(frozen=True, slots=True)
class RunFilter:
    """The checked filters of :meth:`WorkflowStore.search_runs` but the page: None keeps every run."""

    wanted: Wanted
    workflow: str | None
    owners: list[str] | None
    needle: str | None
    run_ids: list[str] | None

    def keeps(self, run: Run) -> bool:
        """Whether ``run`` passes the workflow, owner, id and text filters (not the status one)."""
        return (
            (self.workflow is None or run.workflow == self.workflow)
            and (self.owners is None or run_owner(run) in self.owners)
            and (self.run_ids is None or run.run_id in self.run_ids)
            and (self.needle is None or run_matches(run, self.needle))
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's checked decision on an approval: ``result`` is the encoded JSON of their result."""

    approve: bool
    by: str
    comment: str | None
    result: str


__all__ = ["Decision", "RunFilter", "Wanted", "WorkflowStore"]


def _seq_range(run_id: str, start: int, size: int) -> tuple[str, int, int]:
    """``(run_id, start, last)`` of the journal positions ``start <= seq < start + size``, checked."""
    start = check_int(start, "start", maximum=MAX_SEQ)
    return check_run_id(run_id), start, min(start + check_int(size, "size", maximum=MAX_SEQ) - 1, MAX_SEQ)
