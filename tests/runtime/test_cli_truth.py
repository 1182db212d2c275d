"""A command line that tells the truth, as a new user found it did not (issue 16).

Listings are newest first, paged, with the total; ids are printed whole; ``--json``
on every listing; commands that only read never create a database or a folder;
unknown ids fail; ``context show`` is the runtime's next call; ``--app`` modules
are found from the current folder; ``--version``; every option has help; memory
reads work while a worker holds the LanceDB folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer

from statekeep.cli import app
from statekeep.config import Settings
from statekeep.context import Message, to_openai
from statekeep.models import ScriptedModel
from statekeep.runtime import Runtime
from statekeep.workflow import Engine, Registry, RunContext
from tests.runtime import agent_app
from tests.runtime.conftest import ROOT, subprocess_env, terminal_width
from tests.runtime.test_cli import cli

__all__ = ["cli"]

#: The fixture: run ``statekeep ARGS`` in this process; (exit code, output).
Cli = Callable[..., tuple[int, str]]


def test_version(cli: Cli) -> None:
    from statekeep import __version__

    assert cli("--version") == (0, f"statekeep {__version__}\n")


def test_every_option_and_argument_has_help() -> None:
    """Every parameter of every command says what it is for in --help."""
    missing, seen = [], []

    def walk(command: Any, path: str) -> None:
        seen.append(path)
        for param in command.params:
            if not getattr(param, "help", None):
                missing.append(f"{path} {param.name}")
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "statekeep")
    assert "statekeep runs list" in seen
    assert "statekeep memory search" in seen
    assert missing == []


def many_runs(settings: Settings, n: int) -> Engine:
    registry = Registry()

    @registry.workflow("count", version=1)
    def count(ctx: RunContext, i: int) -> int:
        return i

    engine = Engine(settings.url_for("workflow"), registry)
    for i in range(n):
        engine.start(count, f"run-{i:03d}", i)
    return engine


def test_runs_list_is_newest_first_paged_and_says_how_many(cli: Cli, settings: Settings) -> None:
    """With 105 runs the newest is on the first page, and the listing says there are more."""
    many_runs(settings, 105).store.close()
    code, out = cli("runs", "list", "--limit", "10")
    assert code == 0
    assert out.index("run-104") < out.index("run-095")
    assert "run-094" not in out
    assert "runs 1-10 of 105, newest first; next page: --offset 10" in out
    code, out = cli("runs", "list", "--limit", "10", "--offset", "100")
    assert "run-000" in out
    assert "runs 101-105 of 105" in out
    assert "next page" not in out
    code, out = cli("runs", "list", "--json", "--limit", "2", "--search", "run-10")
    doc = json.loads(out)
    assert (doc["total"], [r["run_id"] for r in doc["runs"]]) == (5, ["run-104", "run-103"])
    assert doc["counts"] == {"pending": 5}


def test_listings_print_json_and_whole_ids(
    cli: Cli, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Approval and run ids are what the other commands take: never cut, even in 80 columns."""
    registry = Registry()

    @registry.tool("refund")
    def refund(key: str, amount: int) -> int:
        return amount

    @registry.workflow("refund", version=1)
    def flow(ctx: RunContext, amount: int) -> Any:
        return ctx.call_tool(refund.requiring_approval("refunds need a person"), amount)

    engine = Engine(settings.url_for("workflow"), registry)
    run_id = "refund-for-customer-4471-order-2025-11-30-0001"
    engine.run(flow, run_id, 120)
    (ask,) = engine.store.approvals()
    terminal_width(monkeypatch, 80)
    code, out = cli("approvals", "list")
    assert code == 0
    assert ask.approval_id in out
    assert run_id in out
    code, out = cli("runs", "list")
    assert run_id in out
    assert "waiting_for_approval" in out  # the status whole, at 80 columns too
    code, out = cli("runs", "events", run_id)
    assert code == 0
    assert ask.approval_id in "".join(line.strip(" │|") for line in out.splitlines())  # folded, not cut
    code, out = cli("approvals", "list", "--json")
    assert json.loads(out)[0]["approval_id"] == ask.approval_id
    for args in (("runs", "show", run_id), ("runs", "events", run_id)):
        code, out = cli(*args, "--json")
        assert code == 0
        assert json.loads(out)
    code, out = cli("runs", "events", run_id, "--json")
    assert [e["kind"] for e in json.loads(out)] == ["approval", "wait"]
    engine.store.close()


