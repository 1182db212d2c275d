"""The statekeep command line, every command, on both backends; failures are one line, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from statekeep.cli import main
from statekeep.config import Settings
from statekeep.runtime import Runtime
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, Worker
from tests.runtime import agent_app
from tests.runtime.conftest import ROOT, subprocess_env, terminal_width


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run ``statekeep ARGS`` in this process against the test's stores; return (exit code, output)."""
    monkeypatch.setenv("STATEKEEP_HOME", str(settings.home))
    monkeypatch.setenv("STATEKEEP_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("STATEKEEP_MEMORY_URL", settings.memory_url)
    terminal_width(monkeypatch, 250)

    def run(*args: str, stdin: str | None = None) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["statekeep", *args])
        if stdin is not None:
            import io

            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out + out.err

    return run


@pytest.fixture
def waiting_run(runtime: Runtime) -> str:
    """A run parked at its approval gate."""
    runtime.run(agent_app.AGENT, "cli-run", owner=agent_app.OWNER, task="Plan a trip")
    return "cli-run"


def test_runs_list_show_events(cli, waiting_run: str) -> None:  # type: ignore[no-untyped-def]
    """runs list/show/events show the run, its status and its timeline."""
    code, out = cli("runs", "list")
    assert code == 0
    assert waiting_run in out
    assert "waiting_for_approval" in out
    code, out = cli("runs", "list", "--status", "completed")
    assert waiting_run not in out
    code, out = cli("runs", "show", waiting_run)
    assert code == 0
    assert "agent.trip" in out
    code, out = cli("runs", "events", waiting_run)
    assert code == 0
    assert "model-0" in out
    assert "lookup" in out
    assert "approval" in out


def test_approvals_need_an_approver_and_resume_the_run(cli, waiting_run: str, runtime: Runtime) -> None:  # type: ignore[no-untyped-def]
    """approvals approve requires --by; once approved, the run finishes on resume."""
    code, out = cli("approvals", "list")
    assert code == 0
    [approval] = runtime.engine.store.approvals(run_id=waiting_run)
    assert approval.approval_id in out
    code, out = cli("approvals", "approve", approval.approval_id)
    assert code != 0
    assert "--by" in out
    code, out = cli("approvals", "approve", approval.approval_id, "--by", "boss@example.com")
    assert code == 0
    assert "approved" in out
    code, out = cli("approvals", "reject", approval.approval_id, "--by", "boss@example.com")
    assert code == 1
    assert "Traceback" not in out
    assert len(out.strip().splitlines()) == 1
    assert runtime.resume(waiting_run).status == "completed"


def test_approvals_list_a_page_at_a_time(cli, runtime: Runtime) -> None:  # type: ignore[no-untyped-def]
    """--limit and --after read the approvals in pages, oldest first; a full page names the next;
    a bad limit or an unknown id is one line."""
    for n in range(3):
        runtime.run(agent_app.AGENT, f"cli-page-{n}", owner=agent_app.OWNER, task="Plan a trip")
    every = [a.approval_id for a in runtime.engine.store.approvals(status="pending")]
    assert len(every) == 3
    code, out = cli("approvals", "list", "--limit", "2", "--json")
    assert code == 0
    assert [a["approval_id"] for a in json.loads(out)] == every[:2]
    code, out = cli("approvals", "list", "--limit", "2")
    assert f"next page: --after {every[1]}" in out
    code, out = cli("approvals", "list", "--limit", "2", "--after", every[1], "--json")
    assert [a["approval_id"] for a in json.loads(out)] == every[2:]
    code, out = cli("approvals", "list", "--limit", "2", "--after", every[1])
    assert every[2] in out
    assert "next page" not in out
    code, out = cli("approvals", "list", "--json")
    assert [a["approval_id"] for a in json.loads(out)] == every  # every one unless --limit
    for bad, says in ((["--limit", "0"], "limit"), (["--after", "no-such-approval"], "no-such-approval")):
        code, out = cli("approvals", "list", *bad)
        assert code != 0
        assert says in out
        assert "Traceback" not in out
        assert len(out.strip().splitlines()) == 1


def test_reject_records_who_rejected(cli, waiting_run: str, runtime: Runtime) -> None:  # type: ignore[no-untyped-def]
    """approvals reject records the decision and its author."""
    [approval] = runtime.engine.store.approvals(run_id=waiting_run)
    code, _ = cli("approvals", "reject", approval.approval_id, "--by", "boss@example.com", "--comment", "no")
    assert code == 0
    assert runtime.engine.store.approval(approval.approval_id).decided_by == "boss@example.com"


def test_runs_cancel(cli, waiting_run: str, runtime: Runtime) -> None:  # type: ignore[no-untyped-def]
    """runs cancel cancels a live run; cancelling again fails with one line."""
    code, _ = cli("runs", "cancel", waiting_run)
    assert code == 0
    assert runtime.engine.store.get(waiting_run).status == "cancelled"
    code, out = cli("runs", "cancel", waiting_run)
    assert code == 1
    assert len(out.strip().splitlines()) == 1


