"""Durable runs: ids, resume, conflicts, the step journal, retries, versions, children, state."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

from statekeep.db import Database
from statekeep.errors import (
    InvalidInputError,
    NonDeterminismError,
    RunConflictError,
    RunNotFoundError,
    StepOutputError,
    UnknownWorkflowError,
    WorkflowVersionError,
)
from statekeep.workflow import (
    AsyncRunContext,
    Registry,
    RetryPolicy,
    RunContext,
    RunStatus,
    Step,
    StepRecord,
    store,
)
from statekeep.workflow.tables import steps as steps_table
from statekeep.working import SQLWorkingStateStore, WorkingState

from .conftest import EngineFactory


class Crash(BaseException):
    """Stands in for a process dying mid-run (it is not an Exception, so nothing records it)."""


class Notes(WorkingState):
    state_schema: ClassVar[str] = "notes"
    items: list[str] = []


def counting_registry(calls: list[str], crash_at: str | None = None) -> Registry:
    registry = Registry()

    def work(name: str) -> str:
        calls.append(name)
        if name == crash_at:
            raise Crash
        return name.upper()

    @registry.workflow("three", version=1)
    def three(ctx: RunContext, prefix: str) -> list[str]:
        return [ctx.step(f"s{i}", work, f"{prefix}{i}") for i in range(3)]

    return registry


def test_run_executes_steps_and_records_output(make_engine: EngineFactory) -> None:
    """A run executes each step once and stores the workflow's JSON output."""
    calls: list[str] = []
    engine = make_engine(counting_registry(calls))
    run = engine.run(engine.registry.get("three", 1), "r-1", "a")
    assert (run.status, run.output) == (RunStatus.COMPLETED, ["A0", "A1", "A2"])
    assert calls == ["a0", "a1", "a2"]
    assert [(s.seq, s.name, s.value) for s in engine.store.steps("r-1")] == [
        (1, "s0", "A0"),
        (2, "s1", "A1"),
        (3, "s2", "A2"),
    ]


def test_invariant_1_completed_step_is_never_re_executed(make_engine: EngineFactory) -> None:
    """After an interruption inside step 2, a resume replays step 1 from the journal and runs 2 and 3."""
    calls: list[str] = []
    engine = make_engine(counting_registry(calls, crash_at="a1"))
    with pytest.raises(Crash):
        engine.run(engine.registry.get("three", 1), "r-1", "a")
    assert [s.name for s in engine.store.steps("r-1")] == ["s0"]
    calls.clear()
    again = make_engine(counting_registry(calls))
    run = again.run(again.registry.get("three", 1), "r-1", "a")
    assert run.output == ["A0", "A1", "A2"]
    assert calls == ["a1", "a2"]


def test_invariant_2_resume_needs_only_the_run_id(make_engine: EngineFactory) -> None:
    """resume(run_id) finds the workflow and its input from the store and continues."""
    calls: list[str] = []
    engine = make_engine(counting_registry(calls, crash_at="x2"))
    with pytest.raises(Crash):
        engine.run(engine.registry.get("three", 1), "r-2", "x")
    calls.clear()
    run = make_engine(counting_registry(calls)).resume("r-2")
    assert (run.status, run.output, calls) == (RunStatus.COMPLETED, ["X0", "X1", "X2"], ["x2"])


def test_starting_a_finished_run_again_returns_it_without_running(make_engine: EngineFactory) -> None:
    """The same id and input after completion is a resume: nothing runs again."""
    calls: list[str] = []
    engine = make_engine(counting_registry(calls))
    engine.run(engine.registry.get("three", 1), "r", "a")
    again = engine.run(engine.registry.get("three", 1), "r", "a")
    assert (again.status, len(calls)) == (RunStatus.COMPLETED, 3)


def test_unknown_run_id_raises_and_never_starts_a_fresh_run(make_engine: EngineFactory) -> None:
    """Resuming an id nobody started raises RunNotFoundError and creates nothing."""
    engine = make_engine(counting_registry([]))
    with pytest.raises(RunNotFoundError) as err:
        engine.resume("ghost")
    assert err.value.run_id == "ghost"
    assert engine.store.find("ghost") is None


