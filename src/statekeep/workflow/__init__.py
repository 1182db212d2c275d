"""Store 3: durable runs, the step journal, the tool-call ledger, approvals, waits and workers.

Examples:
    >>> from statekeep.workflow import Engine, Registry, RunContext
    >>> registry = Registry()
    >>> @registry.workflow("count", version=1)
    ... def count(ctx: RunContext, n: int) -> int:
    ...     return sum(ctx.step(f"add-{i}", lambda i=i: i) for i in range(n))
    >>> Engine("sqlite:///:memory:", registry).run(count, "count-3", 3).output
    3
"""

from statekeep.workflow._types import (
    Approval,
    Checkpoint,
    LedgerEntry,
    Reconciliation,
    RetryPolicy,
    Run,
    RunPage,
    RunStatus,
    StepRecord,
)
from statekeep.workflow.base import WorkflowStore
from statekeep.workflow.engine import Engine
from statekeep.workflow.execution import Finish
from statekeep.workflow.inmemory import InMemoryWorkflowStore
from statekeep.workflow.registry import Reconciler, Registry, Step, Tool, Workflow
from statekeep.workflow.run_context import AsyncRunContext, RunContext
from statekeep.workflow.run_write import RunWrite
from statekeep.workflow.sql import SQLWorkflowStore
from statekeep.workflow.worker import Worker

__all__ = [
    "Approval",
    "AsyncRunContext",
    "Checkpoint",
    "Engine",
    "Finish",
    "InMemoryWorkflowStore",
    "LedgerEntry",
    "Reconciler",
    "Reconciliation",
    "Registry",
    "RetryPolicy",
    "Run",
    "RunContext",
    "RunPage",
    "RunStatus",
    "RunWrite",
    "SQLWorkflowStore",
    "Step",
    "StepRecord",
    "Tool",
    "Worker",
    "Workflow",
    "WorkflowStore",
]
