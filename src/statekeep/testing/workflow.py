"""The conformance suite of the workflow-store contract (:class:`~statekeep.workflow.WorkflowStore`).

The suite drives the store through an :class:`~statekeep.workflow.Engine`, as an
application does, and through the contract's own methods where an invariant is
the store's alone (fencing, claims, retention).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    InvalidInputError,
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
    mail_registry,
    refund_registry,
    step_record,
    three_steps,
    write_a_step_a_call_and_the_end,
)
from statekeep.workflow import (
    Checkpoint,
    Engine,
    LedgerEntry,
    Registry,
    RunContext,
    RunStatus,
    StepRecord,
    WorkflowStore,
    codec,
)
from statekeep.workflow.run_write import now
from statekeep.working import InMemoryWorkingStateStore, WorkingStateStore


class WorkflowStoreSuite:
    """The invariants of a :class:`~statekeep.workflow.WorkflowStore` backend.

    Subclass it as ``Test...`` and define the fixture ``make_store``: a function
    ``make_store()`` that returns a store over this test's data (empty at the
    start of each test); every call within one test must see what stores from
    earlier calls wrote, as a second process would. The suite closes nothing:
    close the stores in the fixture's teardown. Override ``state_store`` to run
    the working-state tests against another working-state backend (by default
    an :class:`~statekeep.working.InMemoryWorkingStateStore`).
    """

    @pytest.fixture
    def make_store(self) -> WorkflowStoreFactory:
        """The backend under test: override this fixture in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must define a make_store fixture")

    @pytest.fixture
    def store(self, make_store: WorkflowStoreFactory) -> WorkflowStore:
        """A store over the test's data."""
        return make_store()

    @pytest.fixture
    def state_store(self) -> WorkingStateStore:
        """The working-state store the engines of the state tests use."""
        return InMemoryWorkingStateStore()

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

    def test_invariant_3_a_call_is_recorded_as_started_before_the_tool_runs_and_never_replayed(
        self, store: WorkflowStore
    ) -> None:
        """A call is in the ledger, with its key and arguments, before the tool runs; replay reuses it."""
        effects: list[str] = []
        before: list[LedgerEntry | None] = []
        engine = Engine(store, mail_registry(effects, spy=lambda: before.append(store.tool_call("r", 2))))
        mail = engine.registry.get("mail", 1)
        assert engine.run(mail, "r", "ada@example.com").output == {"sent": "ada@example.com"}
        (started,) = before
        assert started is not None
        assert (started.key, started.tool, started.status, started.kwargs) == (
            "r/2/0",
            "send_email",
            "started",
            {"to": "ada@example.com"},
        )
        assert started.completed_at is None
        engine.resume("r")
        assert engine.run(mail, "r", "ada@example.com").output == {"sent": "ada@example.com"}
        assert effects == ["r/2/0 ada@example.com"]
        (call,) = store.tool_calls("r")
        assert (call.key, call.status, call.result, call.args) == (
            "r/2/0",
            "completed",
            {"sent": "ada@example.com"},
            [],
        )
        assert call.completed_at is not None
        assert store.tool_call("r", 2) == call
        assert store.tool_call("r", 1) is None

    def test_invariant_3_a_reconciler_settles_an_ambiguous_call_without_re_running_it(
        self, make_store: WorkflowStoreFactory
    ) -> None:
        """A call that happened but never completed is settled by the tool's reconciler, not run again."""
        effects: list[str] = []
        engine = Engine(make_store(), mail_registry(effects, crash=True, reconcile=True))
        with pytest.raises(Crash):
            engine.run(engine.registry.get("mail", 1), "r", "bo@example.com")
        assert [c.status for c in engine.store.tool_calls("r")] == ["started"]
        run = Engine(make_store(), mail_registry(effects, reconcile=True)).resume("r")
        assert (run.status, run.output) == (RunStatus.COMPLETED, {"sent": "bo@example.com"})
        assert effects == ["r/2/0 bo@example.com"]
        assert [c.status for c in engine.store.tool_calls("r")] == ["completed"]

    def test_invariant_3_a_call_the_reconciler_finds_not_done_runs_again_with_its_key(
        self, store: WorkflowStore
    ) -> None:
        """When the reconciler finds no effect, the call runs again, once, with the same idempotency key."""
        effects: list[str] = []
        engine = Engine(store, mail_registry(effects, crash=True, reconcile=True))
        with pytest.raises(Crash):
            engine.run(engine.registry.get("mail", 1), "r", "cy@example.com")
        effects.clear()  # the effect was lost (the provider rolled it back)
        assert engine.resume("r").status is RunStatus.COMPLETED
        assert effects == ["r/2/0 cy@example.com"]

    def test_invariant_3_without_a_reconciler_an_ambiguous_call_waits_for_a_person(
        self, store: WorkflowStore
    ) -> None:
        """Without a reconciler the run waits as needs_decision for a person: no call re-runs blindly."""
        effects: list[str] = []
        engine = Engine(store, mail_registry(effects, crash=True))
        with pytest.raises(Crash):
            engine.run(engine.registry.get("mail", 1), "r", "di@example.com")
        assert engine.resume("r").status is RunStatus.NEEDS_DECISION
        assert engine.resume("r").status is RunStatus.NEEDS_DECISION
        (ask,) = store.approvals(kind="ambiguous")
        assert (ask.run_id, ask.action, ask.status) == ("r", "send_email", "pending")
        assert ask.args == {"args": [], "kwargs": {"to": "di@example.com"}}
        assert "r/2/0" in ask.reason
        assert effects == ["r/2/0 di@example.com"]
        assert store.get("r").lease_owner is None

    def test_a_person_settles_an_ambiguous_call_once(self, store: WorkflowStore) -> None:
        """Reject means it happened (the given result is used), approve means run it again; decided once."""
        for happened in (True, False):
            effects: list[str] = []
            engine = Engine(store, mail_registry(effects, crash=True))
            run_id = f"r-{happened}"
            with pytest.raises(Crash):
                engine.run(engine.registry.get("mail", 1), run_id, "ed@example.com")
            engine.resume(run_id)
            (ask,) = store.approvals(kind="ambiguous", run_id=run_id)
            store.decide(
                ask.approval_id, approve=not happened, by="ops@example.com", result={"sent": "manual"}
            )
            with pytest.raises(ApprovalDecidedError):
                store.decide(ask.approval_id, approve=True, by="someone-else")
            assert store.get(run_id).status is RunStatus.PENDING
            run = engine.resume(run_id)
            assert run.status is RunStatus.COMPLETED
            assert run.output == ({"sent": "manual"} if happened else {"sent": "ed@example.com"})
            assert len(effects) == (1 if happened else 2)
            decided = store.approval(ask.approval_id)
            assert (decided.decided_by, decided.status) == (
                "ops@example.com",
                "rejected" if happened else "approved",
            )

    def test_a_tool_that_raises_leaves_no_started_call(self, store: WorkflowStore) -> None:
        """A tool that raises did not complete: its ledger entry is dropped and the run fails."""
        registry = Registry()

        @registry.tool()
        def refuse(key: str) -> None:
            raise PermissionError("denied")

        @registry.workflow("w", version=1)
        def wf(ctx: RunContext) -> Any:
            return ctx.call_tool(refuse)

        run = Engine(store, registry).run(wf, "r")
        assert run.status is RunStatus.FAILED
        assert "denied" in (run.error or "")
        assert store.tool_calls("r") == []

    # --- approvals -----------------------------------------------------------------------

    def test_invariant_4_a_gate_waits_as_a_row_holding_the_exact_call(self, store: WorkflowStore) -> None:
        """A gated call parks the run, unleased, with a pending approval of its exact arguments."""
        effects: list[str] = []
        engine = Engine(store, refund_registry(effects, {"value": 120}, expires=3600))
        run = engine.run(engine.registry.get("refund", 1), "r", "o-1")
        assert run.status is RunStatus.WAITING_FOR_APPROVAL
        assert run.lease_owner is None
        (ask,) = store.approvals()
        args = {"args": ["o-1", 120], "kwargs": {}}
        assert (ask.run_id, ask.seq, ask.kind, ask.action, ask.args, ask.status) == (
            "r",
            2,
            "gate",
            "refund",
            args,
            "pending",
        )
        assert ask.args_hash == codec.digest(args)
        assert ask.reason == "refunds need a person"
        assert ask.expires_at is not None
        assert ask.decided_at is None
        assert store.approval(ask.approval_id) == ask
        assert store.approval_at("r", 2, "gate") == ask
        assert store.approvals(run_id="other") == []
        assert store.approvals(action="refund", kind="gate") == [ask]
        assert store.approvals(status="approved") == []
        assert engine.resume("r").status is RunStatus.WAITING_FOR_APPROVAL
        assert len(store.approvals(status=None)) == 1  # asked once, however often it resumes
        assert effects == []

    def test_approvals_come_a_page_at_a_time_oldest_first(self, store: WorkflowStore) -> None:
        """Pages of ``limit`` after the last one's id: every approval once, in (creation time, id) order."""
        effects: list[str] = []
        engine = Engine(store, refund_registry(effects, {"value": 120}))
        for i in range(7):
            engine.run(engine.registry.get("refund", 1), f"r{i}", f"o-{i}")
        store.decide(store.approvals(run_id="r3")[0].approval_id, approve=False, by="bob")
        every = store.approvals(status=None)
        assert len(every) == 7
        assert [(a.created_at, a.approval_id) for a in every] == sorted(
            (a.created_at, a.approval_id) for a in every
        )
        pages, after = [], None
        while True:
            page = store.approvals(status=None, limit=3, after=after)
            pages.append(page)
            if len(page) < 3:
                break
            after = page[-1].approval_id
        assert [len(p) for p in pages] == [3, 3, 1]
        assert [a for p in pages for a in p] == every
        rejected = every[3]
        assert store.approvals(after=every[2].approval_id, limit=2) == [every[4], every[5]]  # pending only
        assert store.approvals(status="pending", after=rejected.approval_id) == every[4:]  # need not match
        assert store.approvals(status=None, after=every[-1].approval_id) == []
        with pytest.raises(ApprovalNotFoundError):
            store.approvals(after="no-such-approval")
        for limit in (0, 10_001, True, 2.5, "3"):
            with pytest.raises(InvalidInputError):
                store.approvals(limit=limit)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            store.approvals(after="")

    def test_an_approved_call_runs_once_and_a_decision_is_recorded_once(self, store: WorkflowStore) -> None:
        """After approval the exact call runs once; the decision keeps who and why; deciding again raises."""
        effects: list[str] = []
        engine = Engine(store, refund_registry(effects, {"value": 120}))
        engine.run(engine.registry.get("refund", 1), "r", "o-1")
        (ask,) = store.approvals()
        decided = store.decide(ask.approval_id, approve=True, by="alice@example.com", comment="ok")
        assert (decided.status, decided.decided_by, decided.comment) == (
            "approved",
            "alice@example.com",
            "ok",
        )
        assert decided.decided_at is not None
        with pytest.raises(ApprovalDecidedError):
            store.decide(ask.approval_id, approve=False, by="mallory@example.com")
        assert store.approval(ask.approval_id) == decided
        assert store.approvals() == []
        assert store.get("r").status is RunStatus.PENDING
        run = engine.resume("r")
        assert (run.status, run.output) == (RunStatus.COMPLETED, {"refunded": 120})
        engine.resume("r")
        assert effects == ["r/2/0 o-1 120"]

    def test_a_rejected_or_altered_call_never_runs(self, store: WorkflowStore) -> None:
        """A rejection fails the run naming who rejected; a call unlike the approved one is refused."""
        effects: list[str] = []
        amount = {"value": 120}
        engine = Engine(store, refund_registry(effects, amount))
        refund = engine.registry.get("refund", 1)
        engine.run(refund, "rejected", "o-1")
        engine.run(refund, "altered", "o-2")
        no, yes = store.approvals(run_id="rejected")[0], store.approvals(run_id="altered")[0]
        store.decide(no.approval_id, approve=False, by="bob@example.com", comment="fraud")
        store.decide(yes.approval_id, approve=True, by="alice@example.com")
        run = engine.resume("rejected")
        assert run.status is RunStatus.FAILED
        assert "rejected by bob@example.com: fraud" in (run.error or "")
        amount["value"] = 9999
        run = engine.resume("altered")
        assert run.status is RunStatus.FAILED
        assert "ApprovalMismatchError" in (run.error or "")
        assert effects == []

    def test_an_expired_approval_fails_closed(self, store: WorkflowStore) -> None:
        """A decision after expiry is refused and recorded; a run resumed past expiry fails without acting."""
        effects: list[str] = []
        engine = Engine(store, refund_registry(effects, {"value": 120}, expires=0.3))
        engine.run(engine.registry.get("refund", 1), "r", "o-1")
        engine.run(engine.registry.get("refund", 1), "r2", "o-2")
        time.sleep(0.4)
        (late,) = store.approvals(run_id="r")
        with pytest.raises(ApprovalExpiredError):
            store.decide(late.approval_id, approve=True, by="alice@example.com")
        assert store.approval(late.approval_id).status == "expired"
        assert engine.resume("r").status is RunStatus.FAILED
        run2 = engine.resume("r2")  # never decided: the worker-side check fails it closed as well
        assert run2.status is RunStatus.FAILED
        assert "expired" in (run2.error or "")
        assert store.approvals(run_id="r2", status="expired") != []
        assert effects == []

    def test_ending_a_run_withdraws_its_pending_approvals(self, store: WorkflowStore) -> None:
        """Nobody is asked about an ended run: its approval leaves the queue; a late decision is refused."""
        effects: list[str] = []
        engine = Engine(store, refund_registry(effects, {"value": 120}))
        engine.run(engine.registry.get("refund", 1), "r", "o-1")
        engine.run(engine.registry.get("refund", 1), "other", "o-2")
        ask, keep = store.approvals()
        store.cancel("r")
        assert [a.run_id for a in store.approvals()] == ["other"]
        assert store.approval(ask.approval_id).status == "withdrawn"
        with pytest.raises(ApprovalDecidedError):
            store.decide(ask.approval_id, approve=True, by="alice")
        assert store.approval(keep.approval_id).status == "pending"
        assert effects == []

    # --- waits and events ----------------------------------------------------------------

    def test_invariant_4_a_sleeping_run_is_a_row_that_keeps_its_due_time(self, store: WorkflowStore) -> None:
        """A sleep parks the run unleased; an early resume keeps the due time; once due the run continues."""
        registry = Registry()
        effects: list[str] = []

        @registry.workflow("nap", version=1)
        def nap(ctx: RunContext, seconds: float) -> str:
            ctx.step("before", lambda: effects.append("before"))
            ctx.sleep("nap", seconds)
            ctx.step("after", lambda: effects.append("after"))
            return "rested"

        engine = Engine(store, registry)
        run = engine.run(nap, "r", 1.0)  # room for a loaded machine to park it first
        assert (run.status, run.lease_owner) == (RunStatus.SLEEPING, None)
        assert store.claim("w", 30, 1, registry.runnable()) == []  # not due: no worker takes it
        early = engine.resume("r")
        assert early.status is RunStatus.SLEEPING
        assert early.waiting == run.waiting  # the same due time: the clock did not restart
        due = datetime.fromisoformat((run.waiting or {})["until"])
        time.sleep(max(0.0, (due - now()).total_seconds()) + 0.05)
        assert engine.resume("r").output == "rested"
        assert effects == ["before", "after"]

    def test_an_event_wakes_the_run_waiting_for_it_with_its_payload(self, store: WorkflowStore) -> None:
        """send_event makes a run waiting for that event runnable; it resumes with the payload."""
        engine = Engine(store, three_steps([]))
        assert engine.run(engine.registry.get("waiter", 1), "r").status is RunStatus.WAITING_FOR_EVENT
        store.send_event("r", "other-name", 1)
        assert store.get("r").status is RunStatus.WAITING_FOR_EVENT  # not the event it waits for
        store.send_event("r", "go", {"ticket": 7})
        assert store.get("r").status is RunStatus.PENDING
        assert engine.resume("r").output == {"ticket": 7}

    def test_events_sent_early_are_kept_in_the_mailbox_until_the_run_waits(
        self, store: WorkflowStore
    ) -> None:
        """Events to a live run that is not waiting yet are kept, and each wait consumes the oldest one."""
        registry = Registry()

        @registry.workflow("twice", version=1)
        def twice(ctx: RunContext) -> list[Any]:
            return [ctx.wait_for_event("go"), ctx.wait_for_event("go")]

        engine = Engine(store, registry)
        engine.start(twice, "r")
        store.send_event("r", "go", "first")
        store.send_event("r", "go", "second")
        assert engine.resume("r").output == ["first", "second"]

    def test_events_to_finished_or_unknown_runs_are_refused(self, store: WorkflowStore) -> None:
        """An event to a finished run raises RunFinishedError, to an unknown one RunNotFoundError."""
        engine = Engine(store, three_steps([]))
        engine.run(engine.registry.get("three", 1), "done", "a")
        with pytest.raises(RunFinishedError):
            store.send_event("done", "go")
        with pytest.raises(RunNotFoundError):
            store.send_event("ghost", "go")
        assert store.find("ghost") is None

    # --- retention -----------------------------------------------------------------------

    def test_purge_deletes_finished_runs_with_their_rows_and_never_live_ones(
        self, store: WorkflowStore
    ) -> None:
        """purge deletes finished runs with their journal, ledger and approvals; live runs always stay."""
        effects: list[str] = []
        registry = refund_registry(
            effects, {"value": 1}, registry=mail_registry(effects, registry=three_steps([]))
        )
        engine = Engine(store, registry)
        for i in range(3):
            engine.run(registry.get("mail", 1), f"done-{i}", f"{i}@example.com")
        engine.run(registry.get("refund", 1), "gated", "o-1")
        store.cancel("gated")
        engine.run(registry.get("waiter", 1), "live")
        assert store.purgeable(keep_last=1) == ["done-0", "done-1"]
        assert store.purge(keep_last=1) == 2
        assert [r.run_id for r in store.list_runs()] == ["done-2", "gated", "live"]
        assert (store.steps("done-0"), store.tool_calls("done-0")) == ([], [])
        assert store.delete_runs(["live"]) == 0
        assert store.purge(older_than=timedelta(hours=1)) == 0
        time.sleep(0.05)
        assert store.purge(older_than=timedelta(seconds=0.01)) == 2
        assert [r.run_id for r in store.list_runs()] == ["live"]
        assert store.approvals(status=None) == []
        assert store.get("live").status is RunStatus.WAITING_FOR_EVENT
        store.send_event("live", "go", "still here")
        assert engine.resume("live").output == "still here"
