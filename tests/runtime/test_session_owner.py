"""Invariant 8: a context session belongs to one owner; no run of another owner reads or appends to it."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from statekeep.cli import main
from statekeep.config import Settings
from statekeep.context import Message, SQLContextStore
from statekeep.context import sql as context_sql
from statekeep.errors import RunNotFoundError, SessionOwnerError, StateNotFoundError
from statekeep.models import ModelResponse, ScriptedModel
from statekeep.runtime import Agent, AgentState, Runtime
from statekeep.workflow import RunStatus
from tests.runtime.conftest import terminal_width

CHAT = Agent("chat", system="You chat.", tools=[], memory_k=0)
SECRET = "My PIN is 4711."


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel([ModelResponse("noted")])


@pytest.fixture
def rt(settings: Settings, model: ScriptedModel) -> Iterator[Runtime]:
    runtime = Runtime.open(settings, model=model)
    runtime.register(CHAT)
    yield runtime
    runtime.close()


def _alice_told_a_secret(rt: Runtime, model: ScriptedModel, session: str = "s") -> list[object]:
    run = rt.run(CHAT, "a-1", owner="alice", task=SECRET, session_id=session)
    assert run.status is RunStatus.COMPLETED
    model.calls.clear()
    return list(rt.context.events(session))


def _nothing_written_for(rt: Runtime, run_id: str) -> None:
    with pytest.raises(RunNotFoundError):
        rt.engine.store.get(run_id)
    with pytest.raises(StateNotFoundError):
        rt.working.load(run_id, AgentState)


def _refused(info: pytest.ExceptionInfo[SessionOwnerError], session: str = "s") -> None:
    assert (info.value.session_id, info.value.owner, info.value.actual_owner) == (session, "bob", "alice")
    assert "'alice'" in str(info.value)
    assert "'bob'" in str(info.value)


def test_invariant_8_a_run_of_another_owner_on_a_session_is_refused_and_writes_nothing(
    rt: Runtime, model: ScriptedModel
) -> None:
    """Bob's run with alice's session id: SessionOwnerError, no run, no state, no event, no model call."""
    before = _alice_told_a_secret(rt, model)
    with pytest.raises(SessionOwnerError) as info:
        rt.run(CHAT, "b-1", owner="bob", task="What is my PIN?", session_id="s")
    _refused(info)
    assert rt.context.events("s") == before
    assert model.calls == []
    _nothing_written_for(rt, "b-1")
    with pytest.raises(SessionOwnerError):
        rt.start(CHAT, "b-2", owner="bob", task="What is my PIN?", session_id="s")
    _nothing_written_for(rt, "b-2")
    assert rt.context.owner_of("s") == "alice"
    assert rt.context.sessions_of("bob") == []


def test_the_default_session_is_the_run_id_and_is_claimed_by_its_run(
    rt: Runtime, model: ScriptedModel
) -> None:
    """A run without a session id uses its run id; another owner naming that session is refused."""
    rt.run(CHAT, "a-1", owner="alice", task=SECRET)
    assert rt.context.owner_of("a-1") == "alice"
    with pytest.raises(SessionOwnerError):
        rt.run(CHAT, "b-1", owner="bob", task="What is my PIN?", session_id="a-1")
    assert len(rt.context.events("a-1")) == 2
    rt.run(CHAT, "a-2", owner="alice", task="And again?", session_id="a-1")  # the owner may continue it
    assert len(rt.context.events("a-1")) == 4
    assert SECRET in str(model.calls[-1])


def _bob_run_recorded_without_a_claim(rt: Runtime) -> None:
    """A run on alice's session that no entry point checked (as one recorded before owners were)."""
    workflow = rt.register(CHAT)
    rt.engine.start(workflow, "b-1", "bob", "s", "What is my PIN?")


def test_resuming_a_run_of_another_owner_on_the_session_is_refused_and_writes_nothing(
    rt: Runtime, model: ScriptedModel
) -> None:
    """resume(run id) claims the run's session for the run's owner before executing anything."""
    before = _alice_told_a_secret(rt, model)
    _bob_run_recorded_without_a_claim(rt)
    with pytest.raises(SessionOwnerError) as info:
        rt.resume("b-1")
    _refused(info)
    run = rt.engine.store.get("b-1")
    assert run.status is RunStatus.PENDING
    assert rt.engine.store.steps("b-1") == []
    with pytest.raises(StateNotFoundError):
        rt.working.load("b-1", AgentState)
    assert rt.context.events("s") == before
    assert model.calls == []


def test_a_worker_fails_a_run_of_another_owner_before_it_reads_the_session(
    rt: Runtime, model: ScriptedModel
) -> None:
    """The steps claim the session too: a worker's run of bob on alice's session fails, naming both."""
    before = _alice_told_a_secret(rt, model)
    _bob_run_recorded_without_a_claim(rt)
    assert rt.worker().run_once() == 1
    run = rt.engine.store.get("b-1")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "SessionOwnerError" in run.error
    assert "'alice'" in run.error
    assert "'bob'" in run.error
    assert rt.engine.store.steps("b-1") == []
    assert rt.context.events("s") == before
    assert model.calls == []


def _forget_owners(rt: Runtime) -> None:
    """Make the context store look as a version-1 database does after the upgrade: no owners."""
    assert isinstance(rt.context, SQLContextStore)
    with rt.context.db.begin() as conn:
        conn.execute(sa.update(context_sql.sessions).values(owner=None))


def test_a_session_from_before_owners_goes_to_the_owner_of_its_first_run(
    settings: Settings, model: ScriptedModel
) -> None:
    """After the upgrade, an unowned session goes to its first run's owner, not to whoever comes first."""
    with Runtime.open(settings, model=model) as rt:
        before = _alice_told_a_secret(rt, model)
        rt.context.append("no-runs", Message.user(SECRET))  # written by the store alone, never by a run
        _forget_owners(rt)
        assert rt.context.owner_of("s") is None
    with Runtime.open(settings, model=model) as rt:  # a new process: nothing cached
        with pytest.raises(SessionOwnerError) as info:
            rt.run(CHAT, "b-1", owner="bob", task="What is my PIN?", session_id="s")
        _refused(info)
        assert rt.context.owner_of("s") == "alice"
        assert rt.context.events("s") == before
        _nothing_written_for(rt, "b-1")
        rt.run(CHAT, "b-2", owner="bob", task="Hello", session_id="no-runs")  # no run: the first claimer
        assert rt.context.owner_of("no-runs") == "bob"
        model.calls.clear()
        rt.run(CHAT, "a-2", owner="alice", task="Still there?", session_id="s")
        assert len(rt.context.events("s")) == 4
        assert SECRET in str(model.calls[0])  # alice's own conversation, to alice


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["statekeep", *args])
    terminal_width(monkeypatch, 250)
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_context_show_names_the_owner_and_refuses_another(
    rt: Runtime,
    model: ScriptedModel,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """statekeep context show prints the session's owner; with --owner of someone else it shows nothing."""
    _alice_told_a_secret(rt, model)
    base = ("--database-url", settings.database_url, "--home", str(settings.home))
    code, out = _cli(monkeypatch, capsys, "context", "show", "s", *base)
    assert code == 0
    assert "owner: alice" in out
    assert SECRET in out
    code, out = _cli(monkeypatch, capsys, "context", "show", "s", "--owner", "alice", *base)
    assert code == 0
    assert SECRET in out
    code, out = _cli(monkeypatch, capsys, "context", "show", "s", "--owner", "bob", *base)
    assert code == 1
    assert SECRET not in out
    assert out.strip() == "error: session 's' belongs to owner 'alice', not to owner 'bob'"
