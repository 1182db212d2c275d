"""Settings: one URL per store, from arguments or the environment, checked at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from statekeep.config import Settings, parse_memory_url
from statekeep.errors import ConfigError


def test_defaults_live_under_statekeep_home() -> None:
    """With nothing set, SQL stores use a SQLite file and memory a LanceDB folder under .statekeep/."""
    s = Settings.load(env={})
    assert s.database_url == "sqlite:///.statekeep/statekeep.db"
    assert s.memory.backend == "lancedb"
    assert s.memory.location == ".statekeep/memory"
    assert {s.url_for(x) for x in ("context", "working", "workflow")} == {s.database_url}


def test_environment_then_arguments_win() -> None:
    """Environment variables override defaults; arguments override the environment."""
    env = {
        "STATEKEEP_DATABASE_URL": "postgresql://u:p@db/app",
        "STATEKEEP_MEMORY_URL": "lancedb:///data/mem",
        "STATEKEEP_CONTEXT_URL": "sqlite:///ctx.db",
    }
    s = Settings.load(env=env)
    assert s.url_for("workflow") == "postgresql://u:p@db/app"
    assert s.url_for("context") == "sqlite:///ctx.db"
    assert s.memory.location == "/data/mem"
    s = Settings.load(env=env, database_url="sqlite:///arg.db", memory_url="postgresql://u@db/mem")
    assert s.url_for("working") == "sqlite:///arg.db"
    assert s.memory.backend == "pgvector"


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"database_url": "not a url"}, "STATEKEEP_DATABASE_URL"),
        ({"database_url": "mysql://x/y"}, "STATEKEEP_DATABASE_URL"),
        ({"database_url": "postgresql+asyncpg://x/y"}, "STATEKEEP_DATABASE_URL"),
        ({"memory_url": "redis://x"}, "STATEKEEP_MEMORY_URL"),
        ({"memory_url": "lancedb://"}, "STATEKEEP_MEMORY_URL"),
        ({"context_url": "::"}, "STATEKEEP_CONTEXT_URL"),
    ],
)
def test_malformed_url_names_the_setting(kwargs: dict[str, str], setting: str) -> None:
    """A malformed URL fails at load with an error that names the setting."""
    with pytest.raises(ConfigError) as err:
        Settings.load(env={}, **kwargs)
    assert err.value.setting == setting
    assert setting in str(err.value)


def test_unreachable_server_fails_at_check_naming_setting() -> None:
    """A PostgreSQL that is not there fails check() with the setting's name, password hidden."""
    s = Settings.load(env={}, database_url="postgresql://me:secret@127.0.0.1:1/nowhere")
    with pytest.raises(ConfigError) as err:
        s.check()
    assert err.value.setting == "STATEKEEP_DATABASE_URL"
    assert "cannot connect" in str(err.value)
    assert "secret" not in str(err.value)


def test_unreachable_memory_server_names_memory_setting(tmp_path: Path) -> None:
    """The memory URL is checked too, under its own name."""
    s = Settings.load(env={}, home=tmp_path, memory_url="postgresql://me@127.0.0.1:1/nowhere")
    with pytest.raises(ConfigError) as err:
        s.check()
    assert err.value.setting == "STATEKEEP_MEMORY_URL"


def test_check_creates_embedded_folders(tmp_path: Path) -> None:
    """On the embedded default, check() creates the folders and succeeds."""
    s = Settings.load(env={}, home=tmp_path / "h")
    s.check()
    assert (tmp_path / "h" / "memory").is_dir()


def test_reachable_postgres_passes_check(postgres_url: str) -> None:
    """A live PostgreSQL passes the start-up check."""
    Settings.load(env={}, database_url=postgres_url).check()


def test_memory_url_forms() -> None:
    """A bare path and lancedb:// both mean LanceDB; postgres:// is an alias."""
    assert parse_memory_url("some/dir").backend == "lancedb"
    assert parse_memory_url("postgres://u@h/d").backend == "pgvector"
