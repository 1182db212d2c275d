"""The workflow conformance suite, runs, the journal, leases and fencing."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from statekeep.errors import (
    LeaseLostError,
    RunConflictError,
    RunFinishedError,
    RunNotFoundError,
    WorkflowVersionError,
)
from statekeep.testing._workflow_kit import (
    Boom,
    Crash,
    Notes,
    WorkflowStoreFactory,
    child_fields,
    step_record,
    three_steps,
    write_a_step_a_call_and_the_end,
)
from statekeep.workflow import (
    Checkpoint,
    Engine,
    Registry,
    RunContext,
    RunStatus,
    StepRecord,
    WorkflowStore,
)
from statekeep.working import WorkingStateStore


class RunsAndLeases:
    """Runs, the journal, leases and fencing: a part of :class:`WorkflowStoreSuite`."""

    # --- runs and the journal ------------------------------------------------------------

    def test_a_run_executes_each_step_once_and_journals_its_output(self, store: WorkflowStore) -> None:
        """A run executes each step once, journals each output in order and stores the workflow's output."""
        calls: list[str] = []
        engine = Engine(store, three_steps(calls))
        run = engine.run(engine.registry.get("three", 1), "r-1", "a")
        assert (run.status, run.output, run.error) == (RunStatus.COMPLETED, ["A0", "A1", "A2"], None)
        assert calls == ["a0", "a1", "a2"]
        assert [(s.run_id, s.seq, s.name, s.kind, s.value) for s in store.steps("r-1")] == [
            ("r-1", 1, "s0", "step", "A0"),
            ("r-1", 2, "s1", "step", "A1"),
            ("r-1", 3, "s2", "step", "A2"),
        ]
        assert [s.seq for s in store.journal("r-1", 2, 5)] == [2, 3]
        stored = store.get("r-1")
        assert (stored.workflow, stored.version, stored.input) == ("three", 1, {"args": ["a"], "kwargs": {}})
        assert stored.finished_at is not None
        assert stored.created_at.tzinfo is not None
        assert store.checkpoint("r-1") == Checkpoint("r-1", 3, None, None)

    def test_invariant_1_a_completed_step_is_never_re_executed(
        self, make_store: WorkflowStoreFactory
    ) -> None:
        """After a crash inside step 2, a resume replays step 1 from the journal and runs steps 2 and 3."""
        calls: list[str] = []
        engine = Engine(make_store(), three_steps(calls, crash_at="a1"))
        with pytest.raises(Crash):
            engine.run(engine.registry.get("three", 1), "r-1", "a")
        assert [s.name for s in engine.store.steps("r-1")] == ["s0"]
        calls.clear()
        again = Engine(make_store(), three_steps(calls))
        run = again.run(again.registry.get("three", 1), "r-1", "a")
        assert (run.status, run.output) == (RunStatus.COMPLETED, ["A0", "A1", "A2"])
        assert calls == ["a1", "a2"]
        assert [s.name for s in again.store.steps("r-1")] == ["s0", "s1", "s2"]

    def test_invariant_2_resume_needs_only_the_run_id(self, make_store: WorkflowStoreFactory) -> None:
        """resume(run_id) on a fresh store finds the workflow, version and input, and continues."""
        calls: list[str] = []
        engine = Engine(make_store(), three_steps(calls, crash_at="x2"))
        with pytest.raises(Crash):
            engine.run(engine.registry.get("three", 1), "r-2", "x")
        calls.clear()
        run = Engine(make_store(), three_steps(calls)).resume("r-2")
        assert (run.status, run.output, calls) == (RunStatus.COMPLETED, ["X0", "X1", "X2"], ["x2"])

    def test_an_unknown_run_id_is_not_found_and_never_started(self, store: WorkflowStore) -> None:
        """Resuming an id nobody started raises RunNotFoundError and creates nothing."""
        engine = Engine(store, three_steps([]))
        with pytest.raises(RunNotFoundError) as err:
            engine.resume("ghost")
        assert err.value.run_id == "ghost"
        assert store.find("ghost") is None
        with pytest.raises(RunNotFoundError):
            store.get("ghost")
        assert store.list_runs() == []

    def test_a_finished_run_started_again_is_returned_without_running(self, store: WorkflowStore) -> None:
        """The same id and input after completion is a resume: nothing runs again."""
        calls: list[str] = []
        engine = Engine(store, three_steps(calls))
        first = engine.run(engine.registry.get("three", 1), "r", "a")
        again = engine.run(engine.registry.get("three", 1), "r", "a")
        assert (again.status, again.output, len(calls)) == (RunStatus.COMPLETED, first.output, 3)
        assert engine.resume("r").output == first.output
        assert len(store.steps("r")) == 3

    def test_a_run_id_taken_by_another_workflow_or_input_conflicts(self, store: WorkflowStore) -> None:
        """Reusing a run id for another workflow or input raises RunConflictError and writes nothing."""
        registry = three_steps([])
        engine = Engine(store, registry)
        engine.run(registry.get("three", 1), "r", "a")
        with pytest.raises(RunConflictError, match="belongs to workflow 'three'"):
            engine.run(registry.get("waiter", 1), "r")
        with pytest.raises(RunConflictError, match="another input"):
            engine.run(registry.get("three", 1), "r", "b")
        assert store.get("r").input == {"args": ["a"], "kwargs": {}}
        assert len(store.steps("r")) == 3
        assert [r.run_id for r in store.list_runs()] == ["r"]

    def test_list_runs_filters_by_status_workflow_and_parent_oldest_first(self, store: WorkflowStore) -> None:
        """list_runs filters by one or several statuses, workflow and parent, oldest first, up to a limit."""
        registry = three_steps([])
        engine = Engine(store, registry)
        engine.run(registry.get("three", 1), "a", "a")
        engine.start(registry.get("three", 1), "b", "b")
        engine.run(registry.get("waiter", 1), "c")

        def ids(**kw: Any) -> list[str]:
            return [r.run_id for r in store.list_runs(**kw)]

        assert ids() == ["a", "b", "c"]
        assert ids(status="pending") == ["b"]
        assert ids(status=[RunStatus.COMPLETED, "waiting_for_event"]) == ["a", "c"]
        assert ids(workflow="waiter") == ["c"]
        assert ids(parent_id="a") == []
        assert ids(limit=2) == ["a", "b"]
        assert store.get("c").status is RunStatus.WAITING_FOR_EVENT

    def test_search_runs_pages_newest_first_with_counts_per_status(self, store: WorkflowStore) -> None:
        """search_runs filters by status, workflow, owner, text and ids; totals and counts ignore paging."""
        registry = Registry()

        @registry.workflow("greet", owner="who")
        def greet(ctx: RunContext, who: str, text: str) -> str:
            return str(ctx.step("echo", lambda: text))

        @registry.workflow("hold")
        def hold(ctx: RunContext) -> Any:
            return ctx.wait_for_event("go")

        engine = Engine(store, registry)
        engine.run(greet, "g1", "alice", "refund order 4711")
        engine.run(greet, "g2", "bob", "Weather in Oslo")
        engine.run(greet, "g3", "alice", "weather in Bergen")
        engine.run(hold, "h1")

        def ids(**kw: Any) -> list[str]:
            return [r.run_id for r in store.search_runs(**kw).runs]

        assert ids() == ["h1", "g3", "g2", "g1"]
        assert ids(owner="alice") == ["g3", "g1"]
        assert ids(owner=["alice", "bob"], text="WEATHER") == ["g3", "g2"]
        assert ids(text="oslo") == ["g2"]
        assert ids(workflow="hold") == ["h1"]
        assert ids(run_ids=["g1", "h1", "nope"]) == ["h1", "g1"]
        page = store.search_runs(status="completed", limit=2, offset=1)
        assert ([r.run_id for r in page.runs], page.total) == (["g2", "g1"], 3)
        assert page.counts == {"completed": 3, "waiting_for_event": 1}
        assert store.search_runs(text="no such words").total == 0
        assert store.workflow_names() == ["greet", "hold"]

    def test_invariant_5_another_version_without_a_migration_stops_and_is_held_back(
        self, make_store: WorkflowStoreFactory
    ) -> None:
        """Resuming a v1 run under code with only v2 raises naming both; the run is listed as held back."""
        v1 = Registry()

        @v1.workflow("flow", version=1)
        def flow1(ctx: RunContext) -> str:
            ctx.step("a", str, "a")
            raise Crash

        with pytest.raises(Crash):
            Engine(make_store(), v1).run(flow1, "r")
        v2 = Registry()

        @v2.workflow("flow", version=2)
        def flow2(ctx: RunContext) -> str:
            return ctx.step("a", str, "a") + ctx.step("b", str, "b")

        engine = Engine(make_store(), v2)
        with pytest.raises(WorkflowVersionError) as err:
            engine.resume("r")
        assert (err.value.stored, err.value.available) == (1, [2])
        assert [(r.run_id, r.version) for r in engine.held_back()] == [("r", 1)]
        assert [s.name for s in engine.store.steps("r")] == ["a"]

    def test_invariant_5_a_journal_migration_moves_a_run_to_the_new_version(
        self, make_store: WorkflowStoreFactory
    ) -> None:
        """A migration rewrites the journal; the run goes on under the new version and redoes no step."""
        v1 = Registry()

        @v1.workflow("flow", version=1)
        def flow1(ctx: RunContext) -> str:
            ctx.step("fetch", str, "a")
            raise Crash

        with pytest.raises(Crash):
            Engine(make_store(), v1).run(flow1, "r")
        v2 = Registry()
        ran: list[str] = []

        def run_step(name: str, output: str) -> str:
            ran.append(name)
            return output

        @v2.workflow("flow", version=2)
        def flow2(ctx: RunContext) -> str:
            return ctx.step("download", run_step, "download", "new") + ctx.step("b", run_step, "b", "b")

        @v2.migration("flow", from_version=1, to_version=2)
        def rename(journal: list[StepRecord]) -> list[StepRecord]:
            return [dataclasses.replace(s, name="download") if s.name == "fetch" else s for s in journal]

        engine = Engine(make_store(), v2)
        run = engine.resume("r")
        assert (run.status, run.output, run.version, ran) == (RunStatus.COMPLETED, "ab", 2, ["b"])
        assert [s.name for s in engine.store.steps("r")] == ["download", "b"]
        assert engine.held_back() == []

    def test_replay_sees_the_state_of_its_own_position(
        self, make_store: WorkflowStoreFactory, state_store: WorkingStateStore
    ) -> None:
        """Steps commit with their state version and cursor; on replay ctx.state() is that step's version."""
        seen: list[list[str] | None] = []
        armed = [True]
        registry = Registry()

        def boom() -> None:
            if armed.pop() if armed else False:
                raise Crash

        @registry.workflow("walk", version=1, state=Notes)
        def walk(ctx: RunContext) -> int:
            for i in range(3):
                current = ctx.state(Notes)
                seen.append(None if current is None else current.lines)
                ctx.set_state(Notes(lines=[*(current.lines if current else []), str(i)]))
                ctx.set_cursor(10 + i)
                ctx.step(f"s{i}", lambda: None)
            ctx.step("end", boom)
            return 3

        with pytest.raises(Crash):
            Engine(make_store(), registry, state_store=state_store).run(walk, "w")
        first = list(seen)
        seen.clear()
        engine = Engine(make_store(), registry, state_store=state_store)
        assert engine.resume("w").status is RunStatus.COMPLETED
        assert seen == first == [None, ["0"], ["0", "1"]]
        assert [v.version for v in state_store.versions("w")] == [1, 2, 3]
        assert [(s.name, s.state_version, s.cursor) for s in engine.store.steps("w")] == [
            ("s0", 1, 10),
            ("s1", 2, 11),
            ("s2", 3, 12),
            ("end", None, None),
        ]
        assert engine.store.checkpoint("w") == Checkpoint("w", 4, 3, 12)

    # --- leases and fencing --------------------------------------------------------------

    def test_a_stale_lease_epoch_is_fenced_and_writes_nothing(self, store: WorkflowStore) -> None:
        """Once a run is taken over, its old holder's fenced writes raise LeaseLostError and write nothing."""
        calls: list[str] = []
        engine = Engine(store, three_steps(calls))
        engine.start(engine.registry.get("three", 1), "r", "a")
        stale = store.acquire("r", "worker-a", 30)
        assert stale is not None
        live = store.acquire("r", "worker-b", 30)
        assert live is not None
        assert (live.epoch, live.lease_owner, live.status) == (stale.epoch + 1, "worker-b", RunStatus.RUNNING)
        with pytest.raises(LeaseLostError) as err:
            write_a_step_a_call_and_the_end(store, stale)
        assert (err.value.run_id, err.value.epoch) == ("r", stale.epoch)
        with pytest.raises(LeaseLostError):
            engine.execute(stale)  # a stale worker's steps may run, but never commit
        assert (store.steps("r"), store.tool_calls("r")) == ([], [])
        after = store.get("r")
        assert (after.status, after.last_seq, after.epoch, after.output) == (
            RunStatus.RUNNING,
            0,
            live.epoch,
            None,
        )
        assert store.heartbeat("r", stale.epoch, 30) is False
        assert store.heartbeat("r", live.epoch, 30) is True
        with store.fenced(live) as tx:
            tx.record_step(step_record("r", 1, "s0", "A0"))
        assert [s.name for s in store.steps("r")] == ["s0"]
        assert store.checkpoint("r").last_seq == 1

    def test_extend_lease_keeps_a_lapsed_run_for_its_holder_under_the_epoch(
        self, store: WorkflowStore
    ) -> None:
        """A holder whose lease lapsed leases the run again (no claim takes it); a stale one cannot."""
        engine = Engine(store, three_steps([]))
        engine.start(engine.registry.get("three", 1), "r", "a")
        held = store.acquire("r", "worker-a", 0.05)
        assert held is not None
        time.sleep(0.1)  # the lease lapses: any worker's claim would take the run now
        with store.fenced(held) as tx:
            tx.extend_lease(60)
        assert store.claim("worker-b", 30, 10, [("three", 1)]) == []
        assert store.get("r").lease_owner == "worker-a"
        live = store.acquire("r", "worker-b", 30)  # a person's explicit takeover
        assert live is not None
        with pytest.raises(LeaseLostError), store.fenced(held) as tx:
            tx.extend_lease(60)
        after = store.get("r")
        assert (after.epoch, after.lease_owner) == (live.epoch, "worker-b")

    def test_a_fenced_transaction_that_raises_writes_nothing(self, store: WorkflowStore) -> None:
        """Everything written in one fenced transaction commits together, or nothing does."""
        engine = Engine(store, three_steps([]))
        engine.start(engine.registry.get("three", 1), "r", "a")
        live = store.acquire("r", "worker-a", 30)
        assert live is not None
        with pytest.raises(Boom):
            write_a_step_a_call_and_the_end(store, live, then_fail=True)
        assert (store.steps("r"), store.tool_calls("r")) == ([], [])
        after = store.get("r")
        assert (after.status, after.last_seq, after.output, after.finished_at) == (
            RunStatus.RUNNING,
            0,
            None,
            None,
        )
        assert engine.execute(live).output == ["A0", "A1", "A2"]  # the holder itself is still current

    def test_a_stale_parent_holder_can_neither_create_nor_take_its_child(self, store: WorkflowStore) -> None:
        """open_run and acquire with a parent whose epoch is stale raise LeaseLostError and write nothing."""
        engine = Engine(store, three_steps([]))
        engine.start(engine.registry.get("three", 1), "p", "a")
        stale = store.acquire("p", "worker-a", 30)
        assert stale is not None
        live = store.acquire("p", "worker-b", 30)
        assert live is not None
        with pytest.raises(LeaseLostError):
            store.open_run(child_fields("p"), parent=stale)
        assert store.find("kid-1") is None
        kid = store.open_run(child_fields("p"), parent=live)
        assert (kid.parent_id, kid.status, kid.epoch) == ("p", RunStatus.PENDING, 0)
        with pytest.raises(LeaseLostError):
            store.acquire("kid-1", "worker-a", 30, parent=stale)
        assert store.get("kid-1").epoch == 0  # untouched by the stale holder
        taken = store.acquire("kid-1", "worker-b", 30, parent=live)
        assert taken is not None
        assert (taken.epoch, taken.lease_owner) == (1, "worker-b")
        assert [r.run_id for r in store.list_runs(parent_id="p")] == ["kid-1"]

    def test_claims_hand_each_runnable_run_to_one_worker_only(self, store: WorkflowStore) -> None:
        """Concurrent claims never return one run twice, and skip leased, waiting and unknown-version runs."""
        registry = three_steps([])
        engine = Engine(store, registry)
        three = registry.get("three", 1)
        ids = [f"run-{i}" for i in range(6)]
        for run_id in ids:
            engine.start(three, run_id, run_id)
        engine.start(three, "leased", "x")
        assert store.acquire("leased", "holder", 30) is not None
        assert engine.run(registry.get("waiter", 1), "waiting").status is RunStatus.WAITING_FOR_EVENT
        claimed: list[str] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(3)

        def worker(name: str) -> None:
            barrier.wait()
            try:
                while runs := store.claim(name, 30, 1, registry.runnable()):
                    claimed.extend(r.run_id for r in runs)
                    assert all((r.lease_owner, r.status) == (name, RunStatus.RUNNING) for r in runs)
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        claimed += [r.run_id for r in store.claim("late", 30, 10, registry.runnable())]
        assert sorted(claimed) == ids  # every runnable run, each exactly once
        assert store.claim("late", 30, 10, registry.runnable()) == []
        engine.start(three, "new", "n")
        assert store.claim("other", 30, 10, [("three", 2)]) == []
        (got,) = store.claim("w9", 30, 10, [("three", 1)])
        assert (got.run_id, got.epoch, got.lease_owner) == ("new", 1, "w9")

    def test_cancel_revokes_a_live_run_and_refuses_a_finished_one(self, store: WorkflowStore) -> None:
        """cancel() ends a live run and fences its holder; cancelling an ended run raises RunFinishedError."""
        calls: list[str] = []
        engine = Engine(store, three_steps(calls))
        engine.start(engine.registry.get("three", 1), "r", "a")
        held = store.acquire("r", "worker-a", 30)
        assert held is not None
        cancelled = store.cancel("r")
        assert cancelled.status is RunStatus.CANCELLED
        assert cancelled.finished_at is not None
        with pytest.raises(LeaseLostError), store.fenced(held) as tx:
            tx.record_step(step_record("r", 1, "s0", "A0"))
        assert engine.resume("r").status is RunStatus.CANCELLED
        assert (calls, store.steps("r")) == ([], [])
        with pytest.raises(RunFinishedError):
            store.cancel("r")
        with pytest.raises(RunNotFoundError):
            store.cancel("ghost")

    def test_child_runs_are_linked_and_a_finished_child_wakes_its_parent(self, store: WorkflowStore) -> None:
        """A parent waits for a waiting child as a row; the child's completion makes the parent runnable."""
        registry = Registry()

        @registry.workflow("kid", version=1)
        def kid(ctx: RunContext) -> Any:
            return ctx.wait_for_event("go")

        @registry.workflow("parent", version=1)
        def parent(ctx: RunContext) -> str:
            return "kid said " + str(ctx.child(kid, "kid-1"))

        engine = Engine(store, registry)
        assert engine.run(parent, "p").status is RunStatus.WAITING_FOR_CHILD
        child = store.get("kid-1")
        assert (child.status, child.parent_id) == (RunStatus.WAITING_FOR_EVENT, "p")
        store.send_event("kid-1", "go", "hello")
        assert engine.resume("kid-1").status is RunStatus.COMPLETED
        assert store.get("p").status is RunStatus.PENDING  # woken by the child's completion
        assert engine.resume("p").output == "kid said hello"
        assert [(s.kind, s.value) for s in store.steps("p")] == [("child", "hello")]

    def test_a_cancelled_child_wakes_its_parent_which_sees_the_cancellation(
        self, store: WorkflowStore
    ) -> None:
        """Cancelling a child a parent waits for makes the parent runnable; it fails, naming the child."""
        registry = Registry()

        @registry.workflow("kid", version=1)
        def kid(ctx: RunContext) -> Any:
            return ctx.wait_for_event("go")

        @registry.workflow("parent", version=1)
        def parent(ctx: RunContext) -> str:
            return "kid said " + str(ctx.child(kid, "kid-1"))

        engine = Engine(store, registry)
        assert engine.run(parent, "p").status is RunStatus.WAITING_FOR_CHILD
        store.cancel("kid-1")
        assert store.get("p").status is RunStatus.PENDING  # not parked forever
        failed = engine.resume("p")
        assert failed.status is RunStatus.FAILED
        assert "child run 'kid-1' ended cancelled" in (failed.error or "")
