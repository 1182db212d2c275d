"""The workflow conformance suite, the tool-call ledger, approvals, waits and retention."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from statekeep.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    InvalidInputError,
    RunFinishedError,
    RunNotFoundError,
)
from statekeep.testing._workflow_kit import (
    Crash,
    WorkflowStoreFactory,
    mail_registry,
    refund_registry,
    three_steps,
)
from statekeep.workflow import (
    Engine,
    LedgerEntry,
    Registry,
    RunContext,
    RunStatus,
    WorkflowStore,
    codec,
)
from statekeep.workflow.run_write import now


class CallsAndWaits:
    """The tool-call ledger, approvals, waits and retention: a part of :class:`WorkflowStoreSuite`."""

    # --- the tool-call ledger ------------------------------------------------------------

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
