"""Runtime fixtures: settings on each backend, and the environment a subprocess needs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from statekeep.config import Settings
from statekeep.runtime import Runtime
from tests.runtime import agent_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings on one backend: SQLite + LanceDB, or PostgreSQL + pgvector (same database)."""
    url = request.getfixturevalue(f"{request.param}_url")
    memory = str(tmp_path / "memory") if request.param == "sqlite" else url
    monkeypatch.setenv("STATEKEEP_TEST_EFFECTS", str(tmp_path / "effects.jsonl"))
    return Settings.load(home=tmp_path / "home", database_url=url, memory_url=memory, env={})


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    rt = agent_app.build_runtime(settings)
    yield rt
    rt.close()


def apart(settings: Settings) -> tuple[Settings, dict[str, str]]:
    """The settings with the context store on a database of its own (another URL), and its env.

    On PostgreSQL the other URL names the same database (with another application name):
    the stores do not share a connection, so a step's event commits before its completion.
    """
    url = settings.database_url
    if url.startswith("sqlite"):
        context = f"sqlite:///{settings.home / 'context.db'}"
    else:
        context = url + ("&" if "?" in url else "?") + "application_name=statekeep_context"
    moved = Settings.load(
        home=settings.home, database_url=url, memory_url=settings.memory_url, context_url=context, env={}
    )
    return moved, {"STATEKEEP_CONTEXT_URL": context}


def terminal_width(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """Run the CLI in this process at ``columns`` wide, whatever test imported it first.

    rich reads ``COLUMNS`` once, when a console is made: the CLI's consoles are made at
    import, so setting the variable alone gives the width of whoever imported the CLI first.
    """
    from statekeep.cli import _common

    monkeypatch.setenv("COLUMNS", str(columns))
    for console in (_common.console, _common.err_console):
        monkeypatch.setattr(console, "_width", columns)


def subprocess_env(settings: Settings) -> dict[str, str]:
    """The environment of a child process that opens the same stores."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "STATEKEEP_HOME": str(settings.home),
        "STATEKEEP_DATABASE_URL": settings.database_url,
        "STATEKEEP_MEMORY_URL": settings.memory_url,
    }


def effects() -> list[dict[str, str]]:
    """Side effects performed so far, as counted outside the databases."""
    import json

    path = agent_app.effects_file()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
