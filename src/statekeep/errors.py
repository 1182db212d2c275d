"""The statekeep exception tree, one axis: what kind of thing went wrong.

Every error statekeep raises on purpose derives from :class:`StatekeepError`, so
``except StatekeepError`` catches them all. Each class says what kind of problem
it is (bad input, not found, a lost race, a failed step), whatever store raised
it; errors carry the fields that explain them (``setting``, ``run_id``,
``owner``, ...) and build their own message. The whole tree is drawn in the
error reference of the documentation.

``Suspended`` is the one exception outside the tree: it derives from
``BaseException`` so that user code's ``except Exception`` cannot swallow the
control flow that parks a run (waiting for an approval, a timer or an event).
"""

from __future__ import annotations

from typing import Any

from statekeep._redact import redact_url


class StatekeepError(Exception):
    """Root of every error statekeep raises on purpose."""


class ConfigError(StatekeepError):
    """A setting is malformed, or the server it names cannot be reached."""

    def __init__(self, setting: str, value: str, reason: str) -> None:
        self.setting = setting
        self.value = value
        self.reason = reason
        shown = redact_url(value).replace("\x00", "\\x00")  # a NUL would cut the message short
        super().__init__(f"{setting}={shown}: {reason}")


class MemoryLockedError(ConfigError):
    """A LanceDB memory folder is already open for writing by another store or process."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            "STATEKEEP_MEMORY_URL",
            path,
            "this LanceDB folder is already open by another writer; LanceDB memory is for one "
            "machine and one writer, so many workers must use pgvector (a postgresql:// URL)",
        )


class MissingDependencyError(StatekeepError):
    """An optional dependency is needed for this feature but is not installed."""

    def __init__(self, package: str, feature: str) -> None:
        self.package = package
        self.feature = feature
        super().__init__(f"{feature} needs the package {package!r}: pip install {package}")


class MissingExtraError(MissingDependencyError):
    """A feature needs an extra of statekeep that is not installed; the message names it.

    ``pip install statekeep`` installs the SQLite stores; PostgreSQL, LanceDB,
    the embedding model and the approval webhook come with the extras
    ``postgres``, ``lancedb``, ``embeddings`` and ``web`` (``all`` for every one).
    """

    def __init__(self, extra: str, feature: str, module: str) -> None:
        self.extra = extra
        self.feature = feature
        self.package = module
        StatekeepError.__init__(
            self,
            f"{feature} needs the {extra!r} extra: pip install 'statekeep[{extra}]' "
            f"(the module {module!r} is not installed)",
        )


class InvalidInputError(StatekeepError, ValueError):
    """An argument to a public entry point is invalid. Nothing was written."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class StateValidationError(InvalidInputError):
    """A working state failed validation or would not survive a JSON round trip."""


class StepOutputError(InvalidInputError):
    """A step (or tool) returned a value that does not survive a JSON round trip."""

    def __init__(self, run_id: str, step: str, reason: str) -> None:
        self.run_id = run_id
        self.step = step
        self.reason = reason
        super().__init__(f"run {run_id!r}, step {step!r}: output is not JSON: {reason}", field="output")


class ContextBudgetError(InvalidInputError):
    """The system prompt and pinned state alone do not fit in the token budget."""

    def __init__(self, session_id: str, budget: int, needed: int) -> None:
        self.session_id = session_id
        self.budget = budget
        self.needed = needed
        InvalidInputError.__init__(
            self,
            f"session {session_id!r}: the system prompt and pinned state need {needed} tokens, "
            f"more than the budget of {budget}",
            field="budget",
        )


class NotFoundError(StatekeepError, LookupError):
    """Something named by the caller does not exist."""