def test_same_id_with_another_workflow_or_input_conflicts(make_engine: EngineFactory) -> None:
    """Reusing a run id for another workflow or another input raises and writes nothing."""
    registry = counting_registry([])

    @registry.workflow("other", version=1)
    def other(ctx: RunContext, prefix: str) -> str:
        return prefix

    engine = make_engine(registry)
    engine.run(registry.get("three", 1), "r", "a")
    with pytest.raises(RunConflictError, match="belongs to workflow 'three'"):
        engine.run(other, "r", "a")
    with pytest.raises(RunConflictError, match="another input"):
        engine.run(registry.get("three", 1), "r", "b")
    assert engine.store.get("r").input == {"args": ["a"], "kwargs": {}}
    assert len(engine.store.steps("r")) == 3


def test_bad_run_ids_and_inputs_are_refused_before_writing(make_engine: EngineFactory) -> None:
    """An empty id, a too-long id or a non-JSON input raises InvalidInputError; no run is stored."""
    engine = make_engine(counting_registry([]))
    three = engine.registry.get("three", 1)
    for bad in ("", "x" * 300, "a\x00b", "\ud800"):
        with pytest.raises(InvalidInputError, match="run_id"):
            engine.run(three, bad, "a")
    with pytest.raises(InvalidInputError, match="input"):
        engine.run(three, "r", ("a", "tuple"))
    assert engine.store.list_runs() == []


def test_non_json_step_output_raises_and_records_nothing(make_engine: EngineFactory) -> None:
    """A step returning a set (not JSON) raises StepOutputError; no journal entry is written."""
    registry = Registry()

    @registry.workflow("bad", version=1)
    def bad(ctx: RunContext) -> Any:
        return ctx.step("set", lambda: {1, 2})

    engine = make_engine(registry)
    with pytest.raises(StepOutputError) as err:
        engine.run(bad, "r")
    assert (err.value.run_id, err.value.step) == ("r", "set")
    assert engine.store.steps("r") == []
    assert [r.run_id for r in engine.held_back()] == ["r"]


def test_unregistered_lookup_names_the_workflow() -> None:
    """Asking the registry for a version it lacks raises UnknownWorkflowError naming it."""
    with pytest.raises(UnknownWorkflowError, match="'nope v3'"):
        Registry().get("nope", 3)


def test_retry_policy_retries_then_succeeds(make_engine: EngineFactory) -> None:
    """A flaky step is retried under its policy, and the successful attempt number is recorded."""
    registry = Registry()
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return "ok"

    @registry.workflow("flaky", version=1)
    def wf(ctx: RunContext) -> str:
        return ctx.step(Step("call", retry=RetryPolicy(attempts=3, backoff=0.001)), flaky)

    engine = make_engine(registry)
    assert engine.run(wf, "r").output == "ok"
    assert engine.store.steps("r")[0].attempt == 3


