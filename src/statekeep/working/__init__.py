"""Store 2: typed (pydantic), versioned working state of a run."""

from statekeep.working._types import StateVersion
from statekeep.working.base import WorkingStateStore
from statekeep.working.inmemory import InMemoryWorkingStateStore
from statekeep.working.schema import StateMigrations, WorkingState, schema_of
from statekeep.working.sql import SQLWorkingStateStore

__all__ = [
    "InMemoryWorkingStateStore",
    "SQLWorkingStateStore",
    "StateMigrations",
    "StateVersion",
    "WorkingState",
    "WorkingStateStore",
    "schema_of",
]
