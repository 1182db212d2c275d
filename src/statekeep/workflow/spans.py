"""The workflow's spans and run logs: a run's trace context, its attempts, steps, tool calls and approvals.

Built on the generic machinery of :mod:`statekeep.tracing` (which lists every
span statekeep records): each ``run`` span continues the trace stored with the
run, so every attempt, on whichever worker, after a crash or a wait of days,
belongs to the same trace.

Logs (the ``statekeep.worker`` and ``statekeep.workflow`` loggers, with the
structured fields of :mod:`statekeep.logs`): a run claimed, each step
completed, a wait, a retry, a failure, a lease lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from statekeep import tracing
from statekeep.workflow._types import Approval, Run, StepRecord

try:
    from opentelemetry import context as otel_context
    from opentelemetry.trace import Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the API is a dependency; a trimmed install may lack it
    pass  # every use below is behind ``not tracing.enabled()``

worker_log = logging.getLogger("statekeep.worker")
step_log = logging.getLogger("statekeep.workflow")

#: Attribute names of the workflow's spans.
RUN_ID, WORKFLOW, WORKER = "statekeep.run_id", "statekeep.workflow", "statekeep.worker"
LEDGER_OUTCOME, IDEMPOTENCY_KEY = "statekeep.tool.ledger_outcome", "statekeep.tool.idempotency_key"


def _nanoseconds(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


# --- a run's trace context --------------------------------------------------------------------


class RunStart:
    """The ``run.start`` span of a run being recorded; its context is stored with the run."""

    def __init__(self, workflow: str, run_id: str) -> None:
        self.carrier: str | None = None
        self._span: Any = None
        if not tracing.enabled():
            return
        self._span = tracing.tracer().start_span(
            f"run.start {workflow}", attributes={RUN_ID: run_id, WORKFLOW: workflow}
        )
        if not self._span.get_span_context().is_valid:
            return  # no SDK: nothing to continue
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, tracing.trace.set_span_in_context(self._span))
        self.carrier = json.dumps(carrier, sort_keys=True)

    def stored(self, run: Run) -> None:
        """End the span if the run was recorded with it (a run that existed already keeps its own)."""
        if self._span is not None and getattr(run, "trace_context", None) == self.carrier:
            self._span.end()


def _parent(run: Run) -> Any:
    """The OpenTelemetry context a run's attempts continue: the one stored with it, else the current one."""
    stored = getattr(run, "trace_context", None)
    if not tracing.enabled() or not stored:
        return None
    try:
        carrier = json.loads(stored)
    except ValueError:
        return None
    return TraceContextTextMapPropagator().extract(carrier) if isinstance(carrier, dict) else None


# --- run attempts -----------------------------------------------------------------------------


class Attempt:
    """One attempt at a run on a worker: its span, and the log line of how it ended."""

    def __init__(self, run: Run, worker: str, current: Any) -> None:
        self.run, self.worker, self.span = run, worker, current

    def done(self, result: Run) -> None:
        """Record how the attempt left the run: finished, failed, or waiting for something."""
        status = result.status.value
        self.span.set_attribute("statekeep.run.status", status)
        extra = _run_fields(result, self.worker)
        if status == "completed":
            worker_log.info("run completed", extra=extra)
        elif status == "failed":
            if tracing.enabled():
                self.span.set_status(Status(StatusCode.ERROR, result.error or "failed"))
            worker_log.warning("run failed", extra={**extra, "error": result.error})
        elif status == "cancelled":
            worker_log.info("run cancelled", extra=extra)
        elif (result.waiting or {}).get("held"):
            worker_log.warning("run held back", extra={**extra, "error": (result.waiting or {})["held"]})
        else:
            waiting = result.waiting or {}
            self.span.add_event("wait", tracing.clean({"statekeep.run.status": status, **_flat(waiting)}))
            worker_log.info("run waits", extra={**extra, "approval_id": waiting.get("approval_id")})


def _flat(waiting: dict[str, Any]) -> dict[str, Any]:
    return {
        f"statekeep.wait.{k}": v if isinstance(v, str | int | float | bool) else str(v)
        for k, v in waiting.items()
    }


def _run_fields(run: Run, worker: str | None = None) -> dict[str, Any]:
    return {"run_id": run.run_id, "workflow": run.workflow, "status": run.status.value, "worker": worker}


