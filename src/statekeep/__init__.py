"""statekeep: durable state for AI agents, kept apart by kind.

Four stores, each with its own schema and lifecycle:

* :mod:`statekeep.context`: the append-only event log of a session, and the context builder;
* :mod:`statekeep.working`: typed, versioned working state of a run;
* :mod:`statekeep.workflow`: runs, steps, the tool-call ledger, approvals, waits, leases;
* :mod:`statekeep.memory`: owner-scoped long-term memory with provenance.

Heavy dependencies (torch, sentence-transformers, lancedb, tiktoken) are imported
only by the features that use them.
"""

from statekeep.config import Settings
from statekeep.errors import (
    ConfigError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StatekeepError,
    Suspended,
)
from statekeep.working import (
    InMemoryWorkingStateStore,
    SQLWorkingStateStore,
    StateMigrations,
    WorkingState,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ConflictError",
    "InMemoryWorkingStateStore",
    "InvalidInputError",
    "NotFoundError",
    "SQLWorkingStateStore",
    "Settings",
    "StateMigrations",
    "StatekeepError",
    "Suspended",
    "WorkingState",
]