class RunNotFoundError(NotFoundError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run with id {run_id!r}")


class StateNotFoundError(NotFoundError):
    """A run has no working-state version (or not the one asked for)."""

    def __init__(self, run_id: str, version: int | None = None) -> None:
        self.run_id = run_id
        self.version = version
        what = "no working state" if version is None else f"no working-state version {version}"
        super().__init__(f"run {run_id!r} has {what}")


class ApprovalNotFoundError(NotFoundError):
    """No approval has this id."""

    def __init__(self, approval_id: str) -> None:
        self.approval_id = approval_id
        super().__init__(f"no approval with id {approval_id!r}")


class UnknownWorkflowError(NotFoundError):
    """No workflow (or tool) with this name and version is registered."""

    def __init__(self, kind: str, name: str, version: int | None = None) -> None:
        self.kind = kind
        self.name = name
        self.version = version
        what = name if version is None else f"{name} v{version}"
        super().__init__(f"no {kind} {what!r} is registered")


class SummaryNotFoundError(NotFoundError):
    """A session has no summary (to regenerate)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} has no summary")


class MemoryNotFoundError(NotFoundError):
    """The owner has no memory with this id (another owner's memory is never visible)."""

    def __init__(self, owner: str, memory_id: str) -> None:
        self.owner = owner
        self.memory_id = memory_id
        super().__init__(f"owner {owner!r} has no memory {memory_id!r}")


class EventsPrunedError(NotFoundError):
    """The raw events a summary covers were deleted by retention, so it cannot be regenerated."""

    def __init__(self, session_id: str, pruned_to: int) -> None:
        self.session_id = session_id
        self.pruned_to = pruned_to
        super().__init__(
            f"session {session_id!r}: raw events up to {pruned_to} were deleted by retention; "
            "the summary covering them cannot be regenerated"
        )


class ConflictError(StatekeepError):
    """A write lost a race or contradicts what is stored. Nothing was written."""


class VersionConflictError(ConflictError):
    """Optimistic concurrency: the caller's expected version is not the latest."""

    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"run {run_id!r}: expected working-state version {expected}, "
            f"but the latest is {actual}; reload and retry"
        )


class RunConflictError(ConflictError):
    """A run id is already used by another workflow, version or input."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id!r}: {reason}")


class RunFinishedError(ConflictError):
    """The operation needs a live run, but the run has finished."""

    def __init__(self, run_id: str, status: str, action: str) -> None:
        self.run_id = run_id
        self.status = status
        self.action = action
        super().__init__(f"run {run_id!r} is {status}: cannot {action}")


class LeaseLostError(ConflictError):
    """Fencing: another worker took the run over (a newer epoch); this write was refused."""

    def __init__(self, run_id: str, epoch: int) -> None:
        self.run_id = run_id
        self.epoch = epoch
        super().__init__(f"run {run_id!r}: lease epoch {epoch} is stale; another worker owns the run")


class ApprovalDecidedError(ConflictError):
    """A second decision on an approval that is no longer pending. Nothing was written."""

    def __init__(self, approval_id: str, status: str) -> None:
        self.approval_id = approval_id
        self.status = status
        super().__init__(f"approval {approval_id!r} is already {status}; a decision is recorded once")


class SummaryConflictError(ConflictError):
    """Another writer saved a summary of the session first; this one was not saved."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r}: a concurrent compaction saved a summary first")


class EventKeyConflictError(ConflictError):
    """An idempotency key was reused for a different message. Nothing was written."""

    def __init__(self, session_id: str, key: str, seq: int) -> None:
        self.session_id = session_id
        self.key = key
        self.seq = seq
        super().__init__(
            f"session {session_id!r}: key {key!r} already names event {seq}, a different message"
        )


class SessionOwnerError(ConflictError):
    """A session belongs to another owner (or, for a read, to no owner yet). Nothing was read or written.

    A context session belongs to one owner: no run of another owner reads or
    appends to it. ``actual_owner`` is None for a session created without an
    owner (before owners were recorded): a write by ``owner`` would claim it,
    a read must wait for that claim (see ``ContextStore.claim``).
    """

    def __init__(self, session_id: str, owner: str, actual_owner: str | None) -> None:
        self.session_id = session_id
        self.owner = owner
        self.actual_owner = actual_owner
        if actual_owner is None:
            reason = f"has no owner yet; owner {owner!r} must claim it before reading it"
        else:
            reason = f"belongs to owner {actual_owner!r}, not to owner {owner!r}"
        super().__init__(f"session {session_id!r} {reason}")


class LiveRunsError(ConflictError):
    """An erasure was refused: the owner has runs that are still live. Nothing was erased.

    Cancel them first, or erase with ``cancel_live=True``.
    """

    def __init__(self, owner: str, run_ids: list[str]) -> None:
        self.owner = owner
        self.run_ids = list(run_ids)
        shown = ", ".join(repr(r) for r in self.run_ids[:10]) + (" ..." if len(self.run_ids) > 10 else "")
        super().__init__(
            f"owner {owner!r} has {len(self.run_ids)} live run(s): {shown}; "
            "cancel them, or erase with cancel_live=True (--cancel-live)"
        )


class ApprovalError(StatekeepError):
    """A gated action may not run: rejected, expired, or its arguments changed."""

    def __init__(self, approval_id: str, action: str, reason: str) -> None:
        self.approval_id = approval_id
        self.action = action
        self.reason = reason
        super().__init__(f"approval {approval_id!r} for {action!r}: {reason}")


class ApprovalRejectedError(ApprovalError):
    """A person rejected the gated action."""


class ApprovalExpiredError(ApprovalError):
    """The approval expired before a decision (or before the run resumed): it fails closed."""


class ApprovalMismatchError(ApprovalError):
    """The call about to be made differs from the one approved (hash mismatch)."""


class ReplayError(StatekeepError):
    """The code no longer matches what a run recorded: replay cannot go on safely."""