@contextmanager
def run_attempt(run: Run, worker: str) -> Iterator[Attempt]:
    """The span of one attempt at ``run``, continuing the run's trace."""
    attributes = {
        RUN_ID: run.run_id,
        WORKFLOW: run.workflow,
        "statekeep.workflow.version": run.version,
        "statekeep.run.epoch": run.epoch,
        WORKER: worker,
    }
    if not tracing.enabled():
        yield Attempt(run, worker, tracing.NO_SPAN)
        return
    parent = _parent(run)
    token = otel_context.attach(parent) if parent is not None else None
    try:
        with (
            tracing.tracer().start_as_current_span(
                f"run {run.workflow}",
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as current,
            tracing.outcome(current),
        ):
            yield Attempt(run, worker, current)
    finally:
        if token is not None:
            otel_context.detach(token)


def run_claimed(run: Run, worker: str) -> None:
    """Log a run a worker claimed."""
    worker_log.info("run claimed", extra={**_run_fields(run, worker), "attempt": run.epoch})


def lease_lost(run: Run, worker: str, error: BaseException) -> None:
    """Log a run taken over by another worker while this one executed it."""
    worker_log.warning("lease lost", extra={**_run_fields(run, worker), "error": str(error)})


# --- steps and tool calls ---------------------------------------------------------------------


def steps_committed(run: Run, steps: list[StepRecord]) -> None:
    """Log each journal entry a transaction just committed."""
    if not step_log.isEnabledFor(logging.INFO):
        return
    for s in steps:
        took = (s.finished_at - s.started_at).total_seconds() * 1000
        step_log.info(
            "step completed",
            extra={
                "run_id": run.run_id,
                "workflow": run.workflow,
                "step": s.name,
                "kind": s.kind,
                "seq": s.seq,
                "attempt": s.attempt,
                "worker": run.lease_owner,
                "duration_ms": round(took, 1),
            },
        )


@contextmanager
def step(run: Run, name: str, seq: int) -> Iterator[Any]:
    """The span of a step that runs (replayed steps have none)."""
    attributes = {RUN_ID: run.run_id, "statekeep.step": name, "statekeep.step.seq": seq}
    with tracing.span(f"step {name}", attributes) as current:
        yield current


def retrying(run: Run, name: str, seq: int, attempt: int, error: BaseException, delay: float) -> None:
    """A step attempt failed and will be tried again after ``delay`` seconds."""
    tracing.note("statekeep.step.retries", attempt)
    if tracing.enabled():
        tracing.trace.get_current_span().add_event(
            "retry", {"statekeep.step.attempt": attempt, "exception.message": repr(error), "delay_s": delay}
        )
    step_log.warning(
        "step attempt failed; retrying",
        extra={
            "run_id": run.run_id,
            "step": name,
            "seq": seq,
            "attempt": attempt,
            "worker": run.lease_owner,
            "error": repr(error),
        },
    )


@contextmanager
def tool_call(run: Run, tool: str, seq: int, key: str) -> Iterator[Any]:
    """The span of a tool call through the ledger (GenAI ``execute_tool``)."""
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": key,
        IDEMPOTENCY_KEY: key,
        RUN_ID: run.run_id,
        "statekeep.step.seq": seq,
    }
    with tracing.span(f"execute_tool {tool}", attributes) as current:
        yield current


def approval_waited(approval: Approval) -> None:
    """The wait for a person, from the approval's creation to its decision, seen by the run."""
    if not tracing.enabled() or approval.decided_at is None:
        return
    attributes = tracing.clean(
        {
            "statekeep.approval_id": approval.approval_id,
            "statekeep.approval.kind": approval.kind,
            "statekeep.approval.status": approval.status,
            "statekeep.approval.decided_by": approval.decided_by,
            RUN_ID: approval.run_id,
        }
    )
    waited = tracing.tracer().start_span(
        f"approval {approval.action}", attributes=attributes, start_time=_nanoseconds(approval.created_at)
    )
    waited.end(end_time=_nanoseconds(approval.decided_at))


def approval_decided(approval: Approval, run: Run | None, via: str) -> None:
    """A person's decision, made here (``via``: console, cli...), as a span of the run's trace."""
    if not tracing.enabled():
        return
    parent = None if run is None else _parent(run)
    attributes = tracing.clean(
        {
            "statekeep.approval_id": approval.approval_id,
            "statekeep.approval.status": approval.status,
            "statekeep.approval.decided_by": approval.decided_by,
            "statekeep.approval.via": via,
            RUN_ID: approval.run_id,
        }
    )
    tracing.tracer().start_span(f"decide {approval.action}", context=parent, attributes=attributes).end()
    worker_log.info(
        "approval decided",
        extra={"run_id": approval.run_id, "approval_id": approval.approval_id, "status": approval.status},
    )


__all__ = [
    "IDEMPOTENCY_KEY",
    "LEDGER_OUTCOME",
    "RUN_ID",
    "WORKER",
    "WORKFLOW",
    "Attempt",
    "RunStart",
    "approval_decided",
    "approval_waited",
    "lease_lost",
    "retrying",
    "run_attempt",
    "run_claimed",
    "step",
    "step_log",
    "steps_committed",
    "tool_call",
    "worker_log",
]