def test_step_failing_every_attempt_fails_the_run_with_the_error(make_engine: EngineFactory) -> None:
    """When every attempt raises, the run ends failed and records which step failed and why."""
    registry = Registry()

    def broken() -> str:
        raise ValueError("boom")

    @registry.workflow("broken", version=1, retry=RetryPolicy(attempts=2))
    def wf(ctx: RunContext) -> str:
        return ctx.step("b", broken)

    run = make_engine(registry).run(wf, "r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "'b'" in run.error
    assert "2 attempt" in run.error
    assert "boom" in run.error


def test_non_deterministic_replay_is_detected(make_engine: EngineFactory) -> None:
    """A workflow that asks for another step than the journal recorded raises NonDeterminismError."""
    order = ["first"]
    registry = Registry()

    @registry.workflow("nd", version=1)
    def wf(ctx: RunContext) -> str:
        ctx.step(order[0], str, "x")
        raise Crash

    engine = make_engine(registry)
    with pytest.raises(Crash):
        engine.run(wf, "r")
    order[0] = "second"
    with pytest.raises(NonDeterminismError) as err:
        engine.resume("r")
    assert (err.value.seq, err.value.recorded, err.value.requested) == (1, "step first", "step second")


def test_step_commits_with_the_state_version_in_one_transaction(database_url: str) -> None:
    """With a shared Database the completion points at the state version; a failed commit leaves neither."""
    db = Database(database_url)
    states = SQLWorkingStateStore(db)
    registry = Registry()

    @registry.workflow("noted", version=1, state=Notes)
    def wf(ctx: RunContext) -> int:
        ctx.set_state(Notes(items=["a"]))
        ctx.set_cursor(41)
        ctx.step("one", int, "1")
        ctx.set_state(Notes(items=["a", "b"]))
        return ctx.step("two", int, "2")

    from statekeep.workflow import Engine

    engine = Engine(db, registry, state_store=states)
    original = store.record_step
    fails = {"two"}

    def failing(conn: sa.Connection, step: StepRecord, epoch: int) -> None:
        original(conn, step, epoch)
        if step.name in fails:
            raise Crash

    store.record_step = failing
    try:
        with pytest.raises(Crash):
            engine.run(wf, "r")
    finally:
        store.record_step = original
    assert states.latest_version("r") == 1  # version 2 rolled back with its completion
    assert [(s.name, s.state_version, s.cursor) for s in engine.store.steps("r")] == [("one", 1, 41)]
    assert engine.resume("r").status is RunStatus.COMPLETED
    assert engine.store.checkpoint("r").state_version == 2
    assert states.load("r", Notes).items == ["a", "b"]
    db.dispose()


def test_state_in_another_database_is_written_first_and_pointed_at(
    make_engine: EngineFactory, tmp_path: Any
) -> None:
    """With separate databases, the completion records the version saved just before it."""
    states = SQLWorkingStateStore(f"sqlite:///{tmp_path / 'state.db'}")
    registry = Registry()

    @registry.workflow("apart", version=1)
    def wf(ctx: RunContext) -> list[str] | None:
        ctx.set_state(Notes(items=["x"]))
        ctx.step("save", str, "x")
        loaded = ctx.state(Notes)
        return None if loaded is None else loaded.items

    engine = make_engine(registry, state_store=states)
    assert engine.run(wf, "r").output == ["x"]
    assert engine.store.steps("r")[0].state_version == states.latest_version("r") == 1
    states.db.dispose()


def test_child_run_is_linked_and_its_result_returned(make_engine: EngineFactory) -> None:
    """A step can start a child run; parent and child are linked and the child output is recorded."""
    registry = Registry()

    @registry.workflow("child", version=1)
    def child(ctx: RunContext, n: int) -> int:
        return ctx.step("square", lambda: n * n)

    @registry.workflow("parent", version=1)
    def parent(ctx: RunContext) -> int:
        return ctx.child(child, "kid-1", 3) + ctx.child(child, "kid-2", 4)

    engine = make_engine(registry)
    assert engine.run(parent, "p").output == 25
    kids = engine.store.list_runs(parent_id="p")
    assert [(k.run_id, k.output, k.parent_id) for k in kids] == [("kid-1", 9, "p"), ("kid-2", 16, "p")]
    assert [s.kind for s in engine.store.steps("p")] == ["child", "child"]


def test_async_workflow_and_async_steps_share_the_one_implementation(make_engine: EngineFactory) -> None:
    """An async workflow awaits sync and async steps; a sync workflow can run an async step too."""
    registry = Registry()

    async def double(x: int) -> int:
        return 2 * x

    @registry.workflow("async", version=1)
    async def awf(ctx: AsyncRunContext, x: int) -> list[int]:
        a: int = await ctx.step("double", double, x)
        b = await ctx.step("inc", lambda: a + 1)
        return [a, b]

    @registry.workflow("sync", version=1)
    def swf(ctx: RunContext, x: int) -> int:
        return ctx.step("double", double, x)

    engine = make_engine(registry)
    assert engine.run(awf, "a", 5).output == [10, 11]
    assert engine.run(swf, "s", 5).output == 10
    assert [s.name for s in engine.store.steps("a")] == ["double", "inc"]


def test_invariant_5_another_version_without_migration_stops_and_is_listed(
    make_engine: EngineFactory,
) -> None:
    """Resuming a v1 run under code that only has v2 raises naming both, and the run is listed held back."""
    v1 = Registry()

    @v1.workflow("flow", version=1)
    def flow1(ctx: RunContext) -> str:
        ctx.step("a", str, "a")
        raise Crash

    with pytest.raises(Crash):
        make_engine(v1).run(flow1, "r")
    v2 = Registry()

    @v2.workflow("flow", version=2)
    def flow2(ctx: RunContext) -> str:
        return ctx.step("a", str, "a") + ctx.step("b", str, "b")

    engine = make_engine(v2)
    with pytest.raises(WorkflowVersionError) as err:
        engine.resume("r")
    assert (err.value.stored, err.value.available) == (1, [2])
    assert "v1" in str(err.value)
    assert "[2]" in str(err.value)
    assert [(r.run_id, r.version) for r in engine.held_back()] == [("r", 1)]


def test_invariant_5_a_registered_migration_upgrades_a_mid_run_workflow(make_engine: EngineFactory) -> None:
    """A migration rewrites the journal for the new version; the run continues without redoing steps."""
    v1 = Registry()

    @v1.workflow("flow", version=1)
    def flow1(ctx: RunContext) -> str:
        ctx.step("fetch", str, "a")
        raise Crash

    with pytest.raises(Crash):
        make_engine(v1).run(flow1, "r")
    v2 = Registry()
    ran: list[str] = []

    @v2.workflow("flow", version=2)
    def flow2(ctx: RunContext) -> str:
        def download() -> str:
            ran.append("download")
            return "new"

        def b() -> str:
            ran.append("b")
            return "b"

        return ctx.step("download", download) + ctx.step("b", b)

    @v2.migration("flow", from_version=1, to_version=2)
    def rename(journal: list[StepRecord]) -> list[StepRecord]:
        import dataclasses

        return [dataclasses.replace(s, name="download") if s.name == "fetch" else s for s in journal]

    engine = make_engine(v2)
    run = engine.resume("r")
    assert (run.status, run.output, run.version, ran) == (RunStatus.COMPLETED, "ab", 2, ["b"])
    assert engine.held_back() == []


def test_invariant_5_linear_storage_bytes_per_step_stay_constant(make_engine: EngineFactory) -> None:
    """Each step stores only its own output: journal bytes grow linearly, the run row not at all."""
    registry = Registry()

    @registry.workflow("long", version=1)
    def wf(ctx: RunContext, n: int) -> int:
        for i in range(n):

            def payload(i: int = i) -> dict[str, object]:
                return {"i": i % 10, "text": "x" * 400}

            ctx.step("s", payload)
        return n

    engine = make_engine(registry)
    engine.run(wf, "short", 50)
    engine.run(wf, "long", 200)
    size = sa.func.sum(
        sa.func.length(steps_table.c.output)
        + sa.func.length(steps_table.c.name)
        + sa.func.length(steps_table.c.input_hash)
    )
    with engine.store.db.read() as conn:
        short, long = (
            conn.execute(sa.select(size).where(steps_table.c.run_id == rid)).scalar_one()
            for rid in ("short", "long")
        )
    assert long == 4 * short
    assert short / 50 < 500


def test_cancel_stops_a_live_run_and_refuses_a_finished_one(make_engine: EngineFactory) -> None:
    """cancel() ends a live run as cancelled; cancelling again is refused."""
    from statekeep.errors import RunFinishedError

    calls: list[str] = []
    engine = make_engine(counting_registry(calls))
    engine.start(engine.registry.get("three", 1), "r", "a")
    assert engine.store.cancel("r").status is RunStatus.CANCELLED
    assert engine.resume("r").status is RunStatus.CANCELLED
    assert calls == []
    with pytest.raises(RunFinishedError):
        engine.store.cancel("r")


def test_a_parent_waits_for_a_waiting_child_and_is_woken_when_it_finishes(make_engine: EngineFactory) -> None:
    """A child that parks leaves the parent waiting_for_child; the child's completion wakes the parent."""
    registry = Registry()

    @registry.workflow("napper", version=1)
    def napper(ctx: RunContext) -> str:
        ctx.sleep("nap", 2.0)  # long enough that a loaded machine cannot outlive it before parking
        return "awake"

    @registry.workflow("parent", version=1)
    def parent(ctx: RunContext) -> str:
        return "child said " + ctx.child(napper, "kid")

    engine = make_engine(registry)
    assert engine.run(parent, "p").status is RunStatus.WAITING_FOR_CHILD
    assert engine.store.get("kid").status is RunStatus.SLEEPING
    import time

    time.sleep(2.05)
    assert engine.resume("kid").status is RunStatus.COMPLETED
    assert engine.store.get("p").status is RunStatus.PENDING
    assert engine.resume("p").output == "child said awake"


def test_bad_step_names_and_queries_are_refused(make_engine: EngineFactory) -> None:
    """An empty step name raises InvalidInputError and records nothing; bad query arguments raise too."""
    registry = Registry()

    @registry.workflow("unnamed", version=1)
    def wf(ctx: RunContext) -> str:
        return ctx.step("", str, "x")

    engine = make_engine(registry)
    with pytest.raises(InvalidInputError, match="name"):
        engine.run(wf, "r")
    assert engine.store.steps("r") == []
    with pytest.raises(InvalidInputError, match="limit"):
        engine.store.list_runs(limit=0)
    with pytest.raises(InvalidInputError, match="run_id"):
        engine.store.get("")
    with pytest.raises(InvalidInputError, match="to_version"):
        registry.migration("unnamed", from_version=2, to_version=1)


def test_a_database_error_mid_run_leaves_it_resumable_not_failed(make_engine: EngineFactory) -> None:
    """A storage failure while committing a step raises StorageError; the run is not failed and resumes."""
    from statekeep.errors import StorageError

    calls: list[str] = []
    engine = make_engine(counting_registry(calls))
    original = store.record_step

    def broken(conn: sa.Connection, step: StepRecord, epoch: int) -> None:
        raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))

    store.record_step = broken
    try:
        with pytest.raises(StorageError, match="disk I/O error"):
            engine.run(engine.registry.get("three", 1), "r", "a")
    finally:
        store.record_step = original
    assert engine.store.get("r").status is RunStatus.RUNNING
    assert engine.resume("r").status is RunStatus.COMPLETED


