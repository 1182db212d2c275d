"""The tool-call ledger: keys, exactly-once replay, reconcilers, and ambiguous calls sent to a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekeep.errors import ApprovalDecidedError, InvalidInputError
from statekeep.workflow import LedgerEntry, Reconciliation, Registry, RunContext, RunStatus

from .conftest import EngineFactory, append, lines


class Crash(BaseException):
    """Stands in for a process dying between a tool's effect and its completion."""


def ledger_registry(effects: Path, *, crash: list[bool], reconcile: bool) -> Registry:
    registry = Registry()

    def reconciler(call: LedgerEntry) -> Reconciliation:
        done = [ln for ln in lines(effects) if ln.startswith(call.key + " ")]
        return Reconciliation(True, {"sent": call.kwargs["to"]}) if done else Reconciliation(False)

    @registry.tool("send_email", reconciler=reconciler if reconcile else None)
    def send_email(key: str, *, to: str) -> dict[str, str]:
        append(effects, f"{key} {to}")
        if crash and crash.pop():
            raise Crash
        return {"sent": to}

    @registry.workflow("mail", version=1)
    def mail(ctx: RunContext, to: str) -> dict[str, str]:
        ctx.step("prepare", str, to)
        return ctx.call_tool(send_email, to=to)

    return registry


def test_invariant_3_tool_gets_a_stable_key_and_never_runs_on_replay(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """The key is run/step/call index; a completed call is replayed from the journal, not re-sent."""
    effects = tmp_path / "effects"
    engine = make_engine(ledger_registry(effects, crash=[], reconcile=False))
    mail = engine.registry.get("mail", 1)
    assert engine.run(mail, "r", "ada@example.com").output == {"sent": "ada@example.com"}
    engine.resume("r")
    assert lines(effects) == ["r/2/0 ada@example.com"]
    (call,) = engine.store.tool_calls("r")
    assert (call.key, call.status, call.result, call.kwargs) == (
        "r/2/0",
        "completed",
        {"sent": "ada@example.com"},
        {"to": "ada@example.com"},
    )


def test_invariant_3_reconciler_settles_an_ambiguous_call_without_resending(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """A call that happened but was never completed is settled by the reconciler, not re-run."""
    effects = tmp_path / "effects"
    engine = make_engine(ledger_registry(effects, crash=[True], reconcile=True))
    mail = engine.registry.get("mail", 1)
    with pytest.raises(Crash):
        engine.run(mail, "r", "bo@example.com")
    assert engine.store.tool_calls("r")[0].status == "started"
    run = engine.resume("r")
    assert (run.status, run.output) == (RunStatus.COMPLETED, {"sent": "bo@example.com"})
    assert lines(effects) == ["r/2/0 bo@example.com"]


def test_invariant_3_reconciler_saying_not_happened_reruns_with_the_same_key(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """When the reconciler finds no effect, the call runs again with the same idempotency key."""
    effects = tmp_path / "effects"
    registry = ledger_registry(effects, crash=[True], reconcile=True)
    engine = make_engine(registry)
    with pytest.raises(Crash):
        engine.run(registry.get("mail", 1), "r", "cy@example.com")
    effects.write_text("")  # the effect was lost (e.g. the provider rolled it back)
    assert engine.resume("r").status is RunStatus.COMPLETED
    assert lines(effects) == ["r/2/0 cy@example.com"]


def test_invariant_3_without_reconciler_an_ambiguous_call_waits_for_a_person(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """No reconciler: the run stops as needs_decision with the call shown; it is never re-run blindly."""
    effects = tmp_path / "effects"
    engine = make_engine(ledger_registry(effects, crash=[True], reconcile=False))
    with pytest.raises(Crash):
        engine.run(engine.registry.get("mail", 1), "r", "di@example.com")
    run = engine.resume("r")
    assert run.status is RunStatus.NEEDS_DECISION
    assert engine.resume("r").status is RunStatus.NEEDS_DECISION
    (ask,) = engine.store.approvals(kind="ambiguous")
    assert (ask.run_id, ask.action, ask.args) == (
        "r",
        "send_email",
        {"args": [], "kwargs": {"to": "di@example.com"}},
    )
    assert "r/2/0" in ask.reason
    assert lines(effects) == ["r/2/0 di@example.com"]


@pytest.mark.parametrize("happened", [True, False])
def test_a_person_settles_an_ambiguous_call(
    make_engine: EngineFactory, tmp_path: Path, happened: bool
) -> None:
    """Reject means it happened (the given result is used); approve means run it once more."""
    effects = tmp_path / "effects"
    engine = make_engine(ledger_registry(effects, crash=[True], reconcile=False))
    with pytest.raises(Crash):
        engine.run(engine.registry.get("mail", 1), "r", "ed@example.com")
    engine.resume("r")
    (ask,) = engine.store.approvals(kind="ambiguous")
    engine.store.decide(
        ask.approval_id, approve=not happened, by="ops@example.com", result={"sent": "manual"}
    )
    with pytest.raises(ApprovalDecidedError):
        engine.store.decide(ask.approval_id, approve=True, by="someone-else")
    run = engine.resume("r")
    assert run.status is RunStatus.COMPLETED
    assert run.output == ({"sent": "manual"} if happened else {"sent": "ed@example.com"})
    assert len(lines(effects)) == (1 if happened else 2)


def test_a_tool_that_raises_fails_the_run_and_leaves_no_started_call(make_engine: EngineFactory) -> None:
    """A tool that raises reported that it did not complete: the ledger entry is dropped, the run fails."""
    registry = Registry()

    @registry.tool()
    def refuse(key: str) -> None:
        raise PermissionError("denied")

    @registry.workflow("w", version=1)
    def wf(ctx: RunContext) -> Any:
        return ctx.call_tool(refuse)

    engine = make_engine(registry)
    run = engine.run(wf, "r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "denied" in run.error
    assert engine.store.tool_calls("r") == []


def test_non_json_tool_arguments_are_refused_before_the_call(make_engine: EngineFactory) -> None:
    """Arguments that cannot be recorded exactly raise InvalidInputError; the tool never runs."""
    registry = Registry()
    ran: list[int] = []

    @registry.tool()
    def t(key: str, value: Any) -> None:
        ran.append(1)

    @registry.workflow("w", version=1)
    def wf(ctx: RunContext) -> Any:
        return ctx.call_tool(t, object())

    engine = make_engine(registry)
    with pytest.raises(InvalidInputError, match="not JSON"):
        engine.run(wf, "r")
    assert (ran, engine.store.tool_calls("r")) == ([], [])
