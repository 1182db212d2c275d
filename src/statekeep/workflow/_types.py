"""Records of the workflow store: runs, journal entries, ledger calls, approvals."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from statekeep._check import check_int, check_number, check_seconds
from statekeep.workflow import codec


class RunStatus(enum.StrEnum):
    """Where a run is. Only ``running`` needs a live process; every other state is a row."""

    #: recorded, runnable once ``runnable_at`` is due; a worker or a resume takes it
    PENDING = "pending"
    #: a worker holds its lease and executes it
    RUNNING = "running"
    #: finished with an output
    COMPLETED = "completed"
    #: finished with an error (a step exhausted its retries, or the workflow raised)
    FAILED = "failed"
    #: stopped by a person; its lease was revoked
    CANCELLED = "cancelled"
    #: parked until a due time (``ctx.sleep``)
    SLEEPING = "sleeping"
    #: parked until an event arrives or its timeout passes (``ctx.wait_for_event``)
    WAITING_FOR_EVENT = "waiting_for_event"
    #: parked until a person decides a gated tool call
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    #: parked until a child run finishes
    WAITING_FOR_CHILD = "waiting_for_child"
    NEEDS_DECISION = "needs_decision"

    @property
    def finished(self) -> bool:
        """True for completed, failed and cancelled."""
        return self in FINISHED


FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})

#: Runs a person or a worker still has to act on.
LIVE = frozenset(s for s in RunStatus if not s.finished)

#: The largest journal position: seq columns are 32-bit integers.
MAX_SEQ = 2**31 - 1

#: Approval statuses, in the order a person meets them.
APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "withdrawn")


@dataclass(frozen=True, slots=True)
class Run:
    """One run as stored.

    Attributes:
        run_id: The caller's stable id of the run.
        workflow: The registered workflow's name.
        version: The workflow version the run executes (a journal migration may raise it).
        status: Where the run is (:class:`RunStatus`).
        input: The decoded ``{"args": [...], "kwargs": {...}}`` it was started with.
        output: The decoded JSON result, once completed.
        error: Why it failed, or was held back.
        parent_id: The parent run, for a child run.
        created_at: When it was first recorded.
        updated_at: When it was last written.
        finished_at: When it completed, failed or was cancelled.
        epoch: The lease epoch: every write of a holder is fenced by it.
        lease_owner: The worker that holds the run, while one does.
        state_version: The latest working-state version a step committed.
        cursor: The latest context cursor a step committed.
        last_seq: The journal position of the last completed step.
        waiting: What a waiting run waits for (a due time, an event, an approval, a child).
        trace_context: The W3C trace context (JSON) every attempt of the run continues, if
            the run was recorded with tracing on.
        owner: Whose data the run holds (from the workflow's ``owner`` parameter, or
            its parent's); erasure of that owner deletes the run. None for a run of
            no one. Not the worker that holds the lease (``lease_owner``).
    """

    run_id: str
    workflow: str
    version: int
    status: RunStatus
    input: Any
    output: Any
    error: str | None
    parent_id: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    epoch: int
    lease_owner: str | None
    state_version: int | None
    cursor: int | None
    last_seq: int
    waiting: dict[str, Any] | None
    trace_context: str | None = None
    owner: str | None = None


#: What a journal entry records: a step function, a tool call, a sleep, an event wait, a child run.
StepKind = Literal["step", "tool", "sleep", "event", "child"]

#: Where a tool call stands in the ledger.
CallStatus = Literal["started", "completed"]

#: What a person decides: a gated action, or whether an ambiguous call happened.
ApprovalKind = Literal["gate", "ambiguous"]

#: Where an approval stands.
ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "withdrawn"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One journal entry: a completed step, tool call, wait or child run.

    Attributes:
        run_id: The run it belongs to.
        seq: Its position in the run's journal, from 1.
        name: The step's (or tool's, wait's, child workflow's) name.
        kind: What it records (:data:`StepKind`).
        input_hash: A sha256 of its arguments (of the output, for a tool call).
        output: Its JSON output, as text; :attr:`value` decodes it.
        attempt: The attempt of the retry policy that succeeded.
        started_at: When the first attempt started.
        finished_at: When the completion was written.
        state_version: The working-state version committed with it, if any.
        cursor: The context cursor committed with it, if any.
    """

    run_id: str
    seq: int
    name: str
    kind: StepKind
    input_hash: str
    output: str
    attempt: int
    started_at: datetime
    finished_at: datetime
    state_version: int | None
    cursor: int | None

    @property
    def value(self) -> Any:
        """The decoded JSON output."""
        return codec.loads(self.output)


class ReplayEntry:
    """What replay needs of a journal entry, decoded only when asked for.

    Replay compares each entry's name and kind with the step the workflow asks
    for, moves the state to the version the entry committed, and returns its
    output: the output is opened (a sealed payload) and parsed only then, and
    the entry's timestamps, hash and attempt are never read at all.

    Attributes:
        seq: Its position in the run's journal, from 1.
        name: The step's (or tool's, wait's, child workflow's) name.
        kind: What it records (:data:`StepKind`).
        state_version: The working-state version committed with it, if any.
    """

    __slots__ = ("_open", "_output", "kind", "name", "seq", "state_version")

    def __init__(
        self,
        seq: int,
        name: str,
        kind: StepKind,
        state_version: int | None,
        output: str,
        open_: Callable[[str], str] | None = None,
    ) -> None:
        self.seq, self.name, self.kind, self.state_version = seq, name, kind, state_version
        self._output, self._open = output, open_

    @property
    def value(self) -> Any:
        """The decoded JSON output (opened first when it is sealed)."""
        return codec.loads(self._output if self._open is None else self._open(self._output))


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One tool call in the ledger.

    Attributes:
        run_id: The run that made the call.
        seq: The call's journal position.
        tool: The tool's registered name.
        key: The idempotency key (``<run id>/<seq>/<call index>``), passed to the tool.
        args: The positional arguments, as recorded before the tool ran.
        kwargs: The keyword arguments, likewise.
        status: ``started`` before the tool runs, ``completed`` once its result is stored.
        result: The decoded result, once completed.
        started_at: When the call was (last) recorded as started.
        completed_at: When it completed, if it did.
    """

    run_id: str
    seq: int
    tool: str
    key: str
    args: list[Any]
    kwargs: dict[str, Any]
    status: CallStatus
    result: Any
    started_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Approval:
    """A gate a person must decide: a consequential action, or an ambiguous tool call.

    Attributes:
        approval_id: Its id, which a decision names.
        run_id: The run that waits for it.
        seq: The journal position of the call it gates.
        kind: ``gate`` (approve = run it) or ``ambiguous`` (approve = it did not
            happen, run it now; reject = it happened, and ``result`` is its output).
        action: The tool's name.
        args: The exact arguments the call will run with (``args`` and ``kwargs``).
        args_hash: Their sha256: an approval covers these arguments and no others.
        reason: Why a person is asked.
        status: ``pending``, ``approved``, ``rejected``, ``expired``, or ``withdrawn``
            (the run ended, by cancellation or otherwise, before a decision).
        created_at: When it was opened.
        expires_at: When it expires undecided (and fails closed), if ever.
        decided_by: Who decided.
        decided_at: When it was decided (or expired, or withdrawn).
        comment: The decider's comment.
        result: For a rejected ``ambiguous`` call, the call's output as the person gave it.
    """

    approval_id: str
    run_id: str
    seq: int
    kind: ApprovalKind
    action: str
    args: dict[str, Any]
    args_hash: str
    reason: str
    status: ApprovalStatus
    created_at: datetime
    expires_at: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    comment: str | None
    result: Any


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs, newest first (:meth:`WorkflowStore.search_runs`).

    Attributes:
        runs: The runs of this page.
        total: How many runs matched every filter (all pages together).
        offset: How many matching runs come before this page.
        limit: The page size asked for.
        counts: Runs per status among those matching every filter but the status one.
    """

    runs: list[Run]
    total: int
    offset: int
    limit: int
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the runtime needs to continue a run.

    Attributes:
        run_id: The run.
        last_seq: The journal position of the last completed step.
        state_version: The latest working-state version a step committed.
        cursor: The latest context cursor a step committed.
    """

    run_id: str
    last_seq: int
    state_version: int | None
    cursor: int | None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failing step is tried, and how long to wait between tries.

    Examples:
        >>> RetryPolicy(attempts=3, backoff=0.5).delay(2)
        1.0
    """

    attempts: int = 1
    backoff: float = 0.0
    factor: float = 2.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        check_int(self.attempts, "attempts", minimum=1, maximum=1_000)
        check_seconds(self.backoff, "backoff")
        check_seconds(self.max_backoff, "max_backoff")
        check_number(self.factor, "factor", minimum=1, maximum=100)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        try:
            return float(min(self.max_backoff, self.backoff * self.factor ** (attempt - 1)))
        except OverflowError:  # a late attempt of a steep policy: the cap applies
            return float(self.max_backoff)


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """A reconciler's verdict on an ambiguous call: ``happened`` is True, False or None (unknown)."""

    happened: bool | None
    result: Any = None