READ_ONLY = [
    ["runs", "list"],
    ["runs", "show", "r"],
    ["runs", "events", "r"],
    ["approvals", "list"],
    ["context", "show", "s"],
]
MEMORY_READS = [
    ["memory", "search", "ada", "tea"],
    ["memory", "list", "ada"],
    ["memory", "export", "ada"],
]


def test_read_only_commands_never_create_a_database_or_a_folder(tmp_path: Path) -> None:
    """A missing database or memory folder is an error naming its setting; nothing appears on disk."""
    gone = tmp_path / "nonexistent" / "dir"
    env = {
        **subprocess_env(Settings.load(home=tmp_path / "home", env={})),
        "STATEKEEP_DATABASE_URL": f"sqlite:///{gone / 'x.db'}",
        "STATEKEEP_MEMORY_URL": str(gone / "memory"),
    }
    for args in READ_ONLY + MEMORY_READS:
        out = subprocess.run(
            [sys.executable, "-m", "statekeep", *args], env=env, capture_output=True, text=True, cwd=tmp_path
        )
        assert out.returncode == 1, (args, out.stdout)
        setting = "STATEKEEP_MEMORY_URL" if args[0] == "memory" else "STATEKEEP_DATABASE_URL"
        assert out.stderr.startswith(f"error: {setting}="), (args, out.stderr)
        assert "nothing was created" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no home, no nonexistent/, no database


