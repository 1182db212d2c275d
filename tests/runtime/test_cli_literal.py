"""What a manager reads is what will run: the CLI prints every stored string literally.

``statekeep approvals list`` rendered stored arguments as rich markup: the
argument ``acct-[conceal]EVIL-999[/conceal]ok`` was shown as ``acct-EVIL-999ok``
(and hid its middle in a real terminal), and ``[/]`` in an argument or a memory
crashed the listing. ANSI escape sequences reached the terminal as they were.
Now no stored string is read as markup, and control characters (ESC, CR, other
C0 and C1 codes, bidi overrides) are shown as escapes. Each test runs on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from statekeep.cli import visible
from statekeep.config import Settings
from statekeep.context import SQLContextStore
from statekeep.workflow import Engine, Registry, RunContext
from tests.runtime.test_cli import cli

__all__ = ["cli"]

MARKUP = "acct-[conceal]EVIL-999[/conceal]ok"
CLOSE = "x[/]y"
ANSI = "pay \x1b[8mhidden\x1b[0m now"
BIDI = "invoice \u202egnp.exe"
CR = "safe\roverwrite"
HOSTILE = [MARKUP, CLOSE, ANSI, BIDI, CR]
RAW = ["\x1b", "\u202e", "\r"]  # never written to the terminal as they are


def assert_literal(out: str, *texts: str) -> None:
    """Each text appears as :func:`visible` shows it; no raw control character reaches the output."""
    for text in texts:
        assert visible(text) in out, (visible(text), out)
    for raw in RAW:
        assert raw not in out, (raw, out)


def test_visible_escapes_what_a_terminal_would_act_on_and_nothing_else() -> None:
    assert visible(MARKUP) == MARKUP
    assert visible(ANSI) == "pay \\x1b[8mhidden\\x1b[0m now"
    assert visible(BIDI) == "invoice \\u202egnp.exe"
    assert visible(CR) == "safe\\roverwrite"
    assert visible("a\x00b\x07c\x7fd\x85e\u200bf\ufeff\ud800") == (
        "a\\x00b\\x07c\\x7fd\\x85e\\u200bf\\ufeff\\ud800"
    )
    assert (
        visible("two\nlines\tand tabs, café, 日本, \U0001f600")
        == "two\nlines\tand tabs, café, 日本, \U0001f600"
    )
    assert visible('{"a": "\u202e"}', json_text=True) == '{"a": "\\u202e"}'


@pytest.fixture
def gated(settings: Settings) -> Engine:
    """One approval per hostile argument, waiting; the gate's reason holds markup too."""
    registry = Registry()

    @registry.tool("transfer")
    def transfer(key: str, account: str) -> str:
        raise AssertionError("not approved")

    @registry.workflow("transfer", version=1)
    def flow(ctx: RunContext, account: str) -> Any:
        return ctx.call_tool(transfer.requiring_approval("check [bold]twice[/bold] [/]"), account)

    engine = Engine(settings.url_for("workflow"), registry)
    for i, account in enumerate(HOSTILE):
        engine.run(flow, f"t{i}", account)
    return engine


def test_approvals_list_shows_stored_arguments_literally(cli, gated: Engine) -> None:  # type: ignore[no-untyped-def]
    """Markup, [/], ANSI, bidi and CR in arguments: the listing works and shows each as stored."""
    code, out = cli("approvals", "list")
    assert code == 0, out
    assert "acct-EVIL-999ok" not in out
    assert_literal(out, MARKUP, CLOSE, "check [bold]twice[/bold] [/]")
    assert "\\u001b[8mhidden" in out  # arguments are shown as JSON, which escapes ESC its own way
    assert "\\u202egnp.exe" in out
    (ask,) = gated.store.approvals(run_id="t0")
    code, out = cli("approvals", "approve", ask.approval_id, "--by", "boss [/] \x1b[8m")
    assert code == 0, out
    assert_literal(out, "boss [/] \x1b[8m")
    gated.store.close()


def test_runs_show_list_and_events_print_names_and_errors_literally(cli, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """A step named with markup, an error holding ANSI and [/]: shown as they are, nothing crashes."""
    registry = Registry()

    @registry.workflow("flow-[b]x[/b]", version=1)
    def flow(ctx: RunContext, note: str) -> Any:
        ctx.step("step [/]", lambda: note)
        raise ValueError(f"boom {CLOSE} {ANSI} {BIDI} {CR}")

    engine = Engine(settings.url_for("workflow"), registry)
    engine.run(flow, "run-[red]1[/red]", MARKUP)
    for args in (
        ("runs", "list"),
        ("runs", "show", "run-[red]1[/red]"),
        ("runs", "events", "run-[red]1[/red]"),
    ):
        code, out = cli(*args)
        assert code == 0, (args, out)
        assert_literal(out, "run-[red]1[/red]")
    code, out = cli("runs", "show", "run-[red]1[/red]")
    assert_literal(out, "flow-[b]x[/b]", f"ValueError: boom {CLOSE} {ANSI} {BIDI} {CR}", MARKUP)
    code, out = cli("runs", "events", "run-[red]1[/red]")
    assert_literal(out, "step [/]")
    engine.store.close()


def test_memories_are_shown_literally_in_search_and_export(cli) -> None:  # type: ignore[no-untyped-def]
    """A memory holding markup, [/] and ANSI: search lists it literally; export is JSON with escapes."""
    content = f"Ada drinks tea {MARKUP} {CLOSE} {ANSI} {BIDI}"
    code, out = cli("memory", "add", "ada [/]", content)
    assert code == 0, out
    assert "for ada [/]" in out
    code, out = cli("memory", "search", "ada [/]", "what does Ada drink?")
    assert code == 0, out
    assert_literal(out, content)
    code, out = cli("memory", "export", "ada [/]")
    assert code == 0, out
    assert_literal(out)
    assert json.loads(out)["memories"][0]["content"] == content  # the escapes are JSON's own


def test_context_show_prints_messages_and_tool_calls_literally(cli, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    """Message content and tool-call names and arguments from the event log: never markup."""
    store = SQLContextStore(settings.url_for("context"))
    store.append("s-[/]", {"role": "user", "content": f"hello {MARKUP} {CLOSE} {ANSI} {CR}"})
    call = {"id": "c-[/]", "name": "lookup", "arguments": {"q": f"{BIDI} [/]"}}
    store.append("s-[/]", {"role": "assistant", "content": "", "tool_calls": [call]})
    store.append("s-[/]", {"role": "tool", "content": f"found {ANSI}", "tool_call_id": "c-[/]"})
    store.db.dispose()
    code, out = cli("context", "show", "s-[/]", "--budget", "4000")
    assert code == 0, out
    assert_literal(out, f"hello {MARKUP} {CLOSE} {ANSI} {CR}", "[c-[/]]", "s-[/]", f"found {ANSI}")
    assert "lookup(" in out


def test_error_messages_are_printed_literally(cli) -> None:  # type: ignore[no-untyped-def]
    """An error quoting what the user gave (here a URL with markup and ANSI) is one literal line."""
    code, out = cli("runs", "list", "--database-url", "bogus://[/]x\x1b[8my")
    assert code == 1
    assert len(out.strip().splitlines()) == 1, out
    assert_literal(out, "[/]x\x1b[8my")
