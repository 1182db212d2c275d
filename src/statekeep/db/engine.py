"""Engines and transactions, one :class:`Database` per URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url

from statekeep.db.dialects import DIALECTS, Dialect
from statekeep.errors import ConfigError, StorageError

_DRIVERS = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
}


def normalize_url(url: str | URL, *, setting: str = "STATEKEEP_DATABASE_URL") -> URL:
    """Parse a database URL and pin its driver (psycopg 3 for PostgreSQL).

    Raises:
        ConfigError: the URL is malformed or names an unsupported database.
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except sa.exc.ArgumentError as exc:
        raise ConfigError(setting, str(url), "not a database URL") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in _DRIVERS:
        raise ConfigError(setting, str(url), "supported databases are sqlite and postgresql")
    if backend.startswith("postgres") and driver not in ("psycopg", "psycopg2", ""):
        raise ConfigError(setting, str(url), "PostgreSQL is reached through psycopg 3")
    return parsed.set(drivername=_DRIVERS[backend])


class Database:
    """One SQL database: an engine, its dialect hooks, and transactions.

    Stores that share a URL can share a ``Database``, so that a step's completion
    and the working-state version it produced commit in one transaction.

    Examples:
        >>> db = Database("sqlite:///:memory:")
        >>> with db.begin() as conn:
        ...     _ = conn.execute(sa.text("SELECT 1"))
    """

    def __init__(self, url: str | URL, *, setting: str = "STATEKEEP_DATABASE_URL", **engine_kw: Any):
        self.url = normalize_url(url, setting=setting)
        self.setting = setting
        self.dialect: Dialect = DIALECTS[self.url.get_backend_name()]()
        _ensure_sqlite_folder(self.url, setting)
        kw: dict[str, Any] = {"pool_pre_ping": True}
        if self.dialect.name == "postgresql":
            kw.update(pool_size=5, max_overflow=10)
        kw.update(engine_kw)
        self.engine: Engine = sa.create_engine(self.url, **kw)
        self.dialect.configure(self.engine)
        #: schema translation for stores: ``{"statekeep_working": None}`` on SQLite.
        self._schema_map: dict[str | None, str | None] = {}

    @property
    def name(self) -> str:
        """The dialect name: ``sqlite`` or ``postgresql``."""
        return self.dialect.name

    def register_schema(self, schema: str) -> None:
        """Map a store's logical schema onto this backend (dropped on SQLite)."""
        self._schema_map[schema] = schema if self.dialect.has_schemas else None

    def _options(self, write: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {"schema_translate_map": dict(self._schema_map)}
        opts.update(self.dialect.write_options() if write else self.dialect.read_options())
        return opts

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction: commits on success, rolls back on any exception."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(**self._options(write=True))
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction (a consistent snapshot on both backends)."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(**self._options(write=False))
            with conn.begin():
                yield conn

    def check(self) -> None:
        """Connect once, so that a bad URL or a dead server fails at start-up.

        Raises:
            ConfigError: naming the setting, when the database cannot be reached.
        """
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
            raise ConfigError(self.setting, str(self.url), f"cannot connect: {reason}") from exc

    def dispose(self) -> None:
        """Close every pooled connection (call in a child process after fork)."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"


def _ensure_sqlite_folder(url: URL, setting: str) -> None:
    """Create the folder of a SQLite file, so that a fresh home just works."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    folder = Path(url.database).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(setting, str(url), f"cannot create folder {folder}: {exc.strerror}") from exc


def storage_error(exc: sa.exc.SQLAlchemyError, what: str) -> StorageError:
    """Wrap a driver error in the statekeep tree, keeping its first line."""
    reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
    return StorageError(f"{what}: {reason}")
