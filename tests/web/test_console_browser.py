"""The console in a real browser: a person logs in, finds a waiting run, approves its call, sees a
worker finish it, and searches and erases an owner's memory; hostile arguments are shown literally.

Headless Chromium from Debian's ``chromium`` package, driven by Playwright (``executable_path``;
never ``playwright install``). Each page is screenshotted (see :mod:`tests.web.browser`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekeep.memory import FakeEmbedder
from statekeep.web import Stores, create_app
from statekeep.workflow import Engine, Registry, RunContext, RunStatus, SQLWorkflowStore
from tests.runtime import agent_app
from tests.runtime.conftest import subprocess_env
from tests.web.browser import ROOT, Server, browser, embedded_settings, shots

__all__ = ["browser", "shots"]

ALICE = "alice-token-0123456789"
TOKENS: dict[str, Any] = {
    "alice@example.com": ALICE,
    "bob@example.com": {"token": "bob-token-0123456789ab", "gates": ["send"]},
}
OWNER = agent_app.OWNER


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Server, Any]]:
    """Runs of the trip agent (one waiting for a person) and their memories, and the console over them."""
    monkeypatch.setenv("STATEKEEP_TEST_EFFECTS", str(tmp_path / "effects.jsonl"))
    settings = embedded_settings(tmp_path)
    runtime = agent_app.build_runtime(settings)
    runtime.run(agent_app.AGENT, "trip-1", owner=OWNER, task="Plan a trip from Oslo to Rome")
    for i in range(3):
        runtime.start(agent_app.AGENT, f"trip-later-{i}", owner=f"owner-{i + 2}", task=f"Plan trip {i}")
    runtime.close()  # the LanceDB folder has one writer: the worker's turn comes later
    stores = Stores.open(settings, embedder=FakeEmbedder())
    app = create_app(stores.workflow, tokens=TOKENS, stores=stores)
    with Server(app) as server:
        yield server, settings
    stores.close()


def test_a_person_approves_a_waiting_run_and_erases_a_memory(
    browser: Any, deployment: tuple[Server, Any], shots: Path, tmp_path: Path
) -> None:
    server, settings = deployment
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("dialog", lambda d: pytest.fail(f"a dialog opened: {d.message}"))

    # log in: every page sends a stranger to the login, which keeps a cookie, not the token
    page.goto(server.url + "/runs?status=waiting_for_approval")
    assert "/login" in page.url
    page.screenshot(path=str(shots / "console-login.png"))
    page.fill("#token", "not-the-token-000000")
    page.click("button[type=submit]")
    assert "not a valid token" in page.inner_text("main")
    page.fill("#token", ALICE)
    page.click("button[type=submit]")
    assert page.url.endswith("/runs?status=waiting_for_approval")
    cookie = next(c for c in page.context.cookies() if c["name"] == "statekeep_session")
    assert (cookie["httpOnly"], cookie["secure"], cookie["sameSite"]) == (True, True, "Strict")
    assert ALICE not in cookie["value"]

    # find the waiting run: newest first, counted per status, filtered
    page.click("text=all")
    assert "Runs 1–4 of 4, newest first" in page.inner_text("main")
    page.screenshot(path=str(shots / "console-runs.png"), full_page=True)
    page.click("nav.counts >> text=waiting for approval")
    rows = page.locator("table.list tbody tr")
    assert rows.count() == 1
    page.click("text=trip-1")

    # the run: its timeline, the context of each model call, its state versions
    assert page.inner_text("#run-status") == "waiting for approval"
    main = page.inner_text("main")
    for seen in ("lookup", "trip-1/", "Current task state (pinned)", "memories", "window", "Diff"):
        assert seen in main, seen
    page.screenshot(path=str(shots / "console-run.png"), full_page=True)

    # the approval: exact arguments, who may decide, a decision with a comment
    page.click("text=Decide send")
    assert json.loads(page.inner_text("#args")) == {
        "args": [],
        "kwargs": {"to": "ada@example.com", "body": "Pack for sun."},
    }
    assert "alice@example.com, bob@example.com" in page.inner_text("main")
    page.screenshot(path=str(shots / "console-approval.png"), full_page=True)
    page.goto(server.url + "/approvals")
    page.screenshot(path=str(shots / "console-approvals.png"), full_page=True)
    page.click("article.approval >> a.button")
    page.fill("#comment", "sun it is")
    page.click("button[value=approve]")
    assert "Recorded: approved by alice@example.com" in page.inner_text("main")

    # a worker (a separate process) continues the run; the page shows it finished
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "statekeep",
            "worker",
            "--app",
            "tests.runtime.agent_app:build_runtime",
            "--idle-exit",
            "0.5",
            "--log-format",
            "json",
        ],
        env={**subprocess_env(settings), "STATEKEEP_TEST_EFFECTS": str(tmp_path / "effects.jsonl")},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    logged = [json.loads(line) for line in worker.stderr.splitlines()]
    trip = [(e["message"], e.get("step")) for e in logged if e.get("run_id") == "trip-1"]
    assert trip[0] == ("run claimed", None)
    assert ("step completed", "send") in trip
    assert trip[-1] == ("run completed", None)

    page.goto(server.url + "/runs/trip-1")
    assert page.inner_text("#run-status") == "completed"
    assert "approved by alice@example.com (sun it is)" in page.inner_text("main")

    # memory: what the agent remembered, with provenance; search, export, erase behind a confirmation
    page.click("header >> text=Memory")
    page.fill("input[name=owner]", OWNER)
    page.fill("input[name=q]", "trip to Rome")
    page.click("main button[type=submit]")
    table = page.inner_text("table.memories")
    assert "The user plans a trip from Oslo to Rome." in table
    assert "agent inferred" in table
    assert "trip-1" in table
    page.screenshot(path=str(shots / "console-memory.png"), full_page=True)
    with page.expect_download() as download:
        page.click("text=Export as JSON")
    exported = json.loads(Path(download.value.path()).read_text())
    assert (exported["owner"], exported["count"]) == (OWNER, 1)
    page.click("text=Erase all…")
    page.screenshot(path=str(shots / "console-erase.png"), full_page=True)
    page.fill("#confirm", "someone-else")
    page.click("button.bad")
    assert "must repeat the owner" in page.inner_text("main")
    page.go_back()
    page.fill("#confirm", OWNER)
    page.click("button.bad")
    assert f"1 memory of {OWNER} erased" in page.inner_text("#receipt-summary")
    page.goto(f"{server.url}/memory?owner={OWNER}&q=trip")
    assert "Nothing found" in page.inner_text("main")

    page.goto(server.url + "/docs")
    assert "/api/runs" in page.inner_text("main")
    page.screenshot(path=str(shots / "console-api.png"), full_page=True)
    page.close()


HOSTILE = {
    "note": "<script>alert('xss')</script>",
    "html": "<b>bold</b> <img src=x onerror=alert(2)> &amp; </pre><i>",
    "ansi": "\x1b[31mred\x1b[0m \x1b]8;;http://evil/\x07link\x1b]8;;\x07",
    "bidi": "invoice \u202egnp.exe",
}


def test_arguments_with_markup_scripts_and_escapes_are_shown_literally(
    browser: Any, tmp_path: Path, shots: Path
) -> None:
    registry = Registry()

    @registry.tool("pay")
    def pay(key: str, /, **kwargs: Any) -> str:
        return "paid"

    @registry.workflow("payout", version=1)
    def payout(ctx: RunContext) -> Any:
        return ctx.call_tool(pay.requiring_approval("<i>payments</i> need a person"), **HOSTILE)

    url = f"sqlite:///{tmp_path / 'statekeep.db'}"
    engine = Engine(url, registry)
    run_id = "run-<b>1</b>"
    assert engine.run(payout, run_id).status is RunStatus.WAITING_FOR_APPROVAL
    store = SQLWorkflowStore(url)
    with Server(create_app(store, tokens=TOKENS)) as server:
        page = browser.new_page()
        dialogs: list[str] = []

        def dialog(d: Any) -> None:
            dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", dialog)
        page.goto(server.url + "/login")
        page.fill("#token", ALICE)
        page.click("button[type=submit]")
        for path in ("/approvals", f"/runs/{run_id}"):
            page.goto(server.url + path)
            main = page.locator("main")
            assert main.locator("script, img, b, i").count() == 0, path
            text = main.inner_text()
            assert "<script>alert('xss')</script>" in text
            assert "<b>bold</b> <img src=x onerror=alert(2)> &amp; </pre><i>" in text
            assert "\\u001b[31mred\\u001b[0m" in text  # ESC shown as an escape, never sent as one
            assert "\\u202egnp.exe" in text
            assert "\x1b" not in text
            assert "\u202e" not in text
        page.goto(server.url + "/approvals")
        assert "<i>payments</i> need a person" in page.inner_text("main")
        assert "run-<b>1</b>" in page.inner_text("main")
        page.screenshot(path=str(shots / "console-literal.png"), full_page=True)
        csp = page.goto(server.url + "/approvals").headers["content-security-policy"]
        assert "default-src 'none'" in csp
        assert dialogs == []
        page.close()
    store.close()
    engine.store.close()
