"""Typed state models, their schema versions, and the migrations between them.

Pure functions only: encoding a model to JSON, and decoding stored JSON back into
a model class, running the registered migration chain on the way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import pydantic
import pydantic_core

from statekeep._check import MAX_DEPTH, check_id, check_int, text_depth
from statekeep.errors import InvalidInputError, MigrationError, SchemaVersionError, StateValidationError
from statekeep.working._types import StateVersion

M = TypeVar("M", bound=pydantic.BaseModel)
JSONDict = dict[str, Any]
Migrator = Callable[[JSONDict], JSONDict]


class WorkingState(pydantic.BaseModel):
    """Base class for a run's typed working state.

    Name the schema and its version as class variables; bump the version when
    the shape changes, and register a migration from the previous one.

    Examples:
        >>> class Plan(WorkingState):
        ...     state_schema: ClassVar[str] = "plan"
        ...     state_version: ClassVar[int] = 2
        ...     steps: list[str] = []
    """

    state_schema: ClassVar[str] = ""
    state_version: ClassVar[int] = 1


def schema_of(model: type[pydantic.BaseModel]) -> tuple[str, int]:
    """The (schema name, schema version) a model class declares.

    A plain pydantic model is accepted too: its class name at version 1.
    """
    name = getattr(model, "state_schema", "") or model.__name__
    version = getattr(model, "state_version", 1)
    if not isinstance(version, int) or version < 1:
        raise StateValidationError(f"state_version of {model.__name__} must be an int >= 1, got {version!r}")
    return name, version


class StateMigrations:
    """A registry of one-step migrations, per schema, from version ``n`` to ``n + 1``.

    Migrations work on JSON dicts, never on live objects, so that old code is not
    needed to read old state.

    Examples:
        >>> migrations = StateMigrations()
        >>> @migrations.register("plan", from_version=1)
        ... def _add_steps(data):
        ...     return {**data, "steps": []}
    """

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Migrator] = {}

    def register(self, schema: str, from_version: int) -> Callable[[Migrator], Migrator]:
        """Register the migration of ``schema`` from ``from_version`` to the next.

        Raises:
            InvalidInputError: ``schema`` is not a name or ``from_version`` not an int >= 1.
        """
        check_id(schema, "schema")
        check_int(from_version, "from_version", minimum=1)

        def _decorate(fn: Migrator) -> Migrator:
            if not callable(fn):
                raise InvalidInputError("a migration must be a function of the state dict", field="fn")
            key = (schema, from_version)
            if key in self._steps:
                raise MigrationError(schema, from_version, from_version + 1, "migration registered twice")
            self._steps[key] = fn
            return fn

        return _decorate

    def run(self, schema: str, data: JSONDict, stored: int, target: int) -> JSONDict:
        """Run the chain ``stored -> target``; any missing step is an error."""
        missing = [v for v in range(stored, target) if (schema, v) not in self._steps]
        if missing:
            raise MigrationError(schema, stored, target, f"no migration registered from version {missing[0]}")
        for v in range(stored, target):
            try:
                data = self._steps[(schema, v)](dict(data))
            except Exception as exc:
                raise MigrationError(schema, stored, target, f"migration from {v} failed: {exc!r}") from exc
            if not isinstance(data, dict):
                raise MigrationError(
                    schema, stored, target, f"migration from {v} returned {type(data).__name__}"
                )
        return data


def encode(state: pydantic.BaseModel) -> tuple[str, int, str]:
    """Validate a model and render it as JSON: (schema name, schema version, JSON text).

    The JSON is decoded again and compared with the original, so a value that
    would not survive the round trip exactly (NaN, a float key, a model built
    with ``model_construct`` and invalid data) is refused before anything is
    written; so is a lone surrogate, and nesting deeper than ``MAX_DEPTH`` (64).

    Raises:
        StateValidationError: the state is not a model, is invalid, or is not JSON-exact.
    """
    if not isinstance(state, pydantic.BaseModel):
        raise StateValidationError(f"working state must be a pydantic model, got {type(state).__name__}")
    name, version = schema_of(type(state))
    try:
        text = state.model_dump_json(warnings="error")
        again = type(state).model_validate_json(text)
    except (pydantic.ValidationError, pydantic_core.PydanticSerializationError, ValueError) as exc:
        raise StateValidationError(f"{type(state).__name__} is not valid: {exc}") from exc
    if again != state:
        raise StateValidationError(f"{type(state).__name__} does not survive a JSON round trip unchanged")
    if text_depth(text) > MAX_DEPTH:  # pydantic itself stops at ~250 levels; the stores agree on fewer
        raise StateValidationError(
            f"{type(state).__name__} is nested more than {MAX_DEPTH} levels deep (models, lists and objects)"
        )
    return name, version, text


def decode(record: StateVersion, model: type[M], migrations: StateMigrations | None) -> M:
    """Load a stored version into ``model``, migrating it forward if it is older.

    Raises:
        SchemaVersionError: another schema, or a version newer than the code.
        MigrationError: a gap in the chain, or a migration that failed or gave invalid data.
    """
    name, current = schema_of(model)
    if record.schema_name != name:
        raise SchemaVersionError(
            name,
            record.schema_version,
            current,
            f"run {record.run_id!r} stores schema {record.schema_name!r}, not {name!r}: "
            "load it with the state class it was saved with",
        )
    if record.schema_version > current:
        raise SchemaVersionError(name, record.schema_version, current, "stored state is newer than this code")
    if record.schema_version == current:
        try:
            return model.model_validate_json(record.state)
        except pydantic.ValidationError as exc:
            raise SchemaVersionError(
                name, current, current, f"stored state does not validate: {exc}"
            ) from exc
    if migrations is None:
        raise MigrationError(name, record.schema_version, current, "no migrations registered")
    data = migrations.run(name, json.loads(record.state), record.schema_version, current)
    try:
        return model.model_validate_json(json.dumps(data))
    except pydantic.ValidationError as exc:
        raise MigrationError(
            name, record.schema_version, current, f"migrated state does not validate: {exc}"
        ) from exc