def test_async_workflows_refuse_a_private_in_memory_sqlite(tmp_path: Any) -> None:
    """An async workflow on sqlite:///:memory: raises ConfigError saying to use a file."""
    from statekeep.errors import ConfigError
    from statekeep.workflow import Engine

    registry = Registry()

    @registry.workflow("a", version=1)
    async def awf(ctx: AsyncRunContext) -> int:
        return await ctx.step("one", int, "1")

    engine = Engine("sqlite:///:memory:", registry)
    with pytest.raises(ConfigError, match="SQLite file"):
        engine.run(awf, "r")
    assert engine.store.steps("r") == []


@pytest.mark.parametrize("error", ["storage", "locked-memory"])
def test_an_infrastructure_error_inside_a_step_leaves_the_run_resumable(
    make_engine: EngineFactory, error: str
) -> None:
    """A StorageError or ConfigError (a locked LanceDB folder) raised by a step's own code is not
    the step's failure: it is not retried as one, the run is not failed, and a resume finishes it.
    (A storage error leaves the run running for its lease to lapse; a configuration error holds it
    back until an explicit resume.)"""
    from statekeep.errors import MemoryLockedError, StorageError

    registry = Registry()
    broken = {"on": True}
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if broken["on"]:
            raise StorageError("database is locked") if error == "storage" else MemoryLockedError("/m")
        return "ok"

    @registry.workflow("infra", version=1, retry=RetryPolicy(attempts=3))
    def infra(ctx: RunContext) -> str:
        return ctx.step("flaky", flaky)

    engine = make_engine(registry)
    with pytest.raises((StorageError, MemoryLockedError)):
        engine.run(infra, "infra-1")
    assert len(tries) == 1  # not retried as a step failure
    expected = RunStatus.RUNNING if error == "storage" else RunStatus.PENDING
    assert engine.store.get("infra-1").status is expected
    broken["on"] = False
    assert engine.resume("infra-1").output == "ok"
