"""Durable runs through the engine: input checks, retries, non-determinism, state, async, errors.

The store's invariants (the journal, resume by id, run-id conflicts, versions, cancel,
children) are in the conformance suite (test_suite.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

from statekeep.db import Database
from statekeep.errors import (
    InvalidInputError,
    LeaseLostError,
    NonDeterminismError,
    StepOutputError,
    UnknownWorkflowError,
)
from statekeep.workflow import (
    AsyncRunContext,
    Engine,
    Registry,
    RetryPolicy,
    Run,
    RunContext,
    RunStatus,
    SQLWorkflowStore,
    Step,
    StepRecord,
)
from statekeep.workflow.sql_tx import SQLRunWrite
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
    original = SQLRunWrite.record_step
    fails = {"two"}

    def failing(tx: SQLRunWrite, step: StepRecord) -> None:
        original(tx, step)
        if step.name in fails:
            raise Crash

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SQLRunWrite, "record_step", failing)
        with pytest.raises(Crash):
            engine.run(wf, "r")
    assert states.latest_version("r") == 1  # version 2 rolled back with its completion
    assert [(s.name, s.state_version, s.cursor) for s in engine.store.steps("r")] == [("one", 1, 41)]
    assert engine.resume("r").status is RunStatus.COMPLETED
    assert engine.store.checkpoint("r").state_version == 2
    assert states.load("r", Notes).items == ["a", "b"]
    db.dispose()


def test_a_step_completion_writes_the_run_row_once_and_reads_no_state(database_url: str) -> None:
    """Each step with a new state is one transaction: its checkpoint (the fence), its version, its entry.

    The state the step set is read back from what it committed, not from the database.
    """
    db = Database(database_url)
    states = SQLWorkingStateStore(db)
    registry = Registry()
    seen: list[list[str]] = []

    @registry.workflow("noted", version=1, state=Notes)
    def wf(ctx: RunContext) -> int:
        for i in range(3):
            state = ctx.state(Notes) or Notes()
            seen.append(state.items)
            ctx.set_state(Notes(items=[*state.items, str(i)]))
            ctx.step(f"s{i}", int, str(i))
        return 0

    engine = Engine(db, registry, state_store=states)
    engine.start(wf, "r")
    statements: list[str] = []

    def log(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()[:3]).upper())

    sa.event.listen(db.engine, "before_cursor_execute", log)
    try:
        run = engine.resume("r")
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", log)
    assert run.status is RunStatus.COMPLETED
    assert seen == [[], ["0"], ["0", "1"]]
    assert states.load("r", Notes).items == ["0", "1", "2"]
    touched = [s for s in statements if "RUNS" in s or "WORKING_VERSIONS" in s or "STEPS" in s]
    completions = [i for i, s in enumerate(touched) if s.startswith("INSERT INTO") and "STEPS" in s]
    assert len(completions) == 3
    reads_of_state = [s for s in statements if s.startswith("SELECT") and "WORKING_VERSIONS" in s]
    assert len(reads_of_state) == 1  # the first step's, before any version of this execution
    # between two completions: one update of the run row (checkpoint and fence at once), one version
    between = touched[completions[0] + 1 : completions[1] + 1]
    assert sum(s.startswith("UPDATE") and "RUNS" in s for s in between) == 1, between
    assert sum(s.startswith("INSERT") and "WORKING_VERSIONS" in s for s in between) == 1, between
    db.dispose()


def test_a_stale_worker_whose_state_version_was_taken_hears_lease_lost(database_url: str) -> None:
    """The new holder committed the step and version first; the old one's same write is fenced: no clash."""
    db = Database(database_url)
    states = SQLWorkingStateStore(db)
    registry = Registry()

    @registry.workflow("noted", version=1, state=Notes)
    def wf(ctx: RunContext) -> None:
        ctx.set_state(Notes())
        ctx.step("begin", int, "0")
        ctx.sleep("nap", 3600)

    engine = Engine(db, registry, state_store=states)
    engine.run(wf, "r")  # parked, version 1 its latest: both holders would write version 2 next
    store = engine.store
    stale = store.acquire("r", "worker-a", 30)
    live = store.acquire("r", "worker-b", 30)
    assert stale is not None
    assert live is not None
    assert live.epoch == stale.epoch + 1

    def complete(run: Run, output: str) -> None:
        with store.fenced(run) as tx:
            staged = (Notes(items=[output]), states.prepare("r", Notes(items=[output])))
            version = tx.save_state(states, staged, 1)
            stamp = datetime.now(UTC)
            step = StepRecord("r", 3, "s", "step", "h", f'"{output}"', 1, stamp, stamp, version, None)
            tx.record_step(step)

    complete(live, "live")
    with pytest.raises(LeaseLostError) as err:
        complete(stale, "stale")
    assert err.value.epoch == stale.epoch
    assert states.load("r", Notes).items == ["live"]
    assert [s.output for s in store.steps("r") if s.name == "s"] == ['"live"']
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
    assert isinstance(engine.store, SQLWorkflowStore)
    with engine.store.db.read() as conn:
        short, long = (
            conn.execute(sa.select(size).where(steps_table.c.run_id == rid)).scalar_one()
            for rid in ("short", "long")
        )
    assert long == 4 * short
    assert short / 50 < 500


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

    def broken(tx: SQLRunWrite, step: StepRecord) -> None:
        raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SQLRunWrite, "record_step", broken)
        with pytest.raises(StorageError, match="disk I/O error"):
            engine.run(engine.registry.get("three", 1), "r", "a")
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