def test_an_existing_file_without_the_stores_is_not_changed(tmp_path: Path) -> None:
    """A SQLite file that holds no statekeep tables is named, not migrated."""
    import sqlite3

    db = tmp_path / "other.db"
    sqlite3.connect(db).close()
    env = {
        **subprocess_env(Settings.load(home=tmp_path, env={})),
        "STATEKEEP_DATABASE_URL": f"sqlite:///{db}",
    }
    out = subprocess.run(
        [sys.executable, "-m", "statekeep", "runs", "list"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 1
    assert "holds no workflow store yet: run `statekeep db upgrade` (nothing was changed)" in out.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


def test_unknown_ids_exit_non_zero(cli: Cli, runtime: Runtime) -> None:
    runtime.run(agent_app.AGENT, "known", owner=agent_app.OWNER, task="Plan a trip")
    for args in (
        ("runs", "show", "nope"),
        ("runs", "events", "nope"),
        ("runs", "cancel", "nope"),
        ("approvals", "list", "--run", "nope"),
        ("approvals", "approve", "nope", "--by", "boss@example.com"),
        ("approvals", "reject", "nope", "--by", "boss@example.com"),
        ("context", "show", "nope"),
    ):
        code, out = cli(*args)
        assert code == 1, (args, out)
        assert out.startswith("error:"), (args, out)
        assert "nope" in out


def test_context_show_is_exactly_the_runtimes_next_call(cli: Cli, settings: Settings) -> None:
    """Pinned task state and memories included; the model then receives the same messages.

    The worker's runtime keeps the LanceDB folder open for writing meanwhile: the read works beside it.
    """
    rt = agent_app.build_runtime(settings)
    try:
        rt.remember("Ada likes window seats", owner=agent_app.OWNER)
        rt.run(agent_app.AGENT, "trip", owner=agent_app.OWNER, task="Plan a trip", turns=1)
        code, out = cli("context", "show", "trip", "--embedder", "statekeep.memory:FakeEmbedder", "--json")
        assert code == 0, out
        shown = json.loads(out)
        assert shown["settings_from"] == "the run's last recorded model call"
        sections = {s["name"]: s for s in shown["sections"]}
        assert '"task": "Plan a trip"' in sections["pinned"]["messages"][0]["content"]
        assert "Ada likes window seats" in sections["memories"]["messages"][0]["content"]
        code, text = cli("context", "show", "trip", "--embedder", "statekeep.memory:FakeEmbedder")
        assert "Current task state (pinned)" in text
        assert "owner: owner-1" in text
        model = rt.model
        assert isinstance(model, ScriptedModel)
        before = len(model.calls)
        rt.resume("trip")  # on to the approval gate: the first call it makes is the one shown
        sent = model.calls[before]  # the next call the model received
        messages = [Message.from_json(m) for s in shown["sections"] for m in s["messages"]]
        assert to_openai(messages) == sent
    finally:
        rt.close()
    code, out = cli("context", "show", "trip", "--agent", "tests.runtime.agent_app:AGENT", "--json")
    assert json.loads(out)["settings_from"] == "agent 'trip'"


def test_memory_reads_work_while_a_worker_holds_the_folder(cli: Cli, settings: Settings) -> None:
    if settings.memory.backend != "lancedb":
        pytest.skip("pgvector has no folder lock")
    rt = agent_app.build_runtime(settings)
    try:
        rt.remember("Ada takes her coffee black", owner="ada")  # the runtime now holds the writer lock
        for args in (
            ["memory", "search", "ada", "coffee"],
            ["memory", "list", "ada"],
            ["memory", "export", "ada"],
        ):
            code, out = (
                cli(*args, "--embedder", "statekeep.memory:FakeEmbedder")
                if args[1] == "search"
                else cli(*args)
            )
            assert code == 0, (args, out)
            assert "Ada takes her coffee black" in out, args
        code, out = cli("memory", "add", "ada", "another", "--embedder", "statekeep.memory:FakeEmbedder")
        assert code == 1
        assert "already open by another writer" in out
    finally:
        rt.close()


def test_app_modules_are_found_from_the_current_folder(settings: Settings, tmp_path: Path) -> None:
    """`--app myapp:build_runtime` works without PYTHONPATH=."""
    app_dir = tmp_path / "project"
    app_dir.mkdir()
    (app_dir / "myapp.py").write_text("from tests.runtime.agent_app import build_runtime\n")
    env = {**subprocess_env(settings), "PYTHONPATH": str(ROOT / "src") + ":" + str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "statekeep", "worker", "--app", "myapp:build_runtime", "--idle-exit", "0"],
        env=env,
        cwd=app_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "worker handled 0 runs" in out.stdout


def test_worker_log_options_are_checked(cli: Cli) -> None:
    code, out = cli("worker", "--app", "tests.runtime.agent_app:build_runtime", "--log-format", "xml")
    assert code == 1
    assert out.startswith("error: --log-format:")


def test_the_demo_says_where_it_writes_and_how_to_list_its_runs(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    from statekeep import demo

    monkeypatch.setattr(demo, "run", lambda settings, console: None)
    code, out = cli("demo", "--home", str(settings.home))
    assert code == 0
    where = f"{settings.home}/demo"
    assert f"writes its stores under {where}/" in out
    if settings.database_url.startswith("sqlite"):
        assert f"statekeep runs list --home {where}" in out
    else:
        assert "statekeep runs list --database-url" in out


def test_an_ambiguous_call_is_settled_from_the_cli_with_its_result(cli: Cli, settings: Settings) -> None:
    """`approvals reject --result JSON` says the call happened and what it returned; the run completes
    with that output and the call never runs again. Bad JSON is refused and decides nothing."""
    from statekeep.testing._workflow_kit import Crash, mail_registry

    effects: list[str] = []
    engine = Engine(settings.url_for("workflow"), mail_registry(effects, crash=True))
    with pytest.raises(Crash):
        engine.run(engine.registry.get("mail", 1), "amb-1", "ed@example.com")
    engine = Engine(engine.store, mail_registry(effects))
    assert engine.resume("amb-1").status == "needs_decision"
    (ask,) = engine.store.approvals(kind="ambiguous")
    code, out = cli("approvals", "reject", ask.approval_id, "--by", "ops", "--result", "{not json")
    assert code != 0
    assert "--result" in out
    assert engine.store.approval(ask.approval_id).status == "pending"
    code, out = cli("approvals", "reject", ask.approval_id, "--by", "ops", "--result", '{"sent": "manual"}')
    assert code == 0, out
    run = engine.resume("amb-1")
    assert (run.status, run.output) == ("completed", {"sent": "manual"})
    assert effects == ["amb-1/2/0 ed@example.com"]  # once, before the crash
    engine.store.close()
