"""statekeep: durable state for AI agents, kept apart by kind.

Four stores, each with its own schema and lifecycle, and a runtime that composes them:

* :mod:`statekeep.context`: the append-only event log of a session, and the context builder;
* :mod:`statekeep.working`: typed, versioned working state of a run;
* :mod:`statekeep.workflow`: runs, steps, the tool-call ledger, approvals, waits, leases;
* :mod:`statekeep.memory`: owner-scoped long-term memory with provenance;
* :mod:`statekeep.runtime`: agents whose every step is rebuilt from the four.

Errors live in :mod:`statekeep.errors`, rooted at :class:`StatekeepError`. Heavy
dependencies (torch, sentence-transformers, lancedb, tiktoken) are imported only
by the features that use them.

Examples:
    >>> import statekeep
    >>> settings = statekeep.Settings.load(home="/tmp/statekeep-doc")
"""

from statekeep.config import Settings
from statekeep.context import Message, SQLContextStore
from statekeep.errors import StatekeepError, Suspended
from statekeep.memory import Provenance, open_memory_store
from statekeep.models import ModelResponse, OpenAIChatModel, ScriptedModel
from statekeep.runtime import Agent, AgentTool, Runtime
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker, WorkflowStore
from statekeep.working import SQLWorkingStateStore, StateMigrations, WorkingState

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentTool",
    "Engine",
    "Message",
    "ModelResponse",
    "OpenAIChatModel",
    "Provenance",
    "Registry",
    "RunContext",
    "RunStatus",
    "Runtime",
    "SQLContextStore",
    "SQLWorkingStateStore",
    "ScriptedModel",
    "Settings",
    "StateMigrations",
    "StatekeepError",
    "Suspended",
    "Worker",
    "WorkflowStore",
    "WorkingState",
    "open_memory_store",
]
