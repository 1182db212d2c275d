"""Bad input to the workflow store and to ctx.* inside a run: InvalidInputError naming the field.

Found by probing every entry point with wrong types, NaN, huge numbers, NUL and
lone surrogates: each used to escape as TypeError, OverflowError, AttributeError
or UnicodeEncodeError, or to be stored and fail the run later.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from statekeep.errors import InvalidInputError, UnknownWorkflowError
from statekeep.workflow import Engine, Registry, RetryPolicy, RunContext, RunStatus, Step, Worker

from .conftest import EngineFactory

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.find("\ud800"), "run_id"),
        (lambda s: s.find(None), "run_id"),
        (lambda s: s.cancel("a\x00b"), "run_id"),
        (lambda s: s.steps(5), "run_id"),
        (lambda s: s.tool_calls("\ud800"), "run_id"),
        (lambda s: s.tool_call("r", 2**40), "seq"),
        (lambda s: s.journal("r", "3", 10), "start"),
        (lambda s: s.journal("r", 1, None), "size"),
        (lambda s: s.list_runs(status="sleepy"), "status"),
        (lambda s: s.list_runs(status=5), "status"),
        (lambda s: s.list_runs(workflow="\ud800"), "workflow"),
        (lambda s: s.list_runs(parent_id="a\x00"), "parent_id"),
        (lambda s: s.list_runs(limit=10**30), "limit"),
        (lambda s: s.list_runs(limit=True), "limit"),
        (lambda s: s.send_event("r", "x" * 300), "name"),
        (lambda s: s.send_event("r", "a\x00b"), "name"),
        (lambda s: s.send_event("\ud800", "go"), "run_id"),
        (lambda s: s.purge(older_than=timedelta.max), "older_than"),
        (lambda s: s.purge(older_than=5), "older_than"),
        (lambda s: s.purge(keep_last=-1), "keep_last"),
        (lambda s: s.purge(keep_last=1, workflow="\ud800"), "workflow"),
        (lambda s: s.delete_runs("run-1"), "run_ids"),
        (lambda s: s.approvals(status="bogus"), "status"),
        (lambda s: s.approvals(kind="other"), "kind"),
    ],
)
def test_store_calls_refuse_bad_arguments(
    make_engine: EngineFactory, call: Callable[[Any], Any], field: str
) -> None:
    engine = make_engine(Registry())
    with pytest.raises(InvalidInputError) as err:
        call(engine.store)
    assert err.value.field == field


def test_store_filters_take_status_names(make_engine: EngineFactory) -> None:
    """list_runs(status=...) takes a status, its name, or several of either."""
    registry = Registry()

    @registry.workflow("noop", version=1)
    def noop(ctx: RunContext) -> int:
        return 1

    engine = make_engine(registry)
    engine.run(noop, "done")
    engine.start(noop, "waiting")
    assert [r.run_id for r in engine.store.list_runs(status="completed")] == ["done"]
    assert [r.run_id for r in engine.store.list_runs(status=["pending", RunStatus.COMPLETED])] == [
        "done",
        "waiting",
    ]


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda e: Engine(e.store.db, Registry(), lease=NAN), "lease"),
        (lambda e: Engine(e.store.db, Registry(), lease=10**30), "lease"),
        (lambda e: Engine(e.store.db, None), "registry"),  # type: ignore[arg-type]
        (lambda e: Worker(e, poll=NAN), "poll"),
        (lambda e: Worker(e, poll=None), "poll"),  # type: ignore[arg-type]
        (lambda e: Worker(e, poll=1.0, max_poll=0.5), "poll"),
        (lambda e: Worker(None), "engine"),  # type: ignore[arg-type]
        (lambda e: Worker(e).run(idle_exit=-1), "idle_exit"),
        (lambda e: Worker(e).run(idle_exit=NAN), "idle_exit"),
        (lambda e: RetryPolicy(backoff=-1), "backoff"),
        (lambda e: RetryPolicy(attempts=0), "attempts"),
        (lambda e: RetryPolicy(factor=NAN), "factor"),
        (lambda e: Step(5), "step name"),  # type: ignore[arg-type]
        (lambda e: Step("s", retry=3), "retry"),  # type: ignore[arg-type]
        (lambda e: Engine(e.store.db, Registry(), state_store="x"), "state_store"),  # type: ignore[arg-type]
        (lambda e: Registry().workflow("w", version=10**30), "version"),
        (lambda e: Registry().workflow("w", version=True), "version"),
        (lambda e: Registry().workflow("w", retry=5), "retry"),  # type: ignore[arg-type]
        (lambda e: Registry().workflow("w", state=dict), "state"),  # type: ignore[arg-type]
        (lambda e: Registry().migration("w", from_version=True, to_version=2), "from_version"),
        (lambda e: Registry().get(["a"], 1), "name"),  # type: ignore[arg-type]
    ],
)
def test_constructors_refuse_what_would_fail_later(
    make_engine: EngineFactory, make: Callable[[Engine], Any], field: str
) -> None:
    engine = make_engine(Registry())
    with pytest.raises(InvalidInputError) as err:
        make(engine)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (lambda ctx: ctx.sleep("nap", NAN), "seconds"),
        (lambda ctx: ctx.sleep("nap", INF), "seconds"),
        (lambda ctx: ctx.sleep("nap", 10**30), "seconds"),
        (lambda ctx: ctx.sleep("nap", "5"), "seconds"),
        (lambda ctx: ctx.sleep("nap", until="2030-01-01"), "until"),
        (lambda ctx: ctx.wait_for_event("go", timeout=NAN), "timeout"),
        (lambda ctx: ctx.wait_for_event("go", timeout=10**30), "timeout"),
        (lambda ctx: ctx.wait_for_event("\ud800"), "event name"),
        (lambda ctx: ctx.step("\ud800", str), "step name"),
        (lambda ctx: ctx.step("a\x00b", str), "step name"),
        (lambda ctx: ctx.set_cursor(10**30), "cursor"),
    ],
)
def test_bad_ctx_calls_hold_the_run_with_a_clear_error(
    make_engine: EngineFactory, body: Callable[[RunContext], Any], field: str
) -> None:
    """The run is held (still pending, nothing journaled), not failed for good: fixed code resumes it."""
    registry = Registry()

    @registry.workflow("bad", version=1)
    def bad(ctx: RunContext) -> None:
        body(ctx)

    engine = make_engine(registry)
    with pytest.raises(InvalidInputError) as err:
        engine.run(bad, "r")
    assert err.value.field == field
    assert engine.store.get("r").status is RunStatus.PENDING
    assert engine.store.steps("r") == []


def test_a_gate_refuses_a_bad_expiry_when_it_is_declared(make_engine: EngineFactory) -> None:
    """requiring_approval checks expires_in up front, instead of failing the run at the gate."""
    registry = Registry()

    @registry.tool("book")
    def book(key: str) -> str:
        return key

    for bad in (5, "1h", timedelta.max, timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(InvalidInputError) as err:
            book.requiring_approval("people decide", expires_in=bad)  # type: ignore[arg-type]
        assert err.value.field == "expires_in"
    with pytest.raises(InvalidInputError) as err:
        book.requiring_approval("   ")
    assert err.value.field == "reason"


def test_a_deadline_already_past_is_a_sleep_of_zero(make_engine: EngineFactory) -> None:
    """ctx.sleep(deadline - now) may be negative on a late resume: that is a sleep already over."""
    registry = Registry()

    @registry.workflow("late", version=1)
    def late(ctx: RunContext) -> str:
        ctx.sleep("until the deadline", -5.0)
        ctx.wait_for_event("go", timeout=-1)
        return "on time"

    engine = make_engine(registry)
    assert engine.run(late, "r").output == "on time"


def test_numbers_at_the_edges() -> None:
    """Huge ints are refused as seconds instead of overflowing; numpy ints count as ints; a steep
    retry policy caps its late delays instead of overflowing."""
    import numpy as np

    from statekeep._check import check_int, check_seconds

    with pytest.raises(InvalidInputError) as err:
        check_seconds(10**400, "lease")
    assert err.value.field == "lease"
    assert check_int(np.int64(16), "nprobes") == 16
    assert check_seconds(np.float32(0.5), "poll") == 0.5
    assert RetryPolicy(attempts=1000, backoff=1.0, factor=3, max_backoff=60.0).delay(700) == 60.0


def test_run_refuses_a_workflow_this_engine_cannot_run_before_writing(make_engine: EngineFactory) -> None:
    """run() used to write the run, then fail to execute it; start() still enqueues it for workers."""
    elsewhere = Registry()

    @elsewhere.workflow("remote", version=1)
    def remote(ctx: RunContext) -> int:
        return 1

    engine = make_engine(Registry())
    with pytest.raises(UnknownWorkflowError):
        engine.run(remote, "r")
    assert engine.store.find("r") is None
    assert engine.start(remote, "r").status is RunStatus.PENDING  # for a worker with the code
