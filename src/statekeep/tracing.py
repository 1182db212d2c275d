"""Traces and run logs: OpenTelemetry spans, and a log line per thing a worker does.

Spans (with the OpenTelemetry API, ``opentelemetry-api``; an SDK, the
``statekeep[tracing]`` extra or any other, decides where they go):

=================================  ===========================================================
span                               attributes
=================================  ===========================================================
``run <workflow>``                 one per run attempt: run id, workflow, version, epoch, worker,
                                   final status
``step <name>``                    a step that ran (not a replayed one): seq, attempt, retries
``chat <model>``                   a model call, GenAI conventions: ``gen_ai.operation.name``,
                                   ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``,
                                   ``gen_ai.usage.output_tokens``
``execute_tool <tool>``            a tool call: ``gen_ai.tool.name``, its idempotency key, and
                                   its ledger outcome (executed, recorded, reconciled, ...)
``approval <action>``              the wait for a person: from the approval's creation to its
                                   decision, recorded when the run observes the decision
``decide <action>``                the decision itself, where it was made (console, CLI)
``memory.search``/``memory.write`` the owner's memory read or written
``context.build``                  tokens per section, budget, events in the window
=================================  ===========================================================

A run's trace context is stored with the run when it is first recorded, so
every attempt, on whichever worker, after a crash or a wait of days, continues
the same trace: each ``run`` span is a child of the run's ``run.start`` span.

This module holds the generic machinery (:func:`span`, :func:`note`, the tracer)
and the model and context spans; the workflow's spans and its run logs (the
``statekeep.worker`` and ``statekeep.workflow`` loggers) are written by
:mod:`statekeep.workflow.spans`.

Without the OpenTelemetry API installed, every span here is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statekeep.context import ContextReport

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - the API is a dependency; a trimmed install may lack it
    trace = None  # type: ignore[assignment]


class _NoSpan:
    """What the spans are without OpenTelemetry: every call does nothing."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        pass

    def is_recording(self) -> bool:
        return False


#: The span every helper yields when no span is recorded.
NO_SPAN = _NoSpan()
_NO_PROVIDERS: tuple[type, ...] = (
    () if trace is None else (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
)


def enabled() -> bool:
    """True when the OpenTelemetry API is installed (spans still go nowhere without an SDK)."""
    return trace is not None


def recording() -> bool:
    """True when spans may go somewhere: a tracer provider (an SDK) has been set.

    Without one, every span is a no-op: the hot paths (a step, a tool call) skip
    building them, which costs more than the rest of a step's Python.
    """
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDERS)


def tracer() -> Any:
    """statekeep's OpenTelemetry tracer (only when :func:`enabled`)."""
    from statekeep import __version__

    return trace.get_tracer("statekeep", __version__)


@contextmanager
def span(name: str, attributes: dict[str, Any] | None = None, *, kind: str = "internal") -> Iterator[Any]:
    """A span around the block, child of the current one; an exception marks it as an error."""
    if not recording():
        yield NO_SPAN
        return
    span_kind = SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL
    with (
        tracer().start_as_current_span(
            name,
            kind=span_kind,
            attributes=clean(attributes),
            record_exception=False,
            set_status_on_exception=False,
        ) as current,
        outcome(current),
    ):
        yield current


@contextmanager
def outcome(current: Any) -> Iterator[None]:
    """An exception makes the span an error; a run parking (``Suspended``) is an event, not an error."""
    try:
        yield
    except Exception as exc:
        current.record_exception(exc)
        current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    except BaseException as exc:
        current.add_event(type(exc).__name__.lower(), {"exception.message": str(exc)})
        raise


def note(key: str, value: Any) -> None:
    """Set an attribute on the current span (the tool call being made, the step being run)."""
    if trace is not None and value is not None:
        trace.get_current_span().set_attribute(key, value)


def clean(attributes: dict[str, Any] | None) -> dict[str, Any]:
    """The attributes that have a value (OpenTelemetry refuses None)."""
    return {k: v for k, v in (attributes or {}).items() if v is not None}


# --- models, memory, context -----------------------------------------------------------------


@contextmanager
def model_call(model: str) -> Iterator[Any]:
    """The span of a model call, with the GenAI semantic conventions."""
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
    with span(f"chat {model}", attributes, kind="client") as current:
        yield current


def model_answered(current: Any, input_tokens: int, output_tokens: int, tool_calls: int) -> None:
    """The tokens a model call used, as the provider reported them."""
    current.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    current.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    current.set_attribute("statekeep.model.tool_calls", tool_calls)


def context_built(current: Any, report: ContextReport) -> None:
    """Tokens per section of a context the builder produced."""
    for name, tokens in report.sections().items():
        current.set_attribute(f"statekeep.context.tokens.{name}", tokens)
    current.set_attribute("statekeep.context.tokens.total", report.total)
    current.set_attribute("statekeep.context.budget", report.budget)
    current.set_attribute("statekeep.context.window_events", report.window_events)


__all__ = [
    "NO_SPAN",
    "clean",
    "context_built",
    "enabled",
    "model_answered",
    "model_call",
    "note",
    "outcome",
    "recording",
    "span",
    "trace",  # the OpenTelemetry trace API, None without it: read at call time (tests switch it off)
    "tracer",
]