def test_runs_retry_revives_a_failed_run_and_show_prints_its_usage(cli, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """runs show prints the tokens of the run's model calls; runs retry makes a failed run pending for
    a worker, after its last completed step; retrying a run that did not fail is one line, exit 1."""
    from statekeep.memory import FakeEmbedder
    from statekeep.models import ModelResponse, ScriptedModel
    from statekeep.runtime import Agent

    answers = [ModelResponse(content="hello", input_tokens=120, output_tokens=8, cached_tokens=100)]

    def model(messages: object) -> ModelResponse:
        if not answers:
            raise ValueError("the model rejected the request")  # permanent: the run fails at once
        return answers.pop()

    rt = Runtime.open(settings, model=ScriptedModel(model), embedder=FakeEmbedder())
    agent = Agent("hello", system="s", tools=[], memory_k=0)
    try:
        assert rt.run(agent, "good", owner="ada", task="hi").status == "completed"
        assert rt.run(agent, "bad", owner="ada", task="hi").status == "failed"
        code, out = cli("runs", "show", "good")
        assert code == 0
        assert "120 prompt (100 cached) + 8 completion tokens in 1 model call(s)" in out
        code, out = cli("runs", "retry", "bad")
        assert code == 0
        assert "pending" in out
        assert rt.engine.store.get("bad").status == "pending"
        answers.append(ModelResponse(content="hello again"))
        assert rt.resume("bad").output == "hello again"
        code, out = cli("runs", "retry", "good")
        assert code == 1
        assert "only a failed run" in out
        assert len(out.strip().splitlines()) == 1
    finally:
        rt.close()


def test_memory_add_search_export_forget(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """memory add/search/export/forget round-trip; forget asks first unless --yes."""
    code, _ = cli("memory", "add", "ada", "Ada takes her coffee black", "--tag", "coffee")
    assert code == 0
    code, out = cli("memory", "search", "ada", "how does Ada drink coffee?")
    assert code == 0
    assert "Ada takes her coffee black" in out
    assert "user_supplied" in out
    code, out = cli("memory", "search", "bob", "coffee")
    assert "Ada takes" not in out
    code, _ = cli("memory", "export", "ada", "--out", str(tmp_path / "ada.json"))
    assert code == 0
    assert json.loads((tmp_path / "ada.json").read_text())
    assert (tmp_path / "ada.json").stat().st_mode & 0o777 == 0o600  # a person's data: the user's alone
    (tmp_path / "ada.json").write_text("kept")
    code, out = cli("memory", "export", "ada", "--out", str(tmp_path / "ada.json"))
    assert code != 0
    assert "--force" in out
    assert (tmp_path / "ada.json").read_text() == "kept"
    (tmp_path / "ada.json").chmod(0o644)
    code, _ = cli("memory", "export", "ada", "--out", str(tmp_path / "ada.json"), "--force")
    assert code == 0
    assert json.loads((tmp_path / "ada.json").read_text())["owner"] == "ada"
    assert (tmp_path / "ada.json").stat().st_mode & 0o777 == 0o600
    (tmp_path / "ada.json").unlink()
    (tmp_path / "shared.txt").write_text("someone else's file")
    (tmp_path / "shared.txt").chmod(0o644)
    (tmp_path / "ada.json").symlink_to(tmp_path / "shared.txt")
    code, _ = cli("memory", "export", "ada", "--out", str(tmp_path / "ada.json"), "--force")
    assert code == 0
    assert (tmp_path / "shared.txt").read_text() == "someone else's file"  # replaced, not followed
    assert (tmp_path / "shared.txt").stat().st_mode & 0o777 == 0o644
    assert not (tmp_path / "ada.json").is_symlink()
    assert json.loads((tmp_path / "ada.json").read_text())["owner"] == "ada"
    assert (tmp_path / "ada.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []
    code, out = cli("memory", "forget", "ada", stdin="n\n")
    assert code == 1
    code, out = cli("memory", "search", "ada", "coffee")
    assert "Ada takes" in out  # nothing erased without confirmation
    code, out = cli("memory", "forget", "ada", "--yes")
    assert code == 0
    assert '"removed": 1' in out
    code, out = cli("memory", "search", "ada", "coffee")
    assert "Ada takes" not in out


def test_context_show_reports_tokens_per_section(cli, waiting_run: str) -> None:  # type: ignore[no-untyped-def]
    """context show prints what the next model call would see, with tokens per section."""
    code, out = cli("context", "show", waiting_run, "--budget", "4000", "--system", "You plan trips.")
    assert code == 0
    for section in ("system", "pinned", "memories", "summary", "window"):
        assert section in out
    assert "Plan a trip" in out


def test_db_upgrade_is_idempotent(cli) -> None:  # type: ignore[no-untyped-def]
    """db upgrade creates every SQL store's tables, and a second run changes nothing."""
    for _ in range(2):
        code, out = cli("db", "upgrade")
        assert code == 0
        assert "workflow: up to date" in out


def test_worker_finishes_an_approved_run(cli, waiting_run: str, runtime: Runtime) -> None:  # type: ignore[no-untyped-def]
    """statekeep worker --app claims the approved run and finishes it, then exits when idle."""
    [approval] = runtime.engine.store.approvals(run_id=waiting_run)
    runtime.engine.store.decide(approval.approval_id, approve=True, by="boss@example.com")
    runtime.close()  # a LanceDB memory folder has one writer at a time: the worker's turn now
    code, out = cli("worker", "--app", "tests.runtime.agent_app:build_runtime", "--idle-exit", "0.5")
    assert code == 0
    assert "handled 1 runs" in out
    run = runtime.engine.store.get(waiting_run)
    assert run.status == "completed", run.error


def test_approving_from_the_cli_keeps_a_hand_built_engines_run_readable(cli, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """An owned run of a keyless Engine, approved by the CLI (which has the home's keys), completes."""
    shipped: list[str] = []
    registry = Registry()

    @registry.tool("ship")
    def ship(key: str, customer: str) -> str:
        shipped.append(customer)
        return "shipped"

    @registry.workflow("order", version=1, owner="customer")
    def order(ctx: RunContext, customer: str) -> str:
        return ctx.call_tool(ship.requiring_approval("shipping needs a person"), customer)

    engine = Engine(settings.url_for("workflow"), registry)
    assert engine.run(order, "order-1", "ada").status is RunStatus.WAITING_FOR_APPROVAL
    [approval] = engine.store.approvals(run_id="order-1")
    code, out = cli("approvals", "approve", approval.approval_id, "--by", "boss", "--comment", "ok")
    assert code == 0, out
    assert Worker(engine, poll=0.01, max_poll=0.05).run_once() == 1
    run = engine.store.get("order-1")
    assert (run.status, run.output, run.error) == (RunStatus.COMPLETED, "shipped", None)
    assert shipped == ["ada"]
    # the decision was stored plain: this keyless store reads it
    assert engine.store.approval(approval.approval_id).comment == "ok"
    engine.store.close()


def test_bad_input_is_one_line_without_traceback(settings: Settings) -> None:
    """A failure (unknown run, bad URL, bad --app) prints one line and exits non-zero, as a real process."""
    env = subprocess_env(settings)
    for args in (
        ["runs", "show", "no-such-run"],
        ["runs", "list", "--database-url", "mysql://nope"],
        ["worker", "--app", "no_such_module:thing", "--idle-exit", "0"],
        ["runs", "list", "--status", "bogus"],
        ["worker", "--app", "json:dumps", "--idle-exit", "0"],
        ["memory", "export", "nobody", "--out", "/nonexistent-folder/x.json"],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "statekeep", *args], env=env, capture_output=True, text=True, cwd=ROOT
        )
        assert out.returncode != 0, args
        assert "Traceback" not in out.stderr + out.stdout
        assert len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)


def test_memory_reembed_moves_memories_to_the_default_model(cli, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """memory reembed re-embeds what another model stored, with a progress bar, and search works after."""
    from statekeep.memory import FakeEmbedder, open_memory_store

    with open_memory_store(settings.memory_url, FakeEmbedder(32, name="old-model")) as old:
        old.remember_many("ada", ["Ada likes long walks", "Ada drinks green tea", "Ada lives in London"])
    code, out = cli("memory", "search", "ada", "what does Ada drink?", "--no-hybrid")
    assert "green tea" not in out  # another model's vectors are never compared
    code, out = cli("memory", "reembed", "--batch-size", "2")
    assert code == 0
    assert "re-embedded 3 memories" in out
    code, out = cli("memory", "search", "ada", "what does Ada drink?", "--k", "1")
    assert "Ada drinks green tea" in out


def test_memory_reembed_sentences_gives_old_memories_their_sentence_vectors(cli, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """--sentences embeds the sentences of short memories stored without them; run again, none is left."""
    from statekeep.memory import open_memory_store

    with open_memory_store(settings.memory_url) as old:
        old.sentence_chars = 0  # as a store before sentence vectors wrote them
        old.remember_many(
            "ada", ["Ada asked for a recipe. By the way, she keeps bees.", "Ada lives in London."]
        )
    code, out = cli("memory", "reembed", "--sentences")
    assert code == 0, out
    assert "re-embedded 0 memories" in out
    assert "embedded the sentences of 1 memories" in out
    code, out = cli("memory", "reembed", "--sentences")
    assert "embedded the sentences of 0 memories" in out
    code, out = cli("memory", "reembed")
    assert "sentences" not in out
