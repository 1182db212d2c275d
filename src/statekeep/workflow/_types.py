"""Records of the workflow store: runs, journal entries, ledger calls, approvals."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from statekeep._numbers import check_int, check_seconds
from statekeep.errors import InvalidInputError


class RunStatus(enum.StrEnum):
    """Where a run is. Only ``running`` needs a live process; every other state is a row."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SLEEPING = "sleeping"
    WAITING_FOR_EVENT = "waiting_for_event"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    WAITING_FOR_CHILD = "waiting_for_child"
    #: the ledger found an ambiguous tool call and no reconciler could settle it
    NEEDS_DECISION = "needs_decision"

    @property
    def finished(self) -> bool:
        """True for completed, failed and cancelled."""
        return self in FINISHED


FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class Run:
    """One run as stored. ``output`` is the decoded JSON result once completed."""

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


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One journal entry: a completed step, tool call, wait or child run."""

    run_id: str
    seq: int
    name: str
    kind: str
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
        return json.loads(self.output)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One tool call in the ledger. ``status`` is ``started`` or ``completed``.

    ``key`` is the call's idempotency key (``<run id>/<seq>/<call index>``); ``args``
    and ``kwargs`` are the arguments as recorded before the tool ran.
    """

    run_id: str
    seq: int
    tool: str
    key: str
    args: list[Any]
    kwargs: dict[str, Any]
    status: str
    result: Any
    started_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Approval:
    """A gate a person must decide: a consequential action, or an ambiguous tool call.

    ``kind`` is ``gate`` (approve = run it) or ``ambiguous`` (approve = it did not
    happen, run it now; reject = it happened, ``result`` is its output).
    ``status`` is ``pending``, ``approved``, ``rejected``, ``expired``, or
    ``withdrawn`` (the run ended, by cancellation or otherwise, before a decision).
    """

    approval_id: str
    run_id: str
    seq: int
    kind: str
    action: str
    args: dict[str, Any]
    args_hash: str
    reason: str
    status: str
    created_at: datetime
    expires_at: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    comment: str | None
    result: Any


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the runtime needs to continue a run: the last step, state version and cursor."""

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
        if (
            isinstance(self.factor, bool)
            or not isinstance(self.factor, int | float)
            or not 1 <= self.factor <= 100
        ):
            raise InvalidInputError("must be a number from 1 to 100", field="factor")

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
