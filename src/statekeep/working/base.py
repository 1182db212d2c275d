"""The working-state store contract.

A backend implements four primitives (``_append``, ``_get``, ``_list``,
``_prune``); validation, encoding and migrations live here, once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import UTC, datetime

import pydantic

from statekeep._check import check_int, check_run_id
from statekeep.errors import InvalidInputError, StateNotFoundError
from statekeep.working._types import StateVersion
from statekeep.working.schema import M, StateMigrations, decode, encode

#: Versions are 32-bit integers in the SQL stores.
MAX_VERSION = 2**31 - 1


class WorkingStateStore(ABC):
    """Typed, versioned working state of runs.

    Every save is a new immutable version. Pass ``expected_version`` (0 for a
    run with no state yet) for optimistic concurrency.

    Examples:
        >>> from statekeep.working import InMemoryWorkingStateStore
        >>> store = InMemoryWorkingStateStore()
        >>> class Notes(pydantic.BaseModel):
        ...     items: list[str] = []
        >>> store.save("run-1", Notes(items=["a"]), expected_version=0).version
        1
        >>> store.load("run-1", Notes).items
        ['a']
    """

    def __init__(self, migrations: StateMigrations | None = None) -> None:
        self.migrations = migrations or StateMigrations()

    def close(self) -> None:  # noqa: B027 - optional hook: the in-memory backend holds nothing
        """Release connections; the store must not be used afterwards."""

    def save(
        self,
        run_id: str,
        state: pydantic.BaseModel,
        *,
        expected_version: int | None = None,
        owner: str | None = None,
    ) -> StateVersion:
        """Store ``state`` as the run's next version and return its record.

        ``owner`` (the run's owner) seals the state with that owner's data key in a
        store opened with a key ring, so that erasing the owner shreds it.

        Raises:
            StateValidationError: the state is invalid; nothing was written.
            VersionConflictError: ``expected_version`` is not the latest; nothing was written.
        """
        record = self.prepare(run_id, state, expected_version=expected_version)
        return self._append(self._seal(record, owner), expected_version)

    def _seal(self, record: StateVersion, owner: str | None) -> StateVersion:
        """The record as the backend stores it for ``owner`` (a backend with keys seals the state)."""
        return record

    @staticmethod
    def prepare(
        run_id: str, state: pydantic.BaseModel, *, expected_version: int | None = None
    ) -> StateVersion:
        """Validate and encode a save without writing it (version filled in on append)."""
        check_run_id(run_id)
        if expected_version is not None:
            check_int(expected_version, "expected_version", maximum=MAX_VERSION)
        name, schema_version, text = encode(state)
        return StateVersion(run_id, 0, name, schema_version, text, datetime.now(UTC))

    def load(self, run_id: str, model: type[M], *, version: int | None = None) -> M:
        """Load the latest version (or ``version``) of a run's state into ``model``.

        Raises:
            InvalidInputError: ``model`` is not a pydantic model class.
            StateNotFoundError: no such version.
            SchemaVersionError: the stored schema cannot be loaded by this code.
        """
        return self.decode(self.get(run_id, version=version), model)

    def decode(self, record: StateVersion, model: type[M]) -> M:
        """Load a record this store gave (or was given to save) into ``model``, migrating it forward.

        Raises:
            InvalidInputError: ``model`` is not a pydantic model class.
            SchemaVersionError: the record's schema cannot be loaded by this code.
        """
        if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
            raise InvalidInputError(f"must be a pydantic model class, not {model!r}", field="model")
        return decode(record, model, self.migrations)

    def get(self, run_id: str, *, version: int | None = None) -> StateVersion:
        """The stored record of the latest version (or ``version``)."""
        check_run_id(run_id)
        if version is not None:
            check_int(version, "version", minimum=1, maximum=MAX_VERSION)
        record = self._get(run_id, version)
        if record is None:
            raise StateNotFoundError(run_id, version)
        return record

    def latest_version(self, run_id: str) -> int:
        """The run's latest version number, 0 if it has none."""
        check_run_id(run_id)
        record = self._get(run_id, None)
        return 0 if record is None else record.version

    def versions(self, run_id: str) -> list[StateVersion]:
        """Every stored version of a run, oldest first."""
        return self._list(check_run_id(run_id))

    def prune(self, run_id: str, *, keep: int) -> int:
        """Retention: keep the last ``keep`` versions of a run; return how many were deleted."""
        check_run_id(run_id)
        check_int(keep, "keep", minimum=1, maximum=MAX_VERSION)
        return self._prune(run_id, keep)

    def delete(self, *run_ids: str) -> int:
        """Delete every version of these runs (the workflow engine's purge calls this); return the count."""
        return self._delete(list(dict.fromkeys(check_run_id(r) for r in run_ids))) if run_ids else 0

    @abstractmethod
    def _append(self, record: StateVersion, expected: int | None) -> StateVersion:
        """Store ``record`` as latest + 1, if ``expected`` is None or the latest."""

    @abstractmethod
    def _get(self, run_id: str, version: int | None) -> StateVersion | None:
        """One version, or the latest when ``version`` is None."""

    @abstractmethod
    def _list(self, run_id: str) -> list[StateVersion]:
        """All versions of a run, oldest first."""

    @abstractmethod
    def _prune(self, run_id: str, keep: int) -> int:
        """Delete all but the newest ``keep`` versions."""

    @abstractmethod
    def _delete(self, run_ids: list[str]) -> int:
        """Delete every version of ``run_ids`` (distinct, checked)."""