class NonDeterminismError(ReplayError):
    """Replay asked for a different step than the journal recorded at that position."""

    def __init__(self, run_id: str, seq: int, recorded: str, requested: str) -> None:
        self.run_id = run_id
        self.seq = seq
        self.recorded = recorded
        self.requested = requested
        super().__init__(
            f"run {run_id!r}: non-deterministic replay at step #{seq}: the journal recorded "
            f"{recorded!r} but the workflow now asks for {requested!r}"
        )


class WorkflowVersionError(ReplayError):
    """A run was started under a workflow version this code cannot run or migrate."""

    def __init__(self, run_id: str, workflow: str, stored: int, available: list[int]) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.stored = stored
        self.available = available
        super().__init__(
            f"run {run_id!r} was started under {workflow!r} v{stored}; this code registers "
            f"versions {available} and no migration from v{stored}"
        )


class ExecutionError(StatekeepError):
    """Work run for the caller failed: a step, a child run, a model call, an embedder, a summarizer."""


class StepFailedError(ExecutionError):
    """A step raised on every attempt its retry policy allowed."""

    def __init__(self, run_id: str, step: str, seq: int, attempts: int, error: str) -> None:
        self.run_id = run_id
        self.step = step
        self.seq = seq
        self.attempts = attempts
        self.error = error
        super().__init__(
            f"run {run_id!r}: step {step!r} (#{seq}) failed after {attempts} attempt(s): {error}"
        )


class ChildRunFailedError(ExecutionError):
    """A child run ended failed or cancelled, so the parent's step cannot return its result."""

    def __init__(self, run_id: str, child_id: str, status: str, error: str | None) -> None:
        self.run_id = run_id
        self.child_id = child_id
        self.status = status
        self.error = error
        super().__init__(f"run {run_id!r}: child run {child_id!r} ended {status}: {error}")


class ModelError(ExecutionError):
    """A model call failed (HTTP error, timeout, malformed answer).

    ``retryable`` says whether the same call may succeed later (a timeout, a reset
    connection, HTTP 408, 409, 429 or 5xx); ``retry_after`` is the wait in seconds
    the provider asked for, if any; ``status`` is the HTTP status, if there was
    one. The message carries the provider's own explanation.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        super().__init__(message)


class EmbedderError(ExecutionError):
    """An embedder could not be loaded, or returned vectors of the wrong shape."""

    def __init__(self, model: str, reason: str) -> None:
        self.model = model
        self.reason = reason
        super().__init__(f"embedder {model!r}: {reason}")


class SummaryError(ExecutionError):
    """A summarizer failed or returned an empty summary; nothing was saved."""

    def __init__(self, session_id: str, summarizer: str, reason: str) -> None:
        self.session_id = session_id
        self.summarizer = summarizer
        self.reason = reason
        super().__init__(f"session {session_id!r}: summarizer {summarizer!r} {reason}; nothing was saved")


class AgentError(ExecutionError):
    """An agent run cannot go on: it reached its turn limit, lost its state, or its session was pruned."""


class SchemaVersionError(StatekeepError):
    """Stored data has a schema version the running code cannot load as is."""

    def __init__(self, schema: str, stored: int, current: int, reason: str) -> None:
        self.schema = schema
        self.stored = stored
        self.current = current
        super().__init__(f"schema {schema!r}: stored version {stored}, code version {current}: {reason}")


class MigrationError(SchemaVersionError):
    """A migration chain is incomplete, or a migration failed."""


class StorageError(StatekeepError):
    """The database refused or lost an operation."""


class ErasureError(StorageError):
    """An erasure deleted the rows but could not rewrite every file that held them; call it again."""

    def __init__(self, owner: str, step: str, reason: str) -> None:
        self.owner = owner
        self.step = step
        super().__init__(f"erasing owner {owner!r} failed at {step}: {reason}; erase again")


class SealedDataError(StatekeepError):
    """A sealed (encrypted) value cannot be opened, or cannot be sealed.

    Its data key was shredded (the owner was erased), the key provider does not
    hold the key-encryption key that wrapped it, the value was altered, or the
    store was opened without the key ring that sealed it.
    """

    def __init__(self, key_id: str, reason: str) -> None:
        self.key_id = key_id
        self.reason = reason
        super().__init__(f"data key {key_id!r}: {reason}")


# --- control flow: outside the tree ------------------------------------------------------


class Suspended(BaseException):
    """Raised inside a run to park it in a persisted waiting state.

    Derives from ``BaseException`` so that ``except Exception`` in user code does
    not swallow it. The runtime catches it, commits the waiting state and returns.
    """

    def __init__(self, run_id: str, status: str, detail: dict[str, Any] | None = None) -> None:
        self.run_id = run_id
        self.status = status
        self.detail = detail or {}
        super().__init__(f"run {run_id!r} suspended: {status}")
